"""``callwarden``: one module per command (``worker``, ``reconcile``, ``serve``, ``audit``,
``demo``) registered by ``main``, which also holds ``migrate``, ``status`` and
``simulator``. Run it as ``callwarden`` or ``python -m callwarden.cli``.

Internal: the command line is the public face, not these modules (docs/api.md)."""
