"""``callwarden demo``: the main job on real parts — workers killed at random, provider
faults, the reconciler recovering, the verdict computed with SQL. ``run`` (the whole
demo), ``fleet`` (worker processes), ``queues`` (``--queue celery|arq``: their fleets,
with ``celery_app``, ``arq_app`` and ``redis_server``), ``workload`` (what it asks for:
pure), ``summary`` (the verdict), ``report`` (the offline HTML page).

Internal (docs/api.md)."""
