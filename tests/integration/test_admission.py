"""Admission control in the database (migration 0018, issue 42): a provider account's limits,
written as rows of ``callwarden.limits`` by plain SQL, are held by every start, the Python
write path's (``append`` of a ``CallStarted``) and the host API's (``start_call``) alike,
across connections; a refused start writes nothing but its ``callwarden.waiting`` row, and
a slot is the open call itself, freed by the transition that ends it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, connect
from callwarden.database.write import append, cancel, load
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY
from callwarden.replay.verify import verify_job

KIND = "kie-standard"


async def one(conn: Conn, sql: str, *args: Any) -> dict[str, Any]:
    cur = await conn.execute(sql, args)
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def new_job(conn: Conn, user: str = "u1") -> uuid.UUID:
    row = await one(conn, "SELECT callwarden.create_job(%s, 10::numeric) AS id", user)
    return uuid.UUID(str(row["id"]))


async def limit(conn: Conn, **caps: Any) -> None:
    cols = ", ".join(caps)
    marks = ", ".join(["%s"] * len(caps))
    await conn.execute(f"INSERT INTO callwarden.limits (account, kinds, {cols}) "
                       f"VALUES ('kie-main', ARRAY['{KIND}', 'kie-veo'], {marks})",
                       tuple(caps.values()))


async def py_start(conn: Conn, job: uuid.UUID, kind: str = KIND) -> Any:
    return await append(conn, job, EMPTY, CallStarted(at=utcnow(), actor="py:1", kind=kind,
                                                      sync=False))


async def sql_start(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    return await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", job, KIND)


async def events_of(conn: Conn, job: uuid.UUID) -> int:
    return int((await one(conn, "SELECT count(*) AS n FROM callwarden.call_events "
                                "WHERE job_id = %s", job))["n"])


async def test_a_full_account_refuses_both_starts_and_the_end_of_a_call_frees_its_slot(
        conn: Conn) -> None:
    """Two calls in flight over a cap of 2 (one started by Python, one by SQL): a third
    start is refused by both paths with the limit named, writes no event and leaves the
    row at version 0, and is recorded as waiting; once one call ends (a cancel, refunded)
    the third is admitted and its waiting row is gone."""
    await limit(conn, in_flight=2)
    a, b, c = [await new_job(conn) for _ in range(3)]
    assert (await py_start(conn, a)).ok
    assert (await sql_start(conn, b))["action"] == "create"

    refused = await py_start(conn, c)
    assert not refused.ok
    assert refused.waiting is not None
    assert refused.waiting.reason == "kie-main: 2 of 2 calls in flight"
    assert refused.waiting.retry_after_s == 2.0
    assert (await sql_start(conn, c))["action"] == "wait"
    why = await one(conn, "SELECT * FROM callwarden.waiting_for(%s)", c)
    assert why["reason"] == "kie-main: 2 of 2 calls in flight"
    assert 0 < why["retry_after_s"] <= 2
    row = await one(conn, "SELECT account, refusals FROM callwarden.waiting WHERE job_id = %s", c)
    assert row == {"account": "kie-main", "refusals": 2}
    assert await events_of(conn, c) == 0
    assert (await load(conn, c)).state is None

    assert (await cancel(conn, a, by="admin", now=utcnow())).ok
    assert (await py_start(conn, c)).ok
    assert (await one(conn, "SELECT count(*) AS n FROM callwarden.waiting"))["n"] == 0
    for job in (a, b, c):
        assert await verify_job(conn, job) == []


async def test_a_kind_no_limit_names_is_never_refused(conn: Conn) -> None:
    """A cap of 1 on kie-main's kinds does not count nor refuse another kind's calls."""
    await limit(conn, in_flight=1)
    first, other = await new_job(conn), await new_job(conn)
    assert (await py_start(conn, first)).ok
    assert (await py_start(conn, other, kind="replicate-prediction")).ok


async def test_one_user_cannot_take_every_slot_of_the_account(conn: Conn) -> None:
    """A per-user cap of 1 within an account of 3: u1's second start waits, naming the
    user's share, while u2 starts."""
    await limit(conn, in_flight=3, tenant_in_flight=1)
    u1a, u1b, u2 = await new_job(conn, "u1"), await new_job(conn, "u1"), await new_job(conn, "u2")
    assert (await py_start(conn, u1a)).ok
    refused = await py_start(conn, u1b)
    assert refused.waiting is not None
    assert refused.waiting.reason == "kie-main: this user holds 1 of 1 calls in flight"
    assert (await py_start(conn, u2)).ok
    again = [(await py_start(conn, u1b)).waiting for _ in range(5)]
    # each refusal of the user's job waits twice as long, to 16 wait_s: its backlog comes
    # back ever more rarely and the queue reaches other users' jobs
    assert [w.retry_after_s for w in again if w is not None] == [4.0, 8.0, 16.0, 32.0, 32.0]


