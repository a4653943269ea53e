"""What one Postgres can carry of callwarden's work, measured from the server itself.

Run: ``python bench/capacity.py [--calls 2000] [--call-seconds 60] [--prefill 0]``

On a fresh database (``DATABASE_URL``'s server, or a throwaway embedded one), with the
provider simulator in process (``kie-standard``, 256-byte media in a ``LocalFolderStore``),
each call is the engine's real write path, as in bench/lifecycle.py: ``create_job`` (the
job row and its reservation), then ``CallRunner.run`` (CallStarted, TaskCreated, the polls,
UpstreamSucceeded, FinalizeClaimed, Completed with the asset rows and the commit of the
reservation), no wait between polls (a no-op sleep), over one pool of 8 connections. Three
measured windows, each after an untimed warm-up on the same pool (so psycopg has prepared
its statements):

- ``c=1`` and ``c=8``: ``--calls`` calls shared by 1 or 8 asyncio tasks; one ``running``
  poll per call, which writes no heartbeat (the runner beats every 10 s at most);
- ``heartbeats``: a quarter as many calls at c=8, each polled ``--beats`` times ``running``
  with a heartbeat on every poll (``heartbeat_every_s`` ~0), for the cost of one beat.

Around each window, from Postgres: the bench database's committed transactions
(``pg_stat_database.xact_commit``, once every pooled backend has flushed its stats with
``pg_stat_force_next_flush()``, the flushing statements subtracted; read from the server's
``postgres`` database), the WAL written (``pg_wal_lsn_diff`` of ``pg_current_wal_lsn()``;
with ``pg_stat_wal``'s records and full-page images; all three are cluster-wide, so other
databases' writes on a shared server land in them, and so does autovacuum), the on-disk
size of ``jobs``, ``call_events``, ``usage_logs`` and ``assets`` with their indexes
(``pg_total_relation_size``), and rows inserted and updated (HOT or not).

``--prefill N`` first COPYs N terminal five-event histories (bench/replay.py's) into the
tables, vacuums them, and issues a ``CHECKPOINT`` before each window: then the first
change to each page in a window writes the whole page to the WAL (a full-page image), as
on tables much larger than what one checkpoint interval touches. The default (small, fresh
tables, no checkpoint in the window) is the cheap end.

Then the commit rate: ``callwarden.database.write.append`` (the transition statement, one
transaction each), 1 and 8 connections, as bench/append.py measures it. Below the table,
the capacity that follows: calls/s = commit rate at c=8 / transactions per call, per day,
the WAL and table growth at that rate, the connections it keeps busy, and the same for a
``--call-seconds`` call that heartbeats every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _common import SQL, conninfo_parts, fresh_database
from append import engine_op, make_jobs, run_mode
from psycopg.conninfo import make_conninfo
from replay import histories
from replay import load as load_histories
from rich.console import Console
from rich.table import Table

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.postgres import PostgresDatabase
from callwarden.providers.base import ProviderSettings
from callwarden.providers.simulator.core import running_simulator
from callwarden.providers.storage import LocalFolderStore

KIND = "kie-standard"
POOL_SIZE = 8
TABLES = ("jobs", "call_events", "usage_logs", "assets")
HEARTBEAT_EVERY_S = CallConfig().heartbeat_every_s  # the default a worker runs with
DAY = 86_400
POLL_INTERVAL_S = 1e-6  # no wait between polls (the sleep is a no-op; it must be > 0)
SETTINGS = ("server_version", "data_checksums", "full_page_writes", "wal_compression",
            "synchronous_commit", "shared_buffers", "checkpoint_timeout", "max_wal_size",
            "max_connections")


def request(running_polls: int) -> dict[str, Any]:
    script = {"steps": [{"phase": "running", "polls": running_polls}], "end": "succeeded"}
    return {"model": "nano-banana-pro", "input": {"prompt": "bench", "_sim": script}}


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


# -- what Postgres says ------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    commits: int
    rollbacks: int
    lsn: str
    wal_records: int
    wal_fpi: int


@dataclass(frozen=True)
class TableStats:
    bytes: int
    inserted: int
    updated: int
    hot_updated: int


@dataclass
class Server:
    pool: Pool
    admin: str  # the same server's "postgres" database: reading there adds nothing here
    name: str

    async def counters(self) -> Counters:
        """The bench database's transactions and the WAL position, once every pooled
        backend has flushed its pending stats (each flush is one transaction of its own,
        counted in what this returns)."""
        async with AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(self.pool.connection())
                     for _ in range(POOL_SIZE)]
            for conn in conns:
                await conn.execute(SQL["stats_force_flush"])
        async with await connect(self.admin) as conn:
            await conn.execute(SQL["stats_clear_snapshot"])
            row = (await (await conn.execute(SQL["capacity_counters"],
                                             {"name": self.name})).fetchall())[0]
        return Counters(commits=int(row["commits"]), rollbacks=int(row["rollbacks"]),
                        lsn=str(row["lsn"]), wal_records=int(row["wal_records"]),
                        wal_fpi=int(row["wal_fpi"]))

    async def wal_bytes(self, before: Counters, after: Counters) -> int:
        async with await connect(self.admin) as conn:
            rows = await (await conn.execute(SQL["capacity_wal_bytes"], {
                "before": before.lsn, "after": after.lsn})).fetchall()
        return int(rows[0]["bytes"])

    async def checkpoint(self) -> None:
        async with await connect(self.admin) as conn:
            await conn.execute(SQL["capacity_checkpoint"])

    async def settings(self) -> str:
        async with await connect(self.admin) as conn:
            rows = await (await conn.execute(SQL["capacity_settings"],
                                             {"names": list(SETTINGS)})).fetchall()
        return ", ".join(f"{r['name']}={r['setting']}{r['unit'] or ''}" for r in rows)

    async def tables(self) -> dict[str, TableStats]:
        async with self.pool.connection() as conn:
            await conn.execute(SQL["stats_clear_snapshot"])
            rows = await (await conn.execute(SQL["capacity_tables"],
                                             {"names": list(TABLES)})).fetchall()
        return {r["name"]: TableStats(bytes=int(r["bytes"]), inserted=int(r["inserted"]),
                                      updated=int(r["updated"]),
                                      hot_updated=int(r["hot_updated"])) for r in rows}


# -- the work ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    label: str
    runner: CallRunner
    request: dict[str, Any]
    calls: int
    concurrency: int
    beats: int  # heartbeats per call


async def one_call(phase: Phase) -> uuid.UUID:
    """A complete call: the host's create_job (job row + reservation), then the runner."""
    db = phase.runner.db
    assert isinstance(db, PostgresDatabase)
    async with db.pool.connection() as conn:
        job = await create_job(conn, credits=5)
    out = await phase.runner.run(job, KIND, phase.request)
    if out.result != "completed":
        raise RuntimeError(f"job {job} ended {out.result}: {out.detail}")
    return job


