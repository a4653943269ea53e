"""What the Celery and arq integrations set up before any worker runs (no broker needed):
redelivery later than the longest call, the acks a durable call wants, the host's own
settings kept, and the schedule on which a job is retried through a database outage."""

from __future__ import annotations

import logging
import sys
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest
from arq.worker import Worker
from celery import Celery

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallOutcome
from callwarden.errors import ConfigError, DatabaseUnavailable
from callwarden.projections.fold import EMPTY
from callwarden.queue.arq import TASK_NAME as ARQ_TASK
from callwarden.queue.arq import worker_settings
from callwarden.queue.celery import (
    TASK_NAME,
    WAITING_HEADER,
    CallTask,
    register,
    visibility_timeout_for,
)
from callwarden.queue.outage import OutageRetries
from callwarden.queue.process import (
    ProcessRunner,
    RunnerOptions,
    longest_run_s,
    options_from_env,
)


def test_the_longest_run_covers_create_its_429_waits_budget_last_poll_and_finalization(
        ) -> None:
    # The create: a 60 s request bound (30 s of retries + a 30 s timeout) plus
    # rate_limited_wait_s (300 s: a 429 of a limited account's kind is created again after
    # the pause, sleeping while every pause ends inside it; only the last request comes on
    # top); a 15 min budget + one last poll; and 4 media finalized (4 x (120 s download +
    # 60 s upload)).
    assert longest_run_s(kinds=["kie-standard"]) == (60 + 300) + (900 + 60) + 720 == 2040
    assert longest_run_s(kinds=["anthropic-sync"]) == (60 + 300) + 720  # no polling
    # kie-lip-sync: a 60 min budget
    assert longest_run_s() == longest_run_s(kinds=["kie-lip-sync"]) == 360 + 3660 + 720 == 4740
    short = CallConfig(poll_budget_s={"kie-standard": 10.0})
    assert longest_run_s(short, kinds=["kie-standard"]) == 360 + 70 + 720
    # the 429 wait is a setting: the bound follows it
    patient = CallConfig(rate_limited_wait_s=1200.0)
    assert longest_run_s(patient, kinds=["kie-standard"]) == (60 + 1200) + 960 + 720
    assert longest_run_s(patient, kinds=["anthropic-sync"]) == (60 + 1200) + 720


def test_celery_register_defaults_a_visibility_timeout_past_the_longest_call() -> None:
    app = Celery("t", broker="memory://")
    task = register(app, name="t.run_call")
    # the longest run of every kind (kie-lip-sync: 4,740 s, its 429 waits included) + 60 s
    assert app.conf.broker_transport_options["visibility_timeout"] == 4800.0
    assert visibility_timeout_for() == 4800.0 > 3600  # kombu's own default is too short
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
    # kie-standard: 2,040 s (its 429 waits included) + 60 s
    assert "visibility_timeout 30s is shorter than the longest call (2100s)" in caplog.text


async def test_arq_settings_time_out_after_the_longest_call_and_redeliver_10s_later() -> None:
    settings = worker_settings(redis_url="redis://127.0.0.1:1/0", kinds=["kie-standard"],
                               max_deliveries=3, log_level=None)
    # longest_run_s for kie-standard: (60 + 300) create and its 429 waits, 900 + 60 polled,
    # 720 finalized: arq never cancels a create sleeping through the provider's 429s
    assert settings["job_timeout"] == 2040
    fn = settings["functions"][0]
    # arq's own count is out of reach: the function gives a job up after max_deliveries
    # deliveries, not counting the tries that met a database outage
    assert (fn.name, fn.timeout_s, fn.max_tries) == (ARQ_TASK, 2040, sys.maxsize)
    worker = Worker(**settings)  # nothing connects until it runs
    assert worker.in_progress_timeout_s == 2050  # how long a dead worker's job waits
    assert worker._job_completion_wait == 30


def test_arq_settings_warn_when_the_hosts_job_timeout_is_too_short(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="callwarden.queue.arq"):
        settings = worker_settings(redis_url="redis://127.0.0.1:1/0", job_timeout=60,
                                   kinds=["kie-standard"], max_jobs=2, poll_delay=0.1)
    assert (settings["job_timeout"], settings["max_jobs"], settings["poll_delay"]) == (
        60, 2, 0.1)
    assert "job_timeout 60s is shorter than the longest call (2040s)" in caplog.text


