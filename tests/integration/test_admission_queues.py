"""Admission control on the queues (issue 42): a job whose start its provider account's
limits refuse waits in its queue, deferred by the limit's ``retry_after_s`` (plus up to a
quarter of it), for as long as it is refused, without counting a delivery (arq's
``max_deliveries``) or a retry (Celery's ``max_retries``), and runs once a slot frees:
one create upstream, the call completed once.

Every case sets its limit by plain SQL, as a host may (``callwarden.limits``), and holds
the account's only slot with a call another actor started through the host API
(``callwarden.start_call``: a ``created`` call, open until something ends it), then frees
it with ``callwarden.cancel``. The database and Redis are real; the provider is the
simulator served by this process (its journal counts the creates).

- In process: arq's :func:`run_job_call` and :func:`run_own_call` (an async and a sync
  kind), their ``Retry`` and Redis counters read directly; a Celery task run eagerly.
- Real worker processes (``arq tests.acceptance.arq_app.WorkerSettings``, ``celery -A
  tests.acceptance.celery_app worker``) whose host gives a job up after one delivery (arq)
  or one retry (Celery), refused several times before the slot frees.
- (The Node client's admission test, ``clients/node/test/admission.test.js``, is run by
  ``tests/acceptance/test_node_host.py`` with the client's other Node tests.)
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from arq.connections import ArqRedis
from arq.worker import Retry
from celery import Celery

import callwarden.queue.celery as celery_queue
from callwarden.calls.config import CallConfig
from callwarden.calls.own import OwnCall
from callwarden.calls.own_sync import SyncCall
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.providers.outcomes import Failed
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.arq import (
    CTX_KEY,
    OUTAGE_KEY,
    WAITING_KEY,
    run_job_call,
    run_own_call,
)
from callwarden.queue.celery import register
from callwarden.queue.process import RunnerOptions, open_runner
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import Workers
from tests.support.queues import (
    Queues,
    QueueWorker,
    send_call,
    until,
    value,
)

KIND = "kie-standard"
SYNC_KIND = "anthropic-sync"
ACCOUNT = "kie-main"
WAIT_S = 0.5  # the limit's wait: the deferrals are WAIT_S to 1.25 * WAIT_S
REFUSED = f"{ACCOUNT}: 1 of 1 calls in flight"
REQUEST = {"model": "nano-banana-pro",
           "input": {"prompt": "a cat",
                     "_sim": {"steps": [{"phase": "running", "polls": 1}],
                              "end": "succeeded"}}}
SYNC_REQUEST = {"model": "claude-sonnet-4-5", "max_tokens": 64,
                "messages": [{"role": "user", "content": "hello"}]}


# -- the limit, the slot, the job ----------------------------------------------------------

async def one_slot(conn: Conn, kind: str = KIND) -> None:
    """``kind``'s account may hold one call in flight; a refused start waits WAIT_S."""
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s) "
                       "VALUES (%s, ARRAY[%s], 1, %s)", (ACCOUNT, kind, WAIT_S))


async def hold_the_slot(conn: Conn, kind: str = KIND) -> uuid.UUID:
    """A call of ``kind`` started by another actor (the host API), holding the only slot."""
    holder = await create_job(conn, user_id="user-holder", credits=5)
    action = await value(conn, "SELECT action FROM callwarden.start_call(%s, %s, "
                               "'node:holder', sync => %s)", holder, kind, kind == SYNC_KIND)
    assert action == "create"
    return holder


async def free_the_slot(conn: Conn, holder: uuid.UUID) -> None:
    ok = await value(conn, "SELECT ok FROM callwarden.cancel(%s, 'admin')", holder)
    assert ok is True


async def the_job(conn: Conn, request: dict[str, Any] = REQUEST, kind: str = KIND) -> uuid.UUID:
    return await create_job(conn, input_data={"provider_kind": kind, "request": request},
                            credits=10)


async def untouched(conn: Conn, job: uuid.UUID) -> int:
    """The job's refusals so far (``callwarden.waiting``), asserting nothing was written to
    the job: no event, no call, its reservation still reserved."""
    events = await value(conn, "SELECT count(*) FROM callwarden.call_events WHERE job_id = %s",
                         job)
    row = await (await conn.execute(
        "SELECT j.call_state, (SELECT array_agg(u.status) FROM usage_logs u "
        "WHERE u.job_id = j.id) AS credits FROM jobs j WHERE j.id = %s", (job,))).fetchone()
    assert (events, row) == (0, {"call_state": None, "credits": ["reserved"]})
    return int(await value(conn, "SELECT refusals FROM callwarden.waiting WHERE job_id = %s",
                           job) or 0)