async def drive(phase: Phase, calls: int) -> tuple[float, list[uuid.UUID]]:
    """Seconds to run ``calls`` calls shared by ``phase.concurrency`` tasks."""
    queue = iter(range(calls))
    done: list[uuid.UUID] = []

    async def worker() -> None:
        for _ in queue:
            done.append(await one_call(phase))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(phase.concurrency)))
    return time.perf_counter() - start, done


@dataclass
class Window:
    phase: Phase
    seconds: float
    commits: int
    rollbacks: int
    wal_bytes: int
    wal_records: int
    wal_fpi: int
    before: dict[str, TableStats]
    after: dict[str, TableStats]

    @property
    def calls(self) -> int:
        return self.phase.calls

    def per_call(self, value: float) -> float:
        return value / self.calls

    def grew(self, table: str) -> int:
        return self.after[table].bytes - self.before[table].bytes

    def delta(self, table: str, field: str) -> int:
        return int(getattr(self.after[table], field)) - int(getattr(self.before[table], field))

    @property
    def bytes_per_call(self) -> dict[str, float]:
        return {t: self.per_call(self.grew(t)) for t in TABLES}


async def measure_window(server: Server, phase: Phase, warmup: int,
                         checkpoint: bool) -> Window:
    await drive(phase, warmup)
    if checkpoint:
        await server.checkpoint()
    await server.counters()  # flush the warm-up's stats before reading the tables
    before_tables = await server.tables()
    before = await server.counters()
    seconds, jobs = await drive(phase, phase.calls)
    after = await server.counters()
    after_tables = await server.tables()
    async with server.pool.connection() as conn:
        done = await (await conn.execute(SQL["count_completed"], {"ids": jobs})).fetchall()
    if int(done[0]["n"]) != phase.calls:
        raise RuntimeError(f"{phase.label}: {done[0]['n']} of {phase.calls} calls completed")
    return Window(
        phase=phase, seconds=seconds,
        commits=after.commits - before.commits - POOL_SIZE,  # the flushes after the window
        rollbacks=after.rollbacks - before.rollbacks,
        wal_bytes=await server.wal_bytes(before, after),
        wal_records=after.wal_records - before.wal_records,
        wal_fpi=after.wal_fpi - before.wal_fpi,
        before=before_tables, after=after_tables)


