"""``python -m engine.cli``: the ``callwarden`` command."""

import sys

from engine.cli.main import main

sys.exit(main())
