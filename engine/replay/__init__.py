"""Replaying the log for audits: histories in batches, ``verify`` (do the projections and
reservations equal the fold?), ``rebuild`` (rewrite the projections from the log), the
per-job ``audit`` and fleet ``stats``, their rendering, and ``status``.

Internal: the commands (``callwarden audit``, ``verify``, ...) are the public face
(docs/api.md)."""
