"""The host's Celery worker: ``celery -A worker worker --pool prefork`` from this folder.

callwarden's task runs each job's call through the host's own clients (``providers.py``,
found through ``CALLWARDEN_PROVIDERS=providers:PROVIDERS`` or the package's entry point):
acked late, redelivered when a worker dies, resumed (never created twice) on redelivery,
one event loop, pool and session per worker process after the fork.
"""

from __future__ import annotations

import os

from celery import Celery

from callwarden.queue.celery import register

app = Celery("acme_host", broker=os.environ["REDIS_URL"])
app.conf.broker_connection_retry_on_startup = True
run_call = register(app)  # the task callwarden.run_call(job_id, kind, request)