async def test_the_creates_per_window_wait_for_the_oldest_to_leave_the_window(
        conn: Conn) -> None:
    """2 creates per 60 s: the third start waits until the first start is 60 s old (a
    retry time within the window, not the limit's fixed wait), though no call is open."""
    await limit(conn, creates=2, per_s=60.0)
    jobs = [await new_job(conn) for _ in range(3)]
    for job in jobs[:2]:
        assert (await py_start(conn, job)).ok
        assert (await cancel(conn, job, by="admin", now=utcnow())).ok  # ended: no slot held
    refused = await py_start(conn, jobs[2])
    assert refused.waiting is not None
    assert refused.waiting.reason == "kie-main: 2 creates in 60 s"
    assert 50 < refused.waiting.retry_after_s <= 60.25  # (the window's quarter second more)
    await conn.execute("UPDATE jobs SET provider_call_started_at = now() - interval '61 s' "
                       "WHERE id = ANY(%s)", (jobs[:2],))
    assert (await py_start(conn, jobs[2])).ok


async def test_concurrent_starts_on_many_connections_never_exceed_the_cap(
        db_url: str, conn: Conn) -> None:
    """Twelve starts at once, each on its own connection, half through Python and half
    through start_call, over a cap of 3: exactly 3 calls are open after, the other 9 wait
    (a start counts every start committed before it took the account's lock)."""
    await limit(conn, in_flight=3)
    jobs = [await new_job(conn) for _ in range(12)]
    conns = [await connect(db_url) for _ in jobs]
    try:
        async def start(i: int, c: Conn) -> bool:
            if i % 2:
                return bool((await py_start(c, jobs[i])).ok)
            return bool((await sql_start(c, jobs[i]))["action"] == "create")
        started = await asyncio.gather(*(start(i, c) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    assert sum(started) == 3
    open_calls = await one(conn, "SELECT count(*) AS n FROM jobs WHERE call_state = 'created'")
    waiting = await one(conn, "SELECT count(*) AS n FROM callwarden.waiting")
    assert (open_calls["n"], waiting["n"]) == (3, 9)


async def test_a_started_call_delivered_again_is_not_refused_by_a_full_account(
        conn: Conn) -> None:
    """A second delivery of a started call (the account full, its own call among those
    counted) is told what the call needs, never to wait: resume through the host API, the
    re-read projection through Python."""
    await limit(conn, in_flight=1)
    job = await new_job(conn)
    assert (await sql_start(conn, job))["action"] == "create"
    await one(conn, "SELECT * FROM callwarden.task_created(%s, 'task-1', 'node:1')", job)
    again = await py_start(conn, job)
    assert not again.ok
    assert again.waiting is None
    assert again.projection.state is not None
    assert (await sql_start(conn, job))["action"] == "resume"


async def test_a_refusal_clears_the_accounts_waiting_rows_of_jobs_that_stopped_asking(
        conn: Conn) -> None:
    """A waiting row whose retry time passed over ten minutes ago (its job ended or its
    queue gave it up) is deleted by the account's next refusal; a recent one stays."""
    await limit(conn, in_flight=1)
    held, refused, gone, recent = [await new_job(conn) for _ in range(4)]
    await conn.execute(
        "INSERT INTO callwarden.waiting (job_id, account, reason, since, retry_at) VALUES "
        "(%s, 'kie-main', 'old', now() - interval '3 h', now() - interval '2 h'), "
        "(%s, 'kie-main', 'recent', now() - interval '1 min', now() - interval '5 min')",
        (gone, recent))
    assert (await py_start(conn, held)).ok
    assert (await py_start(conn, refused)).waiting is not None
    cur = await conn.execute("SELECT job_id FROM callwarden.waiting ORDER BY since")
    assert [r["job_id"] for r in await cur.fetchall()] == [recent, refused]


async def test_a_job_the_host_ended_is_not_told_to_wait(conn: Conn) -> None:
    """A full account and a job the host failed by SQL: neither start tells it to wait
    (start_call: not_started; Python: not started, no waiting row), so no queue defers a
    job that can never start."""
    await limit(conn, in_flight=1)
    held, ended = await new_job(conn), await new_job(conn)
    assert (await py_start(conn, held)).ok
    await conn.execute("UPDATE jobs SET status = 'failed' WHERE id = %s", (ended,))
    refused = await py_start(conn, ended)
    assert not refused.ok
    assert refused.waiting is None
    assert (await sql_start(conn, ended))["action"] == "not_started"
    assert (await one(conn, "SELECT count(*) AS n FROM callwarden.waiting"))["n"] == 0


async def test_a_start_at_repeatable_read_is_refused_with_a_clear_error(conn: Conn) -> None:
    """Under REPEATABLE READ the counts would miss starts committed since the transaction
    began: admit refuses such a start (0A000, naming the isolation), writing nothing."""
    await limit(conn, in_flight=1)
    job = await new_job(conn)
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
        await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                           (job, KIND))
    await conn.execute("ROLLBACK")
    assert await events_of(conn, job) == 0
