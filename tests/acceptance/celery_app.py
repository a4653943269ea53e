"""The Celery app whose real workers ``test_queue_integrations.py`` starts
(``celery -A tests.acceptance.celery_app worker --pool prefork``). The broker and the
visibility timeout come from the environment the test gives each worker, and so does a
host's own ``max_retries`` on the task (``CALLWARDEN_TEST_MAX_RETRIES``, when set); the rest
is what :func:`callwarden.queue.celery.register` sets up for any host."""

from __future__ import annotations

import os

from celery import Celery

from callwarden.queue.celery import own_call_task, register
from tests.acceptance import own_host

app = Celery("callwarden-tests", broker=os.environ["CALLWARDEN_REDIS_URL"])
app.conf.update(broker_connection_retry_on_startup=True,
                worker_cancel_long_running_tasks_on_connection_loss=False)
run_call = register(app, kinds=("kie-standard",),
                    visibility_timeout=float(os.environ["CALLWARDEN_TEST_VISIBILITY_S"]))
if "CALLWARDEN_TEST_MAX_RETRIES" in os.environ:
    run_call.max_retries = int(os.environ["CALLWARDEN_TEST_MAX_RETRIES"])
# The host's own Replicate code as a durable task: predict(job_id, request).
predict = own_call_task(app, own_host.KIND, name="tests.predict",
                        visibility_timeout=float(os.environ["CALLWARDEN_TEST_VISIBILITY_S"])
                        )(own_host.predict)
