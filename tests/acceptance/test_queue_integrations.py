"""Real Celery and arq workers killed with SIGKILL while their call polls: the broker
delivers the job again, another process resumes the call, and nothing is paid twice
(issue 16; :mod:`callwarden.queue.celery`, :mod:`callwarden.queue.arq`).

Each case runs a real ``redis-server`` (``tests/redis.py``), real worker processes
(``celery -A tests.acceptance.celery_app worker --pool prefork --concurrency 2``,
``arq tests.acceptance.arq_app.WorkerSettings``), the provider simulator in this process
and the test's own Postgres. The upstream task runs for an hour of simulated time, so a
call polls for as long as the test needs: the test waits on SQL (``call_state`` and
``heartbeat_owner``, which each process's runner writes under its own owner id), kills,
waits for the broker's own redelivery condition (Celery on Redis: the unacked message is
older than the visibility timeout; arq: the job's in-progress key has expired), sees the
other process poll the same task, and only then moves the simulator's clock past the end.

Then, from the simulator's journal and SQL: one upstream create for the job, its
reservation settled exactly once (one settling event, one audited move, from
``reserved``), projections equal to the fold of the log (``callwarden.replay.verify``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from arq.connections import ArqRedis
from celery import Celery

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import execute_script
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.queue import arq as cw_arq
from callwarden.queue import celery as cw_celery
from callwarden.queue.arq import TASK_NAME as ARQ_TASK
from callwarden.queue.arq import enqueue_call, enqueue_own_call, own_call_function
from callwarden.queue.celery import enqueue_own_call as send_own_call
from callwarden.queue.celery import own_call_task
from tests.acceptance import own_host
from tests.acceptance.conftest import Workers
from tests.support.queues import Queues, QueueWorker, completed_once, send_celery_task, until, value

# One process runs every fleet test (README: the tests run in two), so two fleets of
# worker processes never compete for the cores against their deadlines.
pytestmark = pytest.mark.xdist_group("fleets")

VISIBILITY_S = 3.0  # Celery: an unacked message older than this is restored on Redis
JOB_TIMEOUT_S = 5.0  # arq: a dead worker's job is taken again 10 s after this
HOUR = {"steps": [{"phase": "running", "seconds": 3600}], "end": "succeeded"}
KIND = "kie-standard"
REQUEST = {"model": "nano-banana-pro", "input": {"prompt": "a cat", "_sim": HOUR}}
# What a second delivery running beside the first ends with: completed, or the first holds
# the finalization claim (it completes the call; this one leaves it, never waits).
BOTH = r"(completed|left_for_reconciler) state=(?:completed|finalizing)"
ENV = {"CALLWARDEN_CALL_POLL_INTERVAL_KIE_STANDARD": "0.1",
       "CALLWARDEN_CALL_POLL_BUDGET_KIE_STANDARD": "30",
       "CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "0.2",
       "CALLWARDEN_TEST_VISIBILITY_S": str(VISIBILITY_S),
       "CALLWARDEN_TEST_JOB_TIMEOUT_S": str(JOB_TIMEOUT_S),
       "CALLWARDEN_TEST_MAX_JOBS": "1"}


@pytest.fixture
async def queues(workers: Workers, redis_url: str, tmp_path: Path) -> AsyncIterator[Queues]:
    qs = Queues(workers.env(None, {**ENV, "CALLWARDEN_REDIS_URL": redis_url,
                                   "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media")}),
                tmp_path)
    try:
        yield qs
    finally:
        await qs.kill_leftovers()


OWN_REQUEST = {"version": "owner/model", "input": {"prompt": "an owl", "_sim": HOUR}}


@pytest.fixture
async def own_job(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> uuid.UUID:
    """A job the host's own Replicate code runs (``tests/acceptance/own_host.py``); the
    own tasks this test's process makes to enqueue it are forgotten after it."""
    monkeypatch.setattr(cw_arq, "_own_kinds", {})
    monkeypatch.setattr(cw_celery, "_own_names", {})
    await execute_script(conn, "demo_audit_trigger")
    return await create_job(conn, input_data={"prompt": "an owl"}, credits=10)