async def settled_once(conn: Conn, job: uuid.UUID, state: str, credits: str) -> None:
    """The job's call ended in ``state``, its reservation moved once to ``credits``, its
    waiting row gone, projections equal to the log."""
    row = await (await conn.execute(
        "SELECT j.call_state, (SELECT array_agg(u.status) FROM usage_logs u "
        "WHERE u.job_id = j.id) AS credits, (SELECT count(*) FROM callwarden.waiting w "
        "WHERE w.job_id = j.id) AS waiting FROM jobs j WHERE j.id = %s", (job,))).fetchone()
    assert row == {"call_state": state, "credits": [credits], "waiting": 0}
    assert await verify_job(conn, job) == []


def options(db_url: str, sim: RunningSimulator, tmp_path: Path) -> RunnerOptions:
    return RunnerOptions(database_url=db_url, settings=sim.settings,
                         media=LocalFolderStore(tmp_path / "media"),
                         config=CallConfig(poll_interval_s={KIND: 0.05}))


def deferred_s(refused: pytest.ExceptionInfo[Retry]) -> float:
    return (refused.value.defer_score or 0) / 1000


# -- arq, in process --------------------------------------------------------------------

async def test_arq_defers_a_refused_job_past_max_deliveries_then_runs_it_once(
        db_url: str, conn: Conn, sim: RunningSimulator, arq_redis: ArqRedis,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Six tries of a job over a full account (more than ``max_deliveries``, 5) each raise
    ``Retry`` deferred by the limit's wait plus at most a quarter, are logged at info with
    the limit, write nothing to the job and send nothing upstream, and are counted apart
    from the outage tries (``WAITING_KEY``). Once the holder's call ends, try 7 is its
    first delivery: it runs (a count of tries as deliveries would give it up, refunded) and
    completes with one create; the counter is cleared."""
    await one_slot(conn)
    holder = await hold_the_slot(conn)
    job = await the_job(conn)
    arq_id = f"callwarden:{job}"
    ctx = {"redis": arq_redis, "job_id": arq_id}
    caplog.set_level(logging.INFO, logger="callwarden.queue")
    process = await open_runner(options(db_url, sim, tmp_path), role="arq")
    try:
        ctx[CTX_KEY] = process
        for tries in range(1, 7):
            with pytest.raises(Retry) as refused:
                await run_job_call({**ctx, "job_try": tries}, job, KIND, REQUEST)
            assert WAIT_S <= deferred_s(refused) <= WAIT_S * 1.25 + 0.001
        assert await arq_redis.get(WAITING_KEY + arq_id) == b"6"
        assert await arq_redis.exists(OUTAGE_KEY + arq_id) == 0
        assert await untouched(conn, job) == 6
        assert sim.sim.journal.count("kie", "create") == 0

        await free_the_slot(conn, holder)
        outcome = await run_job_call({**ctx, "job_try": 7}, job, KIND, REQUEST)
    finally:
        await process.close()
    assert outcome.result == "completed"
    assert sim.sim.journal.count("kie", "create") == 1
    assert await arq_redis.exists(WAITING_KEY + arq_id) == 0
    await settled_once(conn, job, "completed", "committed")
    waiting = [r.getMessage() for r in caplog.records
               if r.levelno == logging.INFO and " waiting: " in r.getMessage()]
    assert len(waiting) == 6
    assert all(f"job {job} kind={KIND} arq_job={arq_id} try=" in line and REFUSED in line
               and "(not a delivery)" in line for line in waiting)


@pytest.mark.parametrize("kind", [KIND, SYNC_KIND])
async def test_an_own_call_refused_by_its_account_is_deferred_and_its_body_not_run(
        kind: str, db_url: str, conn: Conn, sim: RunningSimulator, arq_redis: ArqRedis,
        tmp_path: Path) -> None:
    """The host's own code for a job over a full account (an async kind, opened with
    ``OwnCalls.start``; a sync one, with ``sync_call``): ``CallWaiting`` becomes the
    outcome ``waiting`` in ``run_own``, which arq defers (``Retry``) without a delivery;
    the body is not run. Once the slot frees, the body runs once, told ``create``."""
    await one_slot(conn, kind)
    holder = await hold_the_slot(conn, kind)
    job = await the_job(conn, SYNC_REQUEST if kind == SYNC_KIND else REQUEST, kind)
    ran: list[str] = []

    async def body(call: OwnCall | SyncCall, seen: list[str]) -> None:
        if isinstance(call, SyncCall):
            seen.append("sync")
            call.succeeded(text="hello back")
            return
        seen.append(call.action)
        await call.task_created(f"own-{call.job_id}")
        await call.report(Failed(error="the host's own provider failed it"))

    arq_id = f"callwarden:{job}"
    process = await open_runner(options(db_url, sim, tmp_path), role="arq")
    try:
        ctx = {CTX_KEY: process, "redis": arq_redis, "job_id": arq_id}
        for tries in (1, 2):
            with pytest.raises(Retry) as refused:
                await run_own_call({**ctx, "job_try": tries}, job, kind, body, (ran,))
            assert WAIT_S <= deferred_s(refused) <= WAIT_S * 1.25 + 0.001
        assert (ran, await untouched(conn, job)) == ([], 2)
        assert await arq_redis.get(WAITING_KEY + arq_id) == b"2"
        await free_the_slot(conn, holder)
        outcome = await run_own_call({**ctx, "job_try": 3}, job, kind, body, (ran,))
    finally:
        await process.close()
    if kind == SYNC_KIND:
        assert (ran, outcome.result) == (["sync"], "completed")
        await settled_once(conn, job, "completed", "committed")
    else:
        assert (ran, outcome.result) == (["create"], "failed")
        await settled_once(conn, job, "failed", "refunded")
    assert await arq_redis.exists(WAITING_KEY + arq_id) == 0


# -- Celery, eagerly (in process) ---------------------------------------------------------

async def test_an_eager_celery_task_over_a_full_account_returns_waiting(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Run eagerly (``apply``: no queue to wait in, a retry would run at once, nested, and
    be refused again), the task returns the outcome ``waiting`` with the limit and its
    ``retry_after_s``, neither retrying nor failing, and says so once; nothing was
    written to the job."""
    monkeypatch.setattr(celery_queue, "_options", None)  # this test's own runtime
    monkeypatch.setattr(celery_queue, "_runtime", None)
    await one_slot(conn)
    await hold_the_slot(conn)
    job = await the_job(conn)
    app = Celery("callwarden-admission-eager", broker="memory://")
    task = register(app, options=options(db_url, sim, tmp_path), kinds=(KIND,))
    caplog.set_level(logging.INFO, logger="callwarden.queue")
    try:
        result = await asyncio.to_thread(task.apply, args=(str(job), KIND, REQUEST))
    finally:
        await asyncio.to_thread(celery_queue.stop_process)
    assert result.state == "SUCCESS"
    answer = result.result
    assert isinstance(answer, dict)
    assert (answer["result"], answer["detail"], answer["state"]) == ("waiting", REFUSED, None)
    assert 0 < answer["retry_after_s"] <= WAIT_S
    assert await untouched(conn, job) == 1
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and str(job) in r.getMessage()]
    assert len(warned) == 1
    assert "in a task run eagerly" in warned[0]
    assert REFUSED in warned[0]