def make_runner(pool: Pool, http: aiohttp.ClientSession, settings: ProviderSettings,
                media: Path, *, heartbeat_every_s: float) -> CallRunner:
    return CallRunner(pool, http, settings, LocalFolderStore(media), sleep=no_sleep,
                      config=CallConfig(poll_interval_s={KIND: POLL_INTERVAL_S},
                                        heartbeat_every_s=heartbeat_every_s))


async def measure_calls(url: str, args: argparse.Namespace) -> tuple[list[Window], str]:
    server_admin = make_conninfo(url, dbname="postgres")
    name = conninfo_parts(url)["dbname"]
    with tempfile.TemporaryDirectory(prefix="cw-bench-media-") as tmp:
        async with (running_simulator() as sim, aiohttp.ClientSession() as http,
                    open_pool(url, min_size=POOL_SIZE, max_size=POOL_SIZE) as pool):
            await pool.wait(timeout=30)
            server = Server(pool=pool, admin=server_admin, name=name)
            plain = make_runner(pool, http, sim.settings, Path(tmp),
                                heartbeat_every_s=HEARTBEAT_EVERY_S)
            beating = make_runner(pool, http, sim.settings, Path(tmp),
                                  heartbeat_every_s=1e-9)
            phases = [
                Phase("c=1", plain, request(1), args.calls, 1, 0),
                Phase("c=8", plain, request(1), args.calls, 8, 0),
                Phase(f"c=8, {args.beats} heartbeats/call", beating, request(args.beats),
                      max(8, args.calls // 4), 8, args.beats),
            ]
            windows = [await measure_window(server, p, args.warmup, args.prefill > 0)
                       for p in phases]
            return windows, await server.settings()


async def prefill(url: str, n: int) -> float:
    """COPY ``n`` terminal histories in, vacuum and analyse them; seconds taken."""
    start = time.perf_counter()
    await load_histories(url, list(histories(n)))
    async with await connect(url) as conn:
        await conn.execute(SQL["capacity_vacuum"])
    return time.perf_counter() - start


async def commit_rates(url: str, jobs: int) -> dict[int, float]:
    """Transitions (= transactions) per second of ``append``, as bench/append.py runs it."""
    rates = {}
    for conc in (1, 8):
        ids = await make_jobs(url, jobs)
        rates[conc] = await run_mode(url, engine_op, ids, conc)
    return rates


# -- the report --------------------------------------------------------------------------


def si(value: float) -> str:
    """Bytes in decimal units (as disks are sold): 1_234_567 -> "1.23 MB"."""
    for prefix in ("", "k", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{value:,.2f} {prefix}B" if prefix else f"{value:,.0f} B"
        value /= 1000
    return f"{value:,.2f} PB"


def measured_table(windows: list[Window], rates: Mapping[int, float], probe: int,
                   prefilled: int) -> Table:
    where = (f"on {prefilled:,} prefilled histories, CHECKPOINT before each window"
             if prefilled else "fresh tables")
    table = Table(title="one Postgres, callwarden's work per call (create_job + an async "
                        f"call), measured on the server ({where})")
    table.add_column("")
    for w in windows:
        table.add_column(w.phase.label, justify="right")

    def row(label: str, cell: Any) -> None:
        table.add_row(label, *(cell(w) for w in windows))

    row("calls measured", lambda w: f"{w.calls:,}")
    row("calls/s (wall clock)", lambda w: f"{w.calls / w.seconds:,.0f}")
    row("transactions committed / call", lambda w: f"{w.per_call(w.commits):.2f}")
    row("transactions rolled back / call", lambda w: f"{w.per_call(w.rollbacks):.2f}")
    row("server commits/s in the window", lambda w: f"{w.commits / w.seconds:,.0f}")
    row("events / call", lambda w: f"{w.per_call(w.delta('call_events', 'inserted')):.2f}")
    row("jobs row updates / call (HOT)", lambda w: (
        f"{w.per_call(w.delta('jobs', 'updated')):.2f} "
        f"({w.delta('jobs', 'hot_updated') / max(1, w.delta('jobs', 'updated')):.0%})"))
    row("WAL bytes / call", lambda w: f"{w.per_call(w.wal_bytes):,.0f}")
    row("WAL records / call", lambda w: f"{w.per_call(w.wal_records):.1f}")
    row("WAL full-page images / call", lambda w: f"{w.per_call(w.wal_fpi):.2f}")
    for t in TABLES:
        row(f"on disk / call: {t} (+ indexes)", lambda w, t=t: f"{w.bytes_per_call[t]:,.0f} B")
    row("on disk / call: all four", lambda w: f"{sum(w.bytes_per_call.values()):,.0f} B")
    table.caption = (f"commit rate, append (one transition = one statement = one "
                     f"transaction), {probe:,} jobs x 5: {rates[1]:,.0f}/s on 1 connection, "
                     f"{rates[8]:,.0f}/s on 8")
    return table


def capacity_table(windows: list[Window], rates: Mapping[int, float],
                   call_seconds: float, prefilled: int) -> Table:
    plain, beating = windows[1], windows[2]
    beats = int(call_seconds // HEARTBEAT_EVERY_S)
    per_beat_tx = (beating.per_call(beating.commits) - plain.per_call(plain.commits)) / \
        beating.phase.beats
    per_beat_wal = (beating.per_call(beating.wal_bytes) - plain.per_call(plain.wal_bytes)) / \
        beating.phase.beats
    rate = rates[8]
    busy = rate / rates[1]  # Little: commits/s x the time one commit takes alone
    table = Table(title=f"capacity of this Postgres at its measured commit rate "
                        f"({rate:,.0f} transactions/s, 8 connections)")
    for col in ("", "as measured (no heartbeat)",
                f"a {call_seconds:g} s call ({beats} heartbeats)"):
        table.add_column(col, justify="right")
    cols: list[dict[str, str]] = []
    for tx, wal, seconds in (
            (plain.per_call(plain.commits), plain.per_call(plain.wal_bytes), None),
            (plain.per_call(plain.commits) + beats * per_beat_tx,
             plain.per_call(plain.wal_bytes) + beats * per_beat_wal, call_seconds)):
        calls_s = rate / tx
        day = calls_s * DAY
        events = plain.per_call(plain.delta("call_events", "inserted"))
        cols.append({
            "transactions / call": f"{tx:.2f}",
            "calls/s": f"{calls_s:,.0f}",
            "calls/day": f"{day / 1e6:,.1f} M",
            "WAL/day": si(day * wal),
            "call_events rows/day": f"{day * events / 1e6:,.1f} M",
            "call_events growth/day": si(day * plain.bytes_per_call["call_events"]),
            "all four tables, growth/day":
                si(day * sum(plain.bytes_per_call.values())),
            "connections busy (rate x 1-connection commit time)": f"{busy:.1f}",
            "calls in flight (none holds a connection)":
                f"{calls_s * seconds:,.0f}" if seconds else "-",
        })
    for key in cols[0]:
        table.add_row(key, *(c[key] for c in cols))
    table.caption = (f"one heartbeat, measured: {per_beat_tx:.2f} transactions, "
                     f"{per_beat_wal:,.0f} WAL bytes"
                     + (" (high: after a CHECKPOINT the smaller heartbeat window pays its "
                        "first page touches over fewer calls)" if prefilled else "")
                     + "; table growth is before any retention")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=2000, help="calls per concurrency")
    ap.add_argument("--warmup", type=int, default=48,
                    help="untimed calls before each window (>= 5 per pooled connection, so "
                         "psycopg has prepared every statement)")
    ap.add_argument("--beats", type=int, default=4,
                    help="heartbeats per call in the heartbeat window")
    ap.add_argument("--probe-jobs", type=int, default=600,
                    help="jobs (x 5 transitions) per connection count for the commit rate")
    ap.add_argument("--call-seconds", type=float, default=60.0,
                    help="a real call's duration for the derived heartbeat column")
    ap.add_argument("--prefill", type=int, default=0,
                    help="terminal histories loaded first (then a CHECKPOINT per window)")
    args = ap.parse_args()
    console = Console()
    with fresh_database("bench_capacity") as url:
        if args.prefill:
            seconds = asyncio.run(prefill(url, args.prefill))
            console.print(f"prefilled {args.prefill:,} histories ({args.prefill * 5:,} "
                          f"events) in {seconds:.1f} s, not timed")
        windows, settings = asyncio.run(measure_calls(url, args))
        rates = asyncio.run(commit_rates(url, args.probe_jobs))
    console.print(measured_table(windows, rates, args.probe_jobs, args.prefill))
    console.print(capacity_table(windows, rates, args.call_seconds, args.prefill))
    console.print(f"server: {settings}")


if __name__ == "__main__":
    main()