async def _own_completed_once(conn: Conn, sim: RunningSimulator, job: uuid.UUID) -> None:
    """Completed once, and every request to Replicate made by the host's own code (the
    resumed delivery polled through it too; callwarden's client never ran)."""
    await until("the call to complete", lambda: value(
        conn, "SELECT call_state = 'completed' FROM jobs WHERE id = %s", job))
    await completed_once(conn, sim, job, provider="replicate")
    agents = {e.headers.get("user-agent") for e in sim.sim.journal.entries("replicate")}
    assert agents == {own_host.USER_AGENT}


@pytest.fixture
async def job(conn: Conn) -> uuid.UUID:
    """One job with a reservation; the test database audits every settlement."""
    await execute_script(conn, "demo_audit_trigger")
    return await create_job(conn, input_data={"provider_kind": KIND, "request": REQUEST},
                            credits=10)


# -- conditions -----------------------------------------------------------------------------

async def _poller(conn: Conn, job: uuid.UUID, *, other_than: str | None = None,
                  what: str = "the call to be polling") -> str:
    """The owner id of a process polling the job's call (heartbeating it), other than
    ``other_than``."""
    sql = ("SELECT heartbeat_owner FROM jobs WHERE id = %s AND call_state = 'polling' "
           "AND heartbeat_owner IS NOT NULL AND heartbeat_owner IS DISTINCT FROM %s")
    owner: str = await until(what, lambda: value(conn, sql, job, other_than))
    return owner


async def _pollers(conn: Conn, job: uuid.UUID, n: int) -> set[str]:
    """Wait until ``n`` different processes have heartbeaten the polling call."""
    seen: set[str] = set()

    async def more() -> bool:
        owner = await value(conn, "SELECT heartbeat_owner FROM jobs WHERE id = %s "
                             "AND call_state = 'polling'", job)
        if owner is not None:
            seen.add(owner)
        return len(seen) >= n

    await until(f"{n} processes polling the job's one task", more)
    return seen


def _finish_upstream(sim: RunningSimulator) -> None:
    sim.sim.clock.advance(3600)  # the task ends: the next poll sees it succeeded


async def _exactly_once(conn: Conn, sim: RunningSimulator, job: uuid.UUID) -> None:
    await until("the call to complete", lambda: value(
        conn, "SELECT call_state = 'completed' FROM jobs WHERE id = %s", job))
    await completed_once(conn, sim, job)


async def _send(redis_url: str, job: uuid.UUID, task_id: str) -> None:
    await send_celery_task(redis_url, job, KIND, REQUEST, task_id)


def _owner_pid(worker: QueueWorker, owner: str) -> int:
    found = re.search(rf"process (\d+) ready \(owner {re.escape(owner)}\)", worker.logs())
    assert found, worker.logs()
    return int(found.group(1))


# -- Celery ---------------------------------------------------------------------------------

async def test_celery_worker_killed_while_polling_is_redelivered_and_resumed(
        conn: Conn, job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        redis_url: str) -> None:
    """The whole worker (main process and pool) dies: the message stays unacked in Redis,
    and the next worker to start restores it once it is older than the visibility
    timeout (kombu's ``restore_visible``); that worker resumes the call."""
    first = await queues.celery("first")
    await _send(redis_url, job, task_id="t-crash")
    dead = await _poller(conn, job)
    assert _owner_pid(first, dead) != first.proc.pid  # opened in a pool child, not main
    broker = aioredis.Redis.from_url(redis_url)
    assert await broker.zcard("unacked_index") == 1  # acks_late: unacked while it runs
    first.kill()
    assert await first.exited() == -9

    await until("the unacked message to be older than the visibility timeout",
                 lambda: broker.zcount("unacked_index", "-inf", time.time() - VISIBILITY_S))
    second = await queues.celery("second")
    resumed = await _poller(conn, job, other_than=dead, what="the second worker to poll")
    polls_before = sim.sim.journal.count("kie", "poll")
    _finish_upstream(sim)
    await _exactly_once(conn, sim, job)
    assert sim.sim.journal.count("kie", "poll") > polls_before
    assert resumed != dead
    await second.line(rf"job {job} kind={KIND} task=t-crash redelivered=True pid=\d+ "
                      r"result=completed", "the redelivered task's outcome")

    async def acked() -> bool:
        return bool(await broker.zcard("unacked_index") == 0)

    await until("the redelivered message to be acked", acked)
    await broker.aclose()


