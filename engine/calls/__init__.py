"""What a worker runs: a job's external call, durably (the worker API).

``runner`` (``CallRunner``: start, create or resume, poll, record), ``finalize`` (claim,
store the media, complete — shared by workers, the reconciler and webhooks), ``inline``
(results inside an answer stored before it is recorded), ``config`` (``CallConfig``),
``pricing`` (what a completed call is charged), ``identity`` (owner ids per process
incarnation) and ``failpoints`` (named crash points for the crash tests).

Internal: a host imports these names from ``callwarden`` (docs/api.md)."""
