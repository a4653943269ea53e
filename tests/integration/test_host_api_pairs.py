"""The host API against the Python write path on every pair: each function a host calls
(``start_call``, ``task_created``, ``heartbeat``, ``succeeded``, ``failed``,
``not_found``, ``cancel``), taken on a call in every state callwarden's own Python
actors can leave it in, each also with the host's own terminal status written over it by
plain SQL first. Not sampled: every (state, host status, step) is taken.

The functions' legality, projection and settlement are rendered from the declaration
(test_declared_sql.py, test_apply_event.py). What this adds: after every pair, the row
the whole function leaves equals the Python fold of the log (``verify_job``: columns,
status and settlement), and a cancel decides as Python's ``cancel`` does on a twin job."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.write import append, cancel, load
from callwarden.events.types import (
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    HostEnded,
    ReconcileAttempted,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.replay.verify import verify_job

KIND = "kie-standard"
Make = Callable[[datetime, str], Event]  # (now, the job's task id)


def _started(at: datetime, _: str) -> Event:
    return CallStarted(at=at, actor="py", kind=KIND)


def _task(at: datetime, task: str) -> Event:
    return TaskCreated(at=at, actor="py", task_id=task)


def _succeeded(at: datetime, _: str) -> Event:
    return UpstreamSucceeded(at=at, actor="py", result=UpstreamResult(media_urls=("u",)))


def _claimed(at: datetime, _: str) -> Event:
    return FinalizeClaimed(at=at, actor="py", owner="py", lease_until=at + timedelta(minutes=5))


def _lapsed(at: datetime, _: str) -> Event:
    return FinalizeClaimed(at=at - timedelta(minutes=10), actor="py", owner="py",
                           lease_until=at - timedelta(minutes=5))


#: How callwarden's Python actors leave a call: the events, appended by the write path.
#: ``host_completed`` first needs the host's status on the row (HostEnded is fenced on it).
PATHS: dict[str, list[Make]] = {
    "no call": [],
    "created": [_started],
    "polling": [_started, _task],
    "adopted": [lambda at, task: Adopted(at=at, actor="py", kind=KIND, task_id=task)],
    "upstream_succeeded": [_started, _task, _succeeded],
    "finalizing": [_started, _task, _succeeded, _claimed],
    "finalizing, lease lapsed": [_started, _task, _succeeded, _lapsed],
    "completed": [_started, _task, _succeeded, _claimed,
                  lambda at, _: Completed(at=at, actor="py", cost=0.5, text="t")],
    "failed": [_started, _task, lambda at, _: UpstreamFailed(at=at, actor="py", error="e")],
    "swept": [_started, lambda at, _: Swept(at=at, actor="py")],
    "retried": [_started, _task,
                lambda at, _: ReconcileAttempted(at=at, actor="py", outcome="running",
                                              next_attempt_at=at + timedelta(minutes=1))],
    "exhausted": [_started, _task, lambda at, _: Exhausted(at=at, actor="py", attempts=9)],
    "cancelled": [_started, lambda at, _: Cancelled(at=at, actor="py", by="py")],
    "host_completed": [_started, _task,
                       lambda at, _: HostEnded(at=at, actor="py", status="completed")],
}
#: The host's own word written over the row by plain SQL after the path (None: none),
#: fenced as docs/node.md tells a host to (never over an ended job).
HOST_STATUS = [None, "completed", "failed", "cancelled"]
STEPS = {
    "start": "SELECT * FROM callwarden.start_call(%(job)s, 'kie-standard', 'node:1')",
    "start, recreate": "SELECT * FROM callwarden.start_call(%(job)s, 'kie-standard', 'node:1', "
                       "false, true)",
    "start, sync": "SELECT * FROM callwarden.start_call(%(job)s, 'kie-standard', 'node:1', "
                   "true)",
    "start, another kind": "SELECT * FROM callwarden.start_call(%(job)s, 'replicate', "
                           "'node:1')",
    "task, the job's id": "SELECT * FROM callwarden.task_created(%(job)s, %(task)s, 'node:1')",
    "task, another id": "SELECT * FROM callwarden.task_created(%(job)s, %(other)s, 'node:1')",
    "heartbeat": "SELECT callwarden.heartbeat(%(job)s, 'node:1', 40)",
    "succeeded": "SELECT * FROM callwarden.succeeded(%(job)s, 'node:1', "
                 "'[{\"key\": \"k/0\", \"url\": \"/m/k/0\", \"content_type\": \"image/png\", "
                 "\"size\": 3}]', 'hi', 0.25, '{\"media_urls\": [\"u\"]}')",
    "succeeded, no cost": "SELECT * FROM callwarden.succeeded(%(job)s, 'node:1')",
    "failed": "SELECT * FROM callwarden.failed(%(job)s, 'node:1', 'boom', 'E1')",
    "not_found": "SELECT * FROM callwarden.not_found(%(job)s, 'node:1')",
    "cancel": "SELECT * FROM callwarden.cancel(%(job)s, 'user:1')",
}
#: The refusals a step may end in (typed, nothing written): another task id than the
#: job holds, a call of another kind.
TYPED = {None, "CW001", "CW002"}
CREDITS = Decimal("10")


async def _job_at(conn: Conn, path: list[Make], host_status: str | None) -> uuid.UUID | None:
    """A job with a reservation, left by Python's write path as ``path`` says, then the
    host's status; ``None`` when the host could not write it (the call has ended)."""
    cur = await conn.execute("SELECT callwarden.create_job('u1', %s) AS id", (CREDITS,))
    row = await cur.fetchone()
    assert row is not None
    job = uuid.UUID(str(row["id"]))
    now = utcnow()
    for make in path:
        event = make(now, f"t-{job}")
        if isinstance(event, HostEnded):
            await conn.execute("UPDATE jobs SET status = %s WHERE id = %s",
                               (event.status, job))
        result = await append(conn, job, await load(conn, job), event)
        assert result.ok, (path, event, result)
    if host_status is not None:
        cur = await conn.execute(
            "UPDATE jobs SET status = %s WHERE id = %s AND status IN ('pending', "
            "'processing') RETURNING id", (host_status, job))
        if await cur.fetchone() is None:
            return None
    return job