async def _child_killed_and_resumed(conn: Conn, worker: QueueWorker, job: uuid.UUID) -> None:
    """The pool child polling ``job``'s call is SIGKILLed; another child of the same worker
    (not its main process) takes the call over."""
    dead = await _poller(conn, job)
    child = _owner_pid(worker, dead)
    assert child != worker.proc.pid
    os.kill(child, signal.SIGKILL)
    resumed = await _poller(conn, job, other_than=dead, what="another child to poll")
    assert _owner_pid(worker, resumed) not in (child, worker.proc.pid)


async def test_celery_pool_child_killed_is_requeued_at_once_and_resumed(
        conn: Conn, job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        redis_url: str) -> None:
    """Only the pool child running the task dies: the main process sees the worker lost
    and, with ``reject_on_worker_lost``, requeues the message at once; another child of
    the same worker (with its own pool, loop and owner id) resumes the call."""
    worker = await queues.celery("solo")
    await _send(redis_url, job, task_id="t-child")
    await _child_killed_and_resumed(conn, worker, job)
    _finish_upstream(sim)
    await _exactly_once(conn, sim, job)
    await worker.line(rf"job {job} kind={KIND} task=t-child redelivered=True pid=\d+ "
                      r"result=completed", "the requeued task's outcome")
    assert worker.proc.returncode is None  # the worker itself lived on


async def test_celery_duplicate_delivery_while_running_creates_nothing_twice(
        conn: Conn, job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        redis_url: str) -> None:
    """The same task delivered again while the first delivery still polls (a visibility
    timeout shorter than the call, a double publish): both children run the job at once,
    poll the one task, and the fenced writes settle it once. SIGTERM then closes each
    child's runtime (``worker_process_shutdown``)."""
    worker = await queues.celery("twice")
    await _send(redis_url, job, task_id="t-twice")
    await _poller(conn, job)
    await _send(redis_url, job, task_id="t-twice")
    owners = await _pollers(conn, job, 2)
    pids = {_owner_pid(worker, o) for o in owners}
    assert len(pids) == 2
    assert worker.proc.pid not in pids
    _finish_upstream(sim)
    await _exactly_once(conn, sim, job)
    done = await worker.line(rf"job {job} kind={KIND} task=t-twice redelivered=\w+ "
                             rf"pid=(\d+) result={BOTH}", "both deliveries' outcomes", 2)
    assert {int(m.group(1)) for m in done} == pids
    assert "completed" in {m.group(2) for m in done}
    worker.proc.send_signal(signal.SIGTERM)
    assert await worker.exited() == 0, worker.logs()
    for pid in pids:
        assert f"process {pid} closed" in worker.logs()


async def test_celery_own_call_task_child_killed_is_resumed_never_created_twice(
        conn: Conn, own_job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        redis_url: str) -> None:
    """``own_call_task``: the host's own code creates the prediction and polls it in a pool
    child, which is SIGKILLed; the message is requeued (``reject_on_worker_lost``) and
    another child opens the call, is told ``resume`` (the body never creates again), and
    polls the same prediction through the host's code to the end."""
    worker = await queues.celery("own")
    producer = Celery("callwarden-test-producer", broker=redis_url)
    # as the host's web process sends it: its tasks module made the task on its app, and
    # enqueue_own_call finds it by kind (never a task name by hand)
    own_call_task(producer, own_host.KIND, name="tests.predict")(own_host.predict)
    try:
        await asyncio.to_thread(send_own_call, producer, own_job, own_host.KIND,
                                OWN_REQUEST, task_id="t-own")
    finally:
        producer.close()
    await _child_killed_and_resumed(conn, worker, own_job)
    _finish_upstream(sim)
    await _own_completed_once(conn, sim, own_job)
    await worker.line(rf"job {own_job} kind={own_host.KIND} task=t-own redelivered=True "
                      r"pid=\d+ result=completed", "the requeued own task's outcome")


async def test_a_celery_worker_that_cannot_run_calls_stops_and_takes_no_message(
        conn: Conn, job: uuid.UUID, queues: Queues, redis_url: str) -> None:
    """No media store named: the worker's main process stops with exit 2 before it
    consumes (``worker_init``). Before, each pool child failed every task for want of a
    runtime and the worker acked it: the job was left reserved, with no call."""
    del queues.env["CALLWARDEN_MEDIA_DIR"]
    await _send(redis_url, job, task_id="t-nomedia")
    worker = await queues.celery("nomedia")
    assert await worker.exited() == 2, worker.logs()
    assert "no media store configured" in worker.logs()
    broker = aioredis.Redis.from_url(redis_url)
    assert await broker.llen("celery") == 1  # the message is still queued
    await broker.aclose()
    row = await value(conn, "SELECT call_state FROM jobs WHERE id = %s", job)
    assert row is None


