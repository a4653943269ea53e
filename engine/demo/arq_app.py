"""The arq settings of ``callwarden demo --queue arq`` (``arq
callwarden.demo.arq_app.WorkerSettings``): what :func:`callwarden.queue.arq.worker_settings` sets up
for any host, on the demo's Redis (``CALLWARDEN_REDIS_URL``), queue
(``CALLWARDEN_DEMO_QUEUE``) and demo-scale ``job_timeout`` (``CALLWARDEN_DEMO_REDELIVER_S``:
a dead worker's job is taken again 10 s after it); the calls' settings come from the
environment :mod:`callwarden.demo.queues` gives each worker."""

from __future__ import annotations

import os

from callwarden.queue.arq import worker_settings

WorkerSettings = worker_settings(
    job_timeout=float(os.environ["CALLWARDEN_DEMO_REDELIVER_S"]),
    max_jobs=int(os.environ.get("CALLWARDEN_DEMO_CONCURRENCY", "6")),
    max_deliveries=6, grace_s=2, poll_delay=0.2,
    queue_name=os.environ["CALLWARDEN_DEMO_QUEUE"])