async def _usage(conn: Conn, job: uuid.UUID) -> list[tuple[str, Decimal | None]]:
    cur = await conn.execute("SELECT status, credits_charged FROM usage_logs "
                             "WHERE job_id = %s", (job,))
    return [(r["status"], r["credits_charged"]) for r in await cur.fetchall()]


async def _take(conn: Conn, sql: str, job: uuid.UUID) -> str | None:
    try:
        await conn.execute(sql, {"job": job, "task": f"t-{job}", "other": f"o-{job}"})
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


@pytest.mark.parametrize("step", sorted(STEPS))
async def test_every_state_and_host_status_under_one_step_matches_the_fold(
        conn: Conn, step: str) -> None:
    """Invariant, for every (state, host status) pair under ``step``: the step is taken or
    refused with a typed error; the row equals the Python fold of the log after it; the
    reservation is settled at most once and never charged above what was reserved; and a
    step on a call Python ended leaves its log and settlement as they were."""
    wrong: list[str] = []
    pairs = 0
    for name, path in PATHS.items():
        for host_status in HOST_STATUS:
            job = await _job_at(conn, path, host_status)
            if job is None:
                continue
            pairs += 1
            before = await load(conn, job)
            usage_before = await _usage(conn, job)
            refused = await _take(conn, STEPS[step], job)
            where = f"{name} / host {host_status}: "
            if refused not in TYPED:
                wrong.append(f"{where}refused {refused}")
            problems = await verify_job(conn, job)
            if problems:
                wrong.append(f"{where}{problems}")
            usage = await _usage(conn, job)
            status, charged = usage[0]
            if status not in ("reserved", "committed", "refunded") or (
                    charged is not None and charged > CREDITS):
                wrong.append(f"{where}usage {usage}")
            if before.terminal and before.settlement != "host" and (
                    usage != usage_before or (await load(conn, job)).version
                    != before.version):
                wrong.append(f"{where}an ended call was written to")
    assert pairs == len(PATHS) * len(HOST_STATUS) - 6 * 3  # 6 paths end the call
    assert wrong == []


async def test_a_cancel_decides_as_pythons_cancel_in_every_state(conn: Conn) -> None:
    """Invariant: ``callwarden.cancel`` and the Python write path's ``cancel``, each on its
    own job left in the same (state, host status), end in the same state, with the same
    events appended and the same settlement of the reservation."""
    wrong: list[str] = []
    for name, path in PATHS.items():
        for host_status in HOST_STATUS:
            sql_job = await _job_at(conn, path, host_status)
            py_job = await _job_at(conn, path, host_status)
            if sql_job is None or py_job is None:
                continue
            await _take(conn, STEPS["cancel"], sql_job)
            await cancel(conn, py_job, by="user:1", now=utcnow())
            got = []
            for job in (sql_job, py_job):
                p = await load(conn, job)
                cur = await conn.execute("SELECT type FROM callwarden.call_events "
                                         "WHERE job_id = %s ORDER BY seq", (job,))
                got.append((p.state, p.status, p.settlement,
                            [r["type"] for r in await cur.fetchall()],
                            [s for s, _ in await _usage(conn, job)]))
            if got[0] != got[1]:
                wrong.append(f"{name} / host {host_status}: sql {got[0]} python {got[1]}")
    assert wrong == []
