"""Guards the mutation check found missing (``tests/mutations/``, issue 14 item 5): each test
fails, fast, under one deliberate bug no other default-run test caught quickly.

* ``settle-cas-dropped``: the settle's compare-and-set on ``status = 'reserved'``, re-checked
  on the row the append locks. A reservation the host settles while the append waits on
  its row lock must not be moved again. The wait is observed in ``pg_locks`` (the append's
  backend has a lock request not granted), not assumed after a sleep.
* ``live-lease-taken-over``: a second finalizer must never take over a live finalization
  lease. The first finalizer's download is held by the test; if the second one took over,
  its own download would arrive, which the test watches for instead of waiting out a
  timeout.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Conn, Pool, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.types import CallStarted, Cancelled
from callwarden.providers.storage import LocalFolderStore
from tests.support.leases import CONFIG, HeldMedia, LogicalClock, settings_for, succeeded_call

T0 = datetime(2026, 5, 19, 12, tzinfo=UTC)


async def _waiting_on_a_lock(conn: Conn, pid: int) -> None:
    """Return once backend ``pid`` waits for a lock: Postgres shows that only in pg_locks,
    so it is polled (the condition is the signal; nothing here waits out a time)."""
    query = "SELECT count(*) AS n FROM pg_locks WHERE pid = %s AND NOT granted"
    while True:
        row = await (await conn.execute(query, (pid,))).fetchone()
        if row is not None and row["n"]:
            return
        await asyncio.sleep(0.005)


async def test_a_reservation_the_host_settles_while_the_append_waits_is_not_moved_again(
        conn: Conn, db_url: str) -> None:
    """Invariant: a refund racing the host's own commit of the same reservation moves it
    at most once. The host's UPDATE holds the row; the cancel's append (fenced on the
    settled count it read, still 0 in its snapshot) waits on that row; the host commits;
    the append's settle re-checks ``status = 'reserved'`` on the committed row and moves
    nothing: the event is recorded, the reservation stays as the host left it."""
    job = await create_job(conn, credits=10)
    started = await append(conn, job, await load(conn, job),
                           CallStarted(at=T0, actor="w", kind="kie-standard"))
    host, writer = await connect(db_url), await connect(db_url)
    async with host, writer:
        async with host.transaction():
            await host.execute(
                "UPDATE usage_logs SET status = 'committed', credits_charged = 10, "
                "settled_at = now() WHERE job_id = %s", (job,))
            cancel = asyncio.create_task(append(writer, job, started.projection, Cancelled(
                at=T0, actor="user:1", by="user:1")))
            await _waiting_on_a_lock(conn, writer.info.backend_pid)
        result = await cancel
    assert result.ok
    assert result.settlement == "already_settled"
    rows = await (await conn.execute(
        "SELECT status, credits_charged, settled_by_seq FROM usage_logs WHERE job_id = %s",
        (job,))).fetchall()
    assert [(r["status"], float(r["credits_charged"]), r["settled_by_seq"]) for r in rows] == [
        ("committed", 10.0, None)]
    assert [type(e).__name__ for e in await load_events(conn, job)] == [
        "CallStarted", "Cancelled"]


async def test_a_live_finalization_lease_is_never_taken_over(
        conn: Conn, pool: Pool, held: HeldMedia, tmp_path: Path) -> None:
    """Invariant: while a finalizer's lease is live (its download still running, the
    logical clock inside the lease), another finalizer is told ``not_claimable`` and
    never downloads; the first then completes with the only claim."""
    clock = LogicalClock(T0)
    job = await succeeded_call(conn, f"{held.url}/a.png", clock())
    store = LocalFolderStore(tmp_path)
    first = Finalizer(pool, store, settings_for(held), owner="worker:a", clock=clock,
                      config=CONFIG)
    second = Finalizer(pool, store, settings_for(held), owner="reconciler:b", clock=clock,
                       config=CONFIG)
    holding = asyncio.create_task(first.finalize(job))
    await held.wait_for(1)
    clock.advance(CONFIG.lease_for(1) - 1)  # one second before the lease ends
    other = asyncio.create_task(second.finalize(job))
    took_over = asyncio.create_task(held.wait_for(2))
    done, _ = await asyncio.wait({other, took_over}, return_when=asyncio.FIRST_COMPLETED)
    if took_over in done:  # the second finalizer is downloading: it took the live lease
        for answer in held.pending:
            answer.set_result(503)
        await asyncio.gather(holding, other, return_exceptions=True)
        raise AssertionError("a live finalization lease was taken over")
    took_over.cancel()
    assert other.result().outcome == "not_claimable"
    held.pending[0].set_result(200)
    assert (await holding).outcome == "completed"
    kinds = [type(e).__name__ for e in await load_events(conn, job)]
    assert kinds.count("FinalizeClaimed") == 1
    assert kinds[-1] == "Completed"
