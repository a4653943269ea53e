"""``python -m callwarden.providers.simulator --port N``: serve the provider simulator."""

import sys

from callwarden.providers.simulator.core import main

if __name__ == "__main__":
    sys.exit(main())
