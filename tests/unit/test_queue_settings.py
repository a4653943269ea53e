"""What the Celery and arq integrations set up before any worker runs (no broker needed):
redelivery later than the longest call, the acks a durable call wants, and the host's own
settings kept."""

from __future__ import annotations

import logging

import pytest
from arq.worker import Worker
from celery import Celery

from callwarden.calls.config import CallConfig
from callwarden.queue.arq import TASK_NAME as ARQ_TASK
from callwarden.queue.arq import worker_settings
from callwarden.queue.celery import TASK_NAME, CallTask, register, visibility_timeout_for
from callwarden.queue.process import longest_run_s


def test_the_longest_run_covers_create_budget_last_poll_and_finalization() -> None:
    # 60 s request bound (30 s of retries + a 30 s timeout), 15 min budget + one last
    # poll, and 4 media finalized (4 x (120 s download + 60 s upload)).
    assert longest_run_s(kinds=["kie-standard"]) == 60 + (900 + 60) + 720
    assert longest_run_s(kinds=["anthropic-sync"]) == 60 + 720  # no polling
    assert longest_run_s() == longest_run_s(kinds=["kie-lip-sync"]) == 4440
    short = CallConfig(poll_budget_s={"kie-standard": 10.0})
    assert longest_run_s(short, kinds=["kie-standard"]) == 60 + 70 + 720


def test_celery_register_defaults_a_visibility_timeout_past_the_longest_call() -> None:
    app = Celery("t", broker="memory://")
    task = register(app, name="t.run_call")
    assert app.conf.broker_transport_options["visibility_timeout"] == 4500.0
    assert visibility_timeout_for() == 4500.0 > 3600  # kombu's own default is too short
    assert app.conf.worker_prefetch_multiplier == 1
    assert isinstance(task, CallTask)
    assert (task.acks_late, task.reject_on_worker_lost, task.acks_on_failure_or_timeout) == (
        True, True, True)
    assert (task.name, TASK_NAME) == ("t.run_call", "callwarden.run_call")


def test_celery_register_keeps_the_hosts_settings_and_warns_when_too_short(
        caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("t", broker="memory://")
    app.conf.update(broker_transport_options={"visibility_timeout": 30, "x": 1},
                    worker_prefetch_multiplier=8)
    with caplog.at_level(logging.WARNING, logger="callwarden.queue.celery"):
        register(app, name="t.run_call_2", kinds=["kie-standard"])
        assert app.conf.broker_transport_options == {"visibility_timeout": 30, "x": 1}
    assert app.conf.worker_prefetch_multiplier == 8
    assert "visibility_timeout 30s is shorter than the longest call (1800s)" in caplog.text


async def test_arq_settings_time_out_after_the_longest_call_and_redeliver_10s_later() -> None:
    settings = worker_settings(redis_url="redis://127.0.0.1:1/0", kinds=["kie-standard"],
                               max_deliveries=3, log_level=None)
    assert settings["job_timeout"] == 1740
    fn = settings["functions"][0]
    assert (fn.name, fn.timeout_s, fn.max_tries) == (ARQ_TASK, 1740, 4)
    worker = Worker(**settings)  # nothing connects until it runs
    assert worker.in_progress_timeout_s == 1750  # how long a dead worker's job waits
    assert worker._job_completion_wait == 30


def test_arq_settings_warn_when_the_hosts_job_timeout_is_too_short(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="callwarden.queue.arq"):
        settings = worker_settings(redis_url="redis://127.0.0.1:1/0", job_timeout=60,
                                   kinds=["kie-standard"], max_jobs=2, poll_delay=0.1)
    assert (settings["job_timeout"], settings["max_jobs"], settings["poll_delay"]) == (
        60, 2, 0.1)
    assert "job_timeout 60s is shorter than the longest call (1740s)" in caplog.text
