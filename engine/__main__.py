"""``python -m callwarden``: the ``callwarden`` command (as ``python -m callwarden.cli``)."""

import sys

from callwarden.cli.main import main

sys.exit(main())