# -- real worker processes ----------------------------------------------------------------

# The outcome line of a job that completed, and of a try refused by the limit.
WAITING_LINE = r"job {job} kind=kie-standard {delivery} pid=\d+ waiting: {reason}; again in " \
               r"([\d.]+) s \(not a delivery\)"


@pytest.fixture
async def queues(db_url: str, sim: RunningSimulator, redis_url: str,
                 tmp_path: Path) -> AsyncIterator[Queues]:
    """Workers whose host gives a job up after one delivery (arq) and bounds its task's
    retries to one (Celery): a refused try counted against either would drop the job."""
    env = Workers(db_url, sim, tmp_path).env(None, {
        "CALLWARDEN_REDIS_URL": redis_url, "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media"),
        "CALLWARDEN_TEST_MAX_DELIVERIES": "1", "CALLWARDEN_TEST_MAX_RETRIES": "1",
        "CALLWARDEN_CALL_POLL_INTERVAL_KIE_STANDARD": "0.1",
        "CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "0.2",
        "CALLWARDEN_TEST_VISIBILITY_S": "120", "CALLWARDEN_TEST_JOB_TIMEOUT_S": "120",
        "CALLWARDEN_TEST_MAX_JOBS": "1"})
    qs = Queues(env, tmp_path)
    try:
        yield qs
    finally:
        await qs.kill_leftovers()


async def _started(queue: str, queues: Queues) -> QueueWorker:
    worker = await (queues.arq() if queue == "arq" else queues.celery(queue, concurrency=1))
    await worker.line(r"process \d+ ready", "the worker's runner")
    return worker


