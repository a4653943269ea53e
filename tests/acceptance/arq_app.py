"""The arq settings whose real workers ``test_queue_integrations.py`` starts
(``arq tests.acceptance.arq_app.WorkerSettings``). Redis comes from
``CALLWARDEN_REDIS_URL``; a short ``job_timeout`` (so a dead worker's job is taken again
10 s after it), one job per worker and the tries before a job is given up
(``CALLWARDEN_TEST_MAX_DELIVERIES``, default 5) come from the test's environment."""

from __future__ import annotations

import os

from callwarden.queue.arq import own_call_function, worker_settings
from tests.acceptance import own_host

WorkerSettings = worker_settings(
    kinds=("kie-standard",), job_timeout=float(os.environ["CALLWARDEN_TEST_JOB_TIMEOUT_S"]),
    max_jobs=int(os.environ.get("CALLWARDEN_TEST_MAX_JOBS", "1")),
    max_deliveries=int(os.environ.get("CALLWARDEN_TEST_MAX_DELIVERIES", "5")), grace_s=5,
    poll_delay=0.1,
    functions=[own_call_function(own_host.KIND, own_host.predict, name="tests.predict")])
