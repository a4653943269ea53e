"""Replicate (``replicate-prediction``, ``replicate-training``): ``wire`` (pure request
builders and answer parsers), ``webhook`` (the Svix signature and delivery bodies: pure),
``client`` (the clients: the only I/O)."""
