"""The reconciler: find stuck calls and advance them (recover, sweep, or give up).

``config`` (thresholds and caps: defaults < file < environment, validated), ``stale``
(the one staleness rule, mirrored in SQL by ``callwarden_is_stale``: pure), ``decide``
(what to do with one claimed call: pure), ``loop`` (the claim, the actions, the passes).

Internal: a host imports ``Reconciler`` from ``callwarden`` (docs/api.md)."""
