"""A host that runs the Celery task eagerly (``task_always_eager``, as a host's tests do),
run by ``test_queue_outage.py`` as its own process:
``python -m tests.acceptance.celery_eager_host <job id> <request JSON>``. It prints the
task's state and the type of its result, and exits 0 (the result is what is checked)."""

from __future__ import annotations

import json
import logging
import sys

from celery import Celery

from callwarden.queue.celery import register


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    app = Celery("callwarden-eager-host", broker="memory://")
    app.conf.task_always_eager = True
    task = register(app, kinds=("kie-standard",))
    job_id, request = argv[0], json.loads(argv[1])
    result = task.delay(job_id, "kie-standard", request)
    print(f"state={result.state} result={type(result.result).__name__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