def test_outage_retries_cover_the_default_limit_then_keep_the_job_at_a_minute() -> None:
    retries = OutageRetries()  # CALLWARDEN_DB_OUTAGE_LIMIT_S unset: 300 s
    delays = [retries.delay_s(n) for n in range(1, 13)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    assert retries.within_limit == 10  # 303 s of delays >= 300 s; 9 give 243 s
    assert sum(delays[:10]) >= 300 > sum(delays[:9])
    assert (retries.past_limit(10), retries.past_limit(11)) == (False, True)
    assert retries.delay_s(10_000) == retries.step_s == 60  # past the limit: as long as it lasts
    assert retries.wait_s == 30  # a try waits for a connection as long as before


def test_outage_retries_follow_a_small_limit() -> None:
    retries = OutageRetries.from_env({"CALLWARDEN_DB_OUTAGE_LIMIT_S": "2"})
    assert (retries.limit_s, retries.step_s, retries.wait_s) == (2, 0.4, 0.2)
    assert [retries.delay_s(n) for n in (1, 2, 50)] == [0.4, 0.4, 0.4]
    assert retries.within_limit == 5
    long = OutageRetries(limit_s=3600)
    assert (long.step_s, long.within_limit) == (60, 65)  # 123 s in 7, then 58 x 60 s


def test_outage_retries_refuse_what_is_not_a_schedule() -> None:
    with pytest.raises(ConfigError, match="CALLWARDEN_DB_OUTAGE_LIMIT_S"):
        OutageRetries.from_env({"CALLWARDEN_DB_OUTAGE_LIMIT_S": "-1"})
    with pytest.raises(ValueError, match="retry counts from 1"):
        OutageRetries().delay_s(0)
    with pytest.raises(ValueError, match="must be > 0"):
        OutageRetries(first_s=0)


def test_a_queue_process_takes_its_outage_schedule_from_the_environment() -> None:
    env = {"DATABASE_URL": "postgresql://127.0.0.1/x", "CALLWARDEN_DB_OUTAGE_LIMIT_S": "40",
           "CALLWARDEN_MEDIA_DIR": "media"}
    options = options_from_env(env)
    assert options.outage == OutageRetries(limit_s=40)
    assert RunnerOptions(database_url="x", settings=options.settings,
                         media=options.media).outage == OutageRetries.from_env()


def test_celery_call_task_leaves_outage_retries_to_itself() -> None:
    """No ``autoretry_for``: a retry bounded by ``max_retries`` would fail and ack a
    task whose job was never recorded (issue 24.1); ``run_call`` retries it itself."""
    assert not getattr(CallTask, "autoretry_for", ())


def test_celery_counts_outage_retries_apart_from_waiting_ones() -> None:
    """Celery's ``request.retries`` counts every retry, the waiting ones (a start the
    account's limits refused) too: each waiting retry carries its count in
    ``WAITING_HEADER``, one more per retry, beside the message's own headers, and the
    outage schedule counts ``retries`` minus it. A task that waited ten times meets its
    first outage as retry 1 (1 s), not retry 11 (60 s, "past the outage limit"). On the
    memory transport: the retries are published, no broker runs."""
    app = Celery("t", broker="memory://")
    task = register(app, name="t.run_call_counted", kinds=["kie-standard"])
    job = uuid.uuid4()
    asked: list[int] = []

    def retry_after_outage(_job: uuid.UUID, _delivery: str, retry: int,
                           _exc: BaseException) -> float:
        asked.append(retry)
        return 1.0

    process = cast(ProcessRunner, SimpleNamespace(
        options=SimpleNamespace(outage=OutageRetries()), retry_after_outage=retry_after_outage,
        defer_waiting=lambda _outcome, _kind, _delivery: 0.5))
    waiting = CallOutcome(job_id=job, result="waiting", projection=EMPTY,
                          detail="kie-main: 1 of 1 calls in flight", retry_after_s=0.4)

    def pushed(retries: int, headers: dict[str, Any] | None) -> None:
        task.push_request(id=f"t-{job}", args=[str(job), "kie-standard", {}], kwargs={},
                          retries=retries, headers=headers, is_eager=False,
                          called_directly=False, delivery_info={})

    def outage_retry(retries: int, headers: dict[str, Any] | None) -> int:
        pushed(retries, headers)
        try:
            task._retry_after_outage(process, job, "d", DatabaseUnavailable("down"))
        finally:
            task.pop_request()
        return asked.pop()

    def waiting_retry(retries: int, headers: dict[str, Any] | None) -> Any:
        pushed(retries, headers)
        try:
            retried = task._retry_waiting(process, waiting, "kie-standard", "d")
        finally:
            task.pop_request()
        sig = getattr(retried, "sig", None)
        assert sig is not None, retried
        return sig.options

    first = waiting_retry(0, None)  # a message a host sent: no header yet
    assert (first["retries"], first["headers"]) == (1, {WAITING_HEADER: 1})
    tenth = waiting_retry(9, {WAITING_HEADER: 9, "host-trace": "abc"})  # the host's kept
    assert (tenth["retries"], tenth["headers"]) == (10, {WAITING_HEADER: 10,
                                                         "host-trace": "abc"})
    assert outage_retry(10, tenth["headers"]) == 1  # its first outage: the first delay
    assert outage_retry(12, tenth["headers"]) == 3  # two outage retries after the waits
    assert outage_retry(10, None) == 11  # a message without the header: every retry counts
    assert outage_retry(3, {WAITING_HEADER: "x"}) == 4  # an unreadable count is none
