"""The mutation check (issue 14 item 5): deliberate bugs the default test run must catch.

``python -m tests.mutations`` (see :mod:`tests.mutations.run`)."""
