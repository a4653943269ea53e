"""The Celery app of ``callwarden demo --queue celery`` (``celery -A callwarden.demo.celery_app
worker``): what :func:`callwarden.queue.celery.register` sets up for any host, on the demo's
Redis (``CALLWARDEN_REDIS_URL``), queue (``CALLWARDEN_DEMO_QUEUE``) and demo-scale
visibility timeout (``CALLWARDEN_DEMO_REDELIVER_S``); the calls' settings come from the
environment :mod:`callwarden.demo.queues` gives each worker.

kombu restores unacked messages under a Redis lock (``unacked_mutex``) that expires after
``unacked_mutex_expire``, 300 s by default: a worker SIGKILLed while it holds the lock (it
restores as it starts, which is when the demo's killer may strike) would stop every other
worker restoring for five minutes, past the demo's deadline, and leave a dead worker's
unstarted job in the queue. The demo's lock expires after a few seconds instead."""

from __future__ import annotations

import os

from celery import Celery

from callwarden.queue.celery import register

VISIBILITY_S = float(os.environ["CALLWARDEN_DEMO_REDELIVER_S"])
RESTORE_LOCK_S = 4.0  # a restore takes milliseconds

app = Celery("callwarden-demo", broker=os.environ["CALLWARDEN_REDIS_URL"])
app.conf.update(broker_connection_retry_on_startup=True,
                task_default_queue=os.environ["CALLWARDEN_DEMO_QUEUE"],
                worker_cancel_long_running_tasks_on_connection_loss=False,
                broker_transport_options={"unacked_mutex_expire": RESTORE_LOCK_S})
run_call = register(app, visibility_timeout=VISIBILITY_S)
