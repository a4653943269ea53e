"""The reference queue on the ``jobs`` table (at-least-once delivery with leases) and the
reference worker that runs its jobs' calls (``callwarden worker``).

Internal, except the integrations :mod:`callwarden.queue.celery` and
:mod:`callwarden.queue.arq` (docs/api.md)."""