# -- arq ------------------------------------------------------------------------------------

async def test_arq_worker_killed_while_polling_is_taken_by_another_worker(
        conn: Conn, job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        arq_redis: ArqRedis) -> None:
    """arq keeps a running job in its queue under an in-progress key that expires
    ``job_timeout`` + 10 s after the start; a SIGKILLed worker never deletes it, so once it
    expires the other worker takes the job (try 2) and resumes the call."""
    first = await queues.arq()
    assert await enqueue_call(arq_redis, job, KIND, REQUEST) is not None
    dead = await _poller(conn, job)
    first.kill()
    assert await first.exited() == -9
    assert await arq_redis.exists(f"arq:in-progress:callwarden:{job}") == 1

    second = await queues.arq()
    resumed = await _poller(conn, job, other_than=dead, what="the second worker to poll")
    assert await arq_redis.exists(f"arq:in-progress:callwarden:{job}") == 1  # its own now
    assert resumed.startswith("arq:")
    _finish_upstream(sim)
    await _exactly_once(conn, sim, job)
    await second.line(rf"job {job} kind={KIND} arq_job=callwarden:{job} try=2 pid=\d+ "
                      r"result=completed", "the retried job's outcome")


async def test_arq_duplicate_delivery_two_live_workers_creates_nothing_twice(
        conn: Conn, job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        arq_redis: ArqRedis) -> None:
    """``enqueue_call`` refuses a second arq job for the same callwarden job; a host that
    enqueues one under another id gets two live workers on one call (one job each): both
    poll the one task and the fenced writes settle it once. SIGTERM then runs
    ``on_shutdown``, which closes each worker's runtime."""
    one, two = await queues.arq(), await queues.arq()
    assert await enqueue_call(arq_redis, job, KIND, REQUEST) is not None
    assert await enqueue_call(arq_redis, job, KIND, REQUEST) is None  # deduplicated
    await _poller(conn, job)
    assert await arq_redis.enqueue_job(ARQ_TASK, str(job), KIND, REQUEST, None,
                                       _job_id="by-another-id") is not None
    await _pollers(conn, job, 2)
    _finish_upstream(sim)
    await _exactly_once(conn, sim, job)
    results = set()
    for w in (one, two):
        done = await w.line(rf"job {job} kind={KIND} arq_job=\S+ try=1 pid={w.proc.pid} "
                            rf"result={BOTH}", "each worker's outcome")
        results.add(done[0].group(1))
        w.proc.send_signal(signal.SIGTERM)
    assert "completed" in results
    for w in (one, two):
        assert await w.exited() == 0, w.logs()
        assert f"process {w.proc.pid} closed" in w.logs()


async def test_arq_own_call_function_worker_killed_is_resumed_by_another_worker(
        conn: Conn, own_job: uuid.UUID, queues: Queues, sim: RunningSimulator,
        arq_redis: ArqRedis) -> None:
    """``own_call_function``: the host's own code runs in an arq worker that is SIGKILLed
    while it polls; once arq's in-progress key expires the other worker takes the job
    (try 2), is told ``resume``, and finishes the same prediction through the host's
    code: one create, committed once."""
    first = await queues.arq()
    # as the host's web process enqueues it: its worker module made the function, and
    # enqueue_own_call finds it by kind (never a task name or arq's job id by hand)
    own_call_function(own_host.KIND, own_host.predict, name="tests.predict")
    assert await enqueue_own_call(arq_redis, own_job, own_host.KIND, OWN_REQUEST) is not None
    assert await enqueue_own_call(arq_redis, own_job, own_host.KIND, OWN_REQUEST) is None
    dead = await _poller(conn, own_job)
    first.kill()
    assert await first.exited() == -9

    second = await queues.arq()
    resumed = await _poller(conn, own_job, other_than=dead, what="the second worker to poll")
    assert resumed.startswith("arq:")
    _finish_upstream(sim)
    await _own_completed_once(conn, sim, own_job)
    await second.line(rf"job {own_job} kind={own_host.KIND} arq_job=callwarden:{own_job} "
                      r"try=2 pid=\d+ result=completed", "the retried own job's outcome")