@pytest.mark.xdist_group("fleets")  # spawns worker processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("queue", ["arq", "celery"])
async def test_a_real_worker_keeps_a_refused_job_queued_past_its_give_up_then_runs_it_once(
        queue: str, conn: Conn, sim: RunningSimulator, queues: Queues, arq_redis: ArqRedis,
        redis_url: str) -> None:
    """A real worker whose host gives a job up after one delivery (arq) or one retry
    (Celery) refuses the job three times over a full account: three lines at info naming
    the limit, each deferral between the limit's wait and a quarter more, nothing written
    to the job, nothing sent upstream, and the job still queued (neither given up nor
    failed). Once the holder's call ends, the next try runs it: completed, one create,
    committed once."""
    await one_slot(conn)
    holder = await hold_the_slot(conn)
    job = await the_job(conn)
    worker = await _started(queue, queues)
    delivery = await send_call(queue, job, KIND, REQUEST, arq_redis, redis_url)
    refused = await worker.line(WAITING_LINE.format(job=job, delivery=delivery,
                                                    reason=re.escape(REFUSED)),
                                "three refused tries", count=3)
    assert all(WAIT_S <= float(m.group(1)) <= WAIT_S * 1.25 + 0.01 for m in refused)
    assert await untouched(conn, job) >= 3
    assert sim.sim.journal.count("kie", "create") == 0

    await free_the_slot(conn, holder)
    await worker.line(rf"job {job} kind={KIND} {delivery} pid=\d+ result=completed",
                      "the job's outcome")
    await until("the job's settlement", lambda: value(
        conn, "SELECT call_state = 'completed' FROM jobs WHERE id = %s", job))
    assert sim.sim.journal.count("kie", "create") == 1
    await settled_once(conn, job, "completed", "committed")
    logs = worker.logs()
    assert "given up" not in logs
    assert "MaxRetriesExceeded" not in logs
    assert not re.search(r"failed, |raised unexpected", logs)
    if queue == "celery":  # each refusal is a published retry, whatever max_retries says
        assert len(re.findall(rf"Task callwarden\.run_call\[t-{job}\] retry: Retry in",
                              logs)) >= 3


# An outage's retry of a job that waited: the outage schedule counts only its own retries.
OUTAGE_LINE = r"job {job} {delivery}: database error before its call started \([\s\S]*?\); " \
              r"outage retry (\d+) in ([\d.]+) s"  # (the error's text spans two lines)
REFUSE_THE_JOBS_EVENTS = """
CREATE FUNCTION refuse_the_jobs_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_id = '{job}'::uuid THEN
        RAISE EXCEPTION 'the test refuses the events of job {job}';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_the_jobs_events BEFORE INSERT ON callwarden.call_events
    FOR EACH ROW EXECUTE FUNCTION refuse_the_jobs_events();
"""


@pytest.mark.xdist_group("fleets")  # spawns worker processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("queue", ["arq", "celery"])
async def test_a_job_that_waited_gets_the_first_outage_delay_at_its_first_outage(
        queue: str, conn: Conn, sim: RunningSimulator, queues: Queues, arq_redis: ArqRedis,
        redis_url: str) -> None:
    """A job refused by its account three times or more, whose next try (the slot freed)
    meets a database error before its call started (a trigger refusing the job's
    ``CallStarted``: retried on the outage schedule), is at its first outage retry: 1 s,
    then 2 s, never "past the outage limit". Celery's ``request.retries`` counts the
    waiting retries too: counted as outage retries, the first would have been retry 4 or
    later (8 s), and a job that waited ten times would have had the longest delay and a
    false "past the outage limit" (arq counts the two apart in Redis; Celery carries the
    waiting count in the message's ``WAITING_HEADER``). Once the database takes the
    job's events, it runs once: one create, committed."""
    await one_slot(conn)
    holder = await hold_the_slot(conn)
    job = await the_job(conn)
    worker = await _started(queue, queues)
    delivery = await send_call(queue, job, KIND, REQUEST, arq_redis, redis_url)
    waited = WAITING_LINE.format(job=job, delivery=delivery, reason=re.escape(REFUSED))
    await worker.line(waited, "three refused tries", count=3)

    await conn.execute(REFUSE_THE_JOBS_EVENTS.format(job=job).encode())
    await free_the_slot(conn, holder)
    outage = OUTAGE_LINE.format(job=job, delivery=delivery)
    first, second = await worker.line(outage, "two outage retries", count=2)
    logs = worker.logs()
    waits = len(re.findall(waited, logs[:first.start()]))
    assert waits >= 3
    assert (first.group(1), first.group(2)) == ("1", "1"), (waits, first.group(0))
    assert (second.group(1), second.group(2)) == ("2", "2"), second.group(0)
    assert "past the outage limit" not in logs
    assert sim.sim.journal.count("kie", "create") == 0

    await conn.execute("DROP TRIGGER refuse_the_jobs_events ON callwarden.call_events")
    await worker.line(rf"job {job} kind={KIND} {delivery} pid=\d+ result=completed",
                      "the job's outcome")
    await until("the job's settlement", lambda: value(
        conn, "SELECT call_state = 'completed' FROM jobs WHERE id = %s", job))
    assert sim.sim.journal.count("kie", "create") == 1
    await settled_once(conn, job, "completed", "committed")
    logs = worker.logs()
    assert "given up" not in logs
    assert not re.search(r"failed, |raised unexpected", logs)
