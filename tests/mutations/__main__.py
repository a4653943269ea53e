"""``python -m tests.mutations``: run the mutation check."""

from __future__ import annotations

import sys

from tests.mutations.run import main

sys.exit(main(sys.argv[1:]))
