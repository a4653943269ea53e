"""``python -m callwarden.cli``: the ``callwarden`` command."""

import sys

from callwarden.cli.main import main

sys.exit(main())
