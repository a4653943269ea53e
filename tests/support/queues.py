"""Helpers of the queue tests: real Celery and arq worker processes, the conditions the
acceptance tests wait on, and a statement caught waiting for a lock the test holds (the
Redis fixtures are in ``tests/acceptance/conftest.py``).

A worker runs in its own process group (its main process and its pool children), its
output in a file per process; every process started here is killed (by its own group id)
at teardown if it is still running."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from arq.connections import ArqRedis
from celery import Celery

from callwarden.database.citus import on_citus
from callwarden.database.db import Conn
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.queue.arq import enqueue_call
from callwarden.queue.celery import TASK_NAME as CELERY_TASK
from callwarden.replay.verify import verify, verify_job

__all__ = ["DEADLINE_S", "QueueWorker", "Queues", "blocked_on_a_lock", "completed_once",
           "rooted", "send_celery_task", "until", "value"]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 40.0


def rooted(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the checkout's root first on ``PYTHONPATH`` (the test apps,
    ``tests.acceptance.celery_app``...), the path the tests were given kept after it: the
    mutation check runs the tests in a copy whose ``callwarden`` is on that path, and a
    worker that lost it would import the editable install's, not the mutant's."""
    given = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), given]))}


class QueueWorker:
    """One worker process (its own process group: the main process and its pool
    children) and its log."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc, self.log = proc, log

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole group, as a lost host: nothing runs a shutdown hook."""
        os.killpg(self.proc.pid, signal.SIGKILL)

    async def exited(self, timeout_s: float = DEADLINE_S) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout=timeout_s)
        except TimeoutError:
            pytest.fail(f"worker {self.proc.pid} still running:\n{self.logs()}")

    async def line(self, pattern: str, what: str, count: int = 1,
                   deadline_s: float = DEADLINE_S) -> list[re.Match[str]]:
        """The first ``count`` log lines matching ``pattern``, waiting for them."""
        deadline = time.monotonic() + deadline_s
        while len(found := list(re.finditer(pattern, self.logs()))) < count:
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.logs()}"
            await asyncio.sleep(0.05)
        return found[:count]


class Queues:
    """Starts Celery and arq workers with ``env`` (the database, the simulator, Redis and
    whatever the test sets), each logging to a file in ``tmp_path``."""

    def __init__(self, env: Mapping[str, str], tmp_path: Path) -> None:
        self.env, self.tmp_path = dict(env), tmp_path
        self.started: list[QueueWorker] = []

    async def _start(self, args: Sequence[str]) -> QueueWorker:
        log = self.tmp_path / f"queue-worker-{len(self.started) + 1}.log"
        env = rooted(self.env)
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *args, env=env, cwd=ROOT,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)
        worker = QueueWorker(proc, log)
        self.started.append(worker)
        return worker

    async def celery(self, name: str, *, concurrency: int = 2) -> QueueWorker:
        return await self._start([
            "celery", "-A", "tests.acceptance.celery_app", "worker", "--pool", "prefork",
            "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-mingle",
            "--without-gossip", "--without-heartbeat", "-n", f"{name}@%h"])

    async def arq(self) -> QueueWorker:
        return await self._start(["arq", "tests.acceptance.arq_app.WorkerSettings"])

    async def kill_leftovers(self) -> None:
        for w in self.started:
            if w.proc.returncode is None:
                w.kill()
                await w.proc.wait()


async def value(conn: Conn, sql: str, *params: Any) -> Any:
    """The first column of the first row (``None`` without a row)."""
    row = await (await conn.execute(sql, params)).fetchone()
    return None if row is None else next(iter(row.values()))


async def until(what: str, check: Callable[[], Awaitable[Any]], *,
                deadline_s: float = DEADLINE_S) -> Any:
    """Await ``check()`` until it is truthy (bounded); its value."""
    deadline = time.monotonic() + deadline_s
    while not (found := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return found


async def send_call(queue: str, job: uuid.UUID, kind: str, request: Mapping[str, Any],
                    arq_redis: ArqRedis, redis_url: str) -> str:
    """``job`` sent to ``queue`` (``arq`` or Celery) as a host's web process sends it; how
    its worker's lines name the delivery (a regex)."""
    if queue == "arq":
        assert await enqueue_call(arq_redis, job, kind, request) is not None
        return rf"arq_job=callwarden:{job} try=\d+"
    await send_celery_task(redis_url, job, kind, request, task_id=f"t-{job}")
    return rf"task=t-{job} redelivered=\w+"


async def send_celery_task(redis_url: str, job: uuid.UUID, kind: str,
                           request: Mapping[str, Any], task_id: str) -> None:
    """Publish the task as a host's web process would (blocking kombu, off the loop)."""
    producer = Celery("callwarden-test-producer", broker=redis_url)
    try:
        await asyncio.to_thread(producer.send_task, CELERY_TASK,
                                args=[str(job), kind, dict(request)], task_id=task_id)
    finally:
        producer.close()


SETTLING = ["Completed", "UpstreamFailed", "Swept", "Exhausted", "Cancelled"]


async def completed_once(conn: Conn, sim: RunningSimulator, job: uuid.UUID, *,
                         provider: str = "kie") -> None:
    """The job's completed call: one upstream create at ``provider``, its reservation
    committed by one settling event and one audited move from ``reserved`` (the
    ``demo_audit_trigger``), one asset, and projections equal to the log."""
    assert sim.sim.journal.count(provider, "create") == 1
    row = await (await conn.execute(
        "SELECT j.call_state,"
        " (SELECT array_agg(u.status) FROM usage_logs u WHERE u.job_id = j.id) AS credits,"
        " (SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id AND e.type = "
        "ANY(%s))"
        "   AS settlements,"
        " (SELECT count(*) FROM demo_usage_audit a WHERE a.job_id = j.id) AS moves,"
        " (SELECT count(*) FROM demo_usage_audit a WHERE a.job_id = j.id"
        "   AND a.old_status <> 'reserved') AS bad_moves,"
        " (SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j WHERE j.id = %s", (SETTLING, job))).fetchone()
    assert row is not None
    assert dict(row) == {"call_state": "completed", "credits": ["committed"],
                         "settlements": 1, "moves": 1, "bad_moves": 0, "assets": 1}
    summary, _ = await verify(conn)
    assert (summary.jobs, summary.mismatches, summary.errors) == (1, 0, 0)
    assert await verify_job(conn, job) == []


async def blocked_on_a_lock(conn: Conn, task: asyncio.Task[Any], *,
                            timeout_s: float = 10.0) -> None:
    """Wait until ``task`` is done, or until a session of ``conn``'s database waits for a
    lock (the task's statement queued behind a transaction the test holds open): the
    condition polled on ``pg_stat_activity``, bounded."""
    deadline = time.monotonic() + timeout_s
    citus = await on_citus(conn)  # the wait is on a worker node: Citus' own view sees it
    sql = ("SELECT count(*) AS n FROM citus_lock_waits" if citus else
           "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
           "AND wait_event_type = 'Lock'")
    while not task.done():
        row = await (await conn.execute(sql)).fetchone()
        if row is not None and row["n"] > 0:
            return
        assert time.monotonic() < deadline, "the task neither ended nor waited for a lock"
        await asyncio.sleep(0.01)
