"""The reference queue on the ``jobs`` table (at-least-once delivery with leases) and the
reference worker that runs its jobs' calls (``callwarden worker``)."""
