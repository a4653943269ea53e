"""Admission control (issue 42): what a start costs with an account's limit, and what a
tenant's burst does to throughput and to the other tenants, side by side in one run.

Run: ``python bench/admission.py [--jobs 300] [--rounds 3] [--burst 60] [--others 4]``
(docs/benchmarks.md, "Admission control")

One Postgres (``DATABASE_URL`` or a throwaway embedded server), one fresh migrated
database.

**(a) The cost of a start.** Fresh jobs (inserted by plain SQL, as a host does: this
benchmark's statements are bench/admission.sql) are started, ``--jobs`` per writer and
round, by 1 or 8 connections, in alternating rounds so that the noise of a shared machine
falls on all alike; the rate is starts / summed round time. Between rounds, outside the
timing, every call started is cancelled, so a round starts with no call of the kind in
flight (and ends with ``--jobs``: admit's count grows with the calls in flight, which a
limit keeps small in production):

- ``raw-SQL floor``: a plain ``UPDATE jobs`` + ``INSERT INTO call_events`` in one statement
  (``floor3_start`` in bench/bench.sql), no fence but the version, no admission;
- ``append_start, raw``: the engine's start statement (``append_start``: the
  ``callwarden.admit`` CTE first, then the fenced update and the event) sent with
  parameters computed before the timing, with no limit row for the kind, then with one
  (``in_flight`` 1,000,000: it always admits, after locking the account and counting);
- ``append``: ``callwarden.database.write.append`` of a ``CallStarted`` (fold, encode, the
  same statement), with no limit row, with ``in_flight`` only, and with every cap
  (``in_flight``, ``tenant_in_flight``, ``creates`` per 1 s, all too large to refuse: the
  window's count reads the starts of the last second);
- ``append, refused``: a start over a full account (``in_flight`` 1, held by one call):
  what a wait costs (the refusal's ``callwarden.waiting`` row, and the re-read of the
  call the append makes when it did not write).

Each start is also timed on its own (the median, and the median's excess over the same
writer with no limit row). Round trips (``AsyncConnection.wait`` calls that send
something) and statements are counted on the client (``bench/counting.py``) and given
per start: the goal is that a limit adds none. ``--skip-burst`` runs (a) only.

**(b) A tenant's burst.** ``--burst`` jobs of one user, then ``--others`` of another,
queued in that order (the reference queue's order: oldest first), run by ``--workers``
asyncio workers through one ``CallRunner`` against the provider simulator on 127.0.0.1
(``kie-standard``, each task running ``--hold`` seconds upstream, polled every 0.05 s,
its media stored under a temp dir). A start the limits refuse goes back to the queue
after its ``retry_after_s`` plus up to a quarter (as the reference worker defers it).
Unlimited, then with ``tenant_in_flight = 2`` (``wait_s`` ``--wait``): wall time, jobs per
second, refusals, and when the other user's jobs started (seconds after the burst was
queued; "promptly": within ``--prompt`` s).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _common import SQL, fresh_database
from counting import CountingConnection, configure_counted
from psycopg.rows import dict_row
from rich.console import Console
from rich.table import Table

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, connect, open_pool
from callwarden.database.queries import QUERIES, load_queries
from callwarden.database.write import append, append_params, cancel
from callwarden.events import codec
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY, apply
from callwarden.providers.simulator.core import running_simulator
from callwarden.providers.storage import LocalFolderStore

KIND = "kie-standard"
ACCOUNT = "bench-account"
BIG = 1_000_000
ACTOR = "bench:admission"
#: This benchmark's own statements (bench/admission.sql).
LOAD = load_queries((Path(__file__).parent / "admission.sql").read_text(encoding="utf-8"))
#: The caps of a limit row, each a parameter of ``set_limit`` (``None``: unset).
CAPS = ("in_flight", "tenant_in_flight", "creates", "per_s", "wait_s")

# -- (a) the cost of a start ------------------------------------------------------------

Start = Callable[[Conn, uuid.UUID], Awaitable[None]]


@dataclass
class Writer:
    """One row of table (a): how it starts a job (``floor`` and ``raw`` send a statement
    with parameters computed before the timing; ``append`` and ``refused`` call
    ``append``), the limit row in place while it runs (``None``: none), and what it
    measured."""

    name: str
    how: str
    caps: dict[str, Any] | None
    seconds: dict[int, float] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    round_trips: dict[int, int] = field(default_factory=dict)
    statements: dict[int, Counter[str]] = field(default_factory=dict)
    latencies: dict[int, list[float]] = field(default_factory=dict)


def started(job: uuid.UUID) -> tuple[CallStarted, dict[str, Any]]:
    """The job's ``CallStarted`` and the start statement's parameters for it (computed
    before the timing by the raw writers; ``append`` computes its own)."""
    event = CallStarted(at=utcnow(), actor=ACTOR, kind=KIND, sync=False)
    _, _, payload = codec.encode(event)
    params = append_params(job, EMPTY, apply(EMPTY, event), [event])
    return event, {**params, "kind": KIND, "payload": payload.decode(), "actor": ACTOR}


def raw(how: str, precomputed: dict[uuid.UUID, dict[str, Any]]) -> Start:
    sql = SQL["floor3_start"] if how == "floor" else QUERIES["append_start"]

    async def start(conn: Conn, job: uuid.UUID) -> None:
        await conn.execute(sql, precomputed[job])
    return start


async def engine_start(conn: Conn, job: uuid.UUID) -> None:
    r = await append(conn, job, EMPTY, CallStarted(at=utcnow(), actor=ACTOR, kind=KIND,
                                                   sync=False))
    if not r.ok:
        raise RuntimeError(f"start of {job} not appended: {r.waiting}")


async def refused_start(conn: Conn, job: uuid.UUID) -> None:
    r = await append(conn, job, EMPTY, CallStarted(at=utcnow(), actor=ACTOR, kind=KIND,
                                                   sync=False))
    if r.ok or r.waiting is None:
        raise RuntimeError(f"start of {job} was not refused")


async def new_jobs(conn: Conn, n: int) -> list[uuid.UUID]:
    """``n`` pending jobs over 10 users, each with its reservation, inserted by plain SQL."""
    rows = await (await conn.execute(LOAD["new_jobs"], {"n": n})).fetchall()
    jobs = [r["id"] for r in rows]
    await conn.execute(LOAD["new_reservations"], {"jobs": jobs})
    return jobs


async def set_limit(conn: Conn, caps: dict[str, Any] | None) -> None:
    await conn.execute(LOAD["clear_limits"])
    if caps:
        unknown = sorted(set(caps) - set(CAPS))
        if unknown:
            raise ValueError(f"not a cap of a limit row: {', '.join(unknown)}")
        await conn.execute(LOAD["set_limit"], {"account": ACCOUNT, "kind": KIND,
                                               **{c: caps.get(c) for c in CAPS}})


async def end_all(conns: list[Conn]) -> None:
    """Cancel every open call of the kind (untimed): the next round starts with none."""
    rows = await (await conns[0].execute(LOAD["open_calls"], {"kind": KIND})).fetchall()
    jobs = [r["id"] for r in rows]

    async def part(conn: Conn, mine: list[uuid.UUID]) -> None:
        for job in mine:
            await cancel(conn, job, by=ACTOR, now=utcnow())
    await asyncio.gather(*(part(c, jobs[i::len(conns)]) for i, c in enumerate(conns)))


async def timed(conns: list[Conn], start: Start, jobs: list[uuid.UUID],
                latencies: list[float]) -> float:
    """The round's wall time; each start's own time appended to ``latencies``."""
    async def part(conn: Conn, mine: list[uuid.UUID]) -> None:
        for job in mine:
            began = time.perf_counter()
            await start(conn, job)
            latencies.append(time.perf_counter() - began)
    began = time.perf_counter()
    await asyncio.gather(*(part(c, jobs[i::len(conns)]) for i, c in enumerate(conns)))
    return time.perf_counter() - began


async def one_round(conns: list[Conn], w: Writer, n: int, *, record: bool = True) -> None:
    admin = conns[0]
    await set_limit(admin, w.caps)
    if w.how == "refused":  # the account's one slot, held by a call started before the timing
        [holder] = await new_jobs(admin, 1)
        await engine_start(admin, holder)
    jobs = await new_jobs(admin, n)
    start: Start
    if w.how in ("floor", "raw"):
        start = raw(w.how, {j: started(j)[1] for j in jobs})
    else:
        start = refused_start if w.how == "refused" else engine_start
    c = len(conns)
    CountingConnection.reset()
    latencies: list[float] = []
    seconds = await timed(conns, start, jobs, latencies)
    if record:
        w.latencies.setdefault(c, []).extend(latencies)
        w.seconds[c] = w.seconds.get(c, 0.0) + seconds
        w.starts[c] = w.starts.get(c, 0) + n
        w.round_trips[c] = w.round_trips.get(c, 0) + CountingConnection.round_trips
        w.statements.setdefault(c, Counter()).update(CountingConnection.statements)
    await set_limit(admin, None)
    await end_all(conns)


async def start_costs(url: str, n: int, rounds: int, warmup: int) -> list[Writer]:
    writers = [
        Writer("floor (UPDATE jobs + INSERT call_events)", "floor", None),
        Writer("raw append_start, no limit row", "raw", None),
        Writer("raw append_start, limit row (in_flight)", "raw", {"in_flight": BIG}),
        Writer("append, no limit row", "append", None),
        Writer("append, limit row (in_flight)", "append", {"in_flight": BIG}),
        Writer("append, limit row (every cap)", "append",
               {"in_flight": BIG, "tenant_in_flight": BIG, "creates": BIG, "per_s": 1.0}),
        Writer("append, refused (in_flight 1, held)", "refused", {"in_flight": 1}),
    ]
    for concurrency in (1, 8):
        conns: list[Conn] = [await CountingConnection.connect(
            url, autocommit=True, row_factory=dict_row) for _ in range(concurrency)]
        for conn in conns:
            await configure_counted(conn)
        try:
            for w in writers:  # warm-up: psycopg prepares each statement on every connection
                await one_round(conns, w, warmup, record=False)
            for r in range(rounds):
                for w in (writers if r % 2 == 0 else writers[::-1]):
                    await one_round(conns, w, n)
        finally:
            for conn in conns:
                await conn.close()
    return writers


def print_costs(console: Console, writers: list[Writer], n: int, rounds: int) -> None:
    table = Table(title=f"(a) a start: {n} starts x {rounds} rounds per writer and "
                        "concurrency (same Postgres, one run); each cell c=1 / c=8")
    for col in ("writer", "starts/s", "vs floor", "median µs / start",
                "+ median µs over no limit row", "round trips / start",
                "statements / start"):
        table.add_column(col, justify="right")
    floor = writers[0]
    plain = {w.how: w for w in writers if w.caps is None}
    plain["refused"] = plain["append"]

    def rate(w: Writer) -> dict[int, float]:
        return {c: w.starts[c] / w.seconds[c] for c in (1, 8)}

    def median_us(w: Writer) -> dict[int, float]:
        return {c: statistics.median(w.latencies[c]) * 1e6 for c in (1, 8)}

    def pair(values: dict[int, float], fmt: str) -> str:
        return " / ".join(format(values[c], fmt) for c in (1, 8))

    for w in writers:
        mine, base = rate(w), plain.get(w.how)
        extra = ({c: median_us(w)[c] - median_us(base)[c] for c in (1, 8)}
                 if base and w.caps else None)
        table.add_row(
            w.name, pair(mine, ",.0f"),
            pair({c: mine[c] / rate(floor)[c] for c in (1, 8)}, ".2f"),
            pair(median_us(w), ",.0f"), pair(extra, "+,.0f") if extra else "",
            pair({c: w.round_trips[c] / w.starts[c] for c in (1, 8)}, ".2f"),
            pair({c: sum(w.statements[c].values()) / w.starts[c] for c in (1, 8)}, ".2f"))
    console.print(table)
    refused = writers[-1]
    names = ", ".join(f"{k} {v / refused.starts[1]:.2f}"
                      for k, v in sorted(refused.statements[1].items()))
    console.print(f"a refused start's statements (c=1, per start): {names}")


# -- (b) a tenant's burst -----------------------------------------------------------------


@dataclass
class Burst:
    """One run of the burst: when each job started (its admitted start) and ended,
    seconds after the burst was queued, and the refusals."""

    label: str
    seconds: float = 0.0
    refusals: int = 0
    started: dict[uuid.UUID, float] = field(default_factory=dict)
    results: Counter[str] = field(default_factory=Counter)


async def burst_run(url: str, runner: CallRunner, label: str, caps: dict[str, Any] | None,
                    args: argparse.Namespace) -> tuple[Burst, list[uuid.UUID]]:
    request = {"model": "nano-banana-pro", "input": {"prompt": "burst", "_sim": {
        "steps": [{"phase": "running", "seconds": args.hold}], "end": "succeeded"}}}
    async with await connect(url) as conn:
        await set_limit(conn, caps)
        a = [await _job(conn, "tenant-a") for _ in range(args.burst)]
        b = [await _job(conn, "tenant-b") for _ in range(args.others)]
    # the queue: (not before, age, job); the oldest job that may run is taken first
    queue: list[tuple[float, int, uuid.UUID]] = [(0.0, age, j) for age, j in enumerate(a + b)]
    out = Burst(label)
    t0 = time.monotonic()
    running = 0

    async def worker() -> None:
        nonlocal running
        while queue or running:
            now = time.monotonic() - t0
            ready = [e for e in queue if e[0] <= now]
            if not ready:  # none may run yet, or a job in flight may come back waiting
                await asyncio.sleep(0.01)
                continue
            entry = min(ready, key=lambda e: e[1])
            queue.remove(entry)
            _, age, job = entry
            running += 1
            try:
                outcome = await runner.run(job, KIND, request)
            finally:
                running -= 1
            if outcome.result == "waiting":  # back in the queue, as the worker defers it
                out.refusals += 1
                delay = (outcome.retry_after_s or 1.0) * (1 + random.random() / 4)
                queue.append((time.monotonic() - t0 + delay, age, job))
                continue
            out.started[job] = now
            out.results[outcome.result] += 1

    await asyncio.gather(*(worker() for _ in range(args.workers)))
    out.seconds = time.monotonic() - t0
    async with await connect(url) as conn:
        await set_limit(conn, None)
    return out, b


async def _job(conn: Conn, user: str) -> uuid.UUID:
    row = await (await conn.execute(LOAD["burst_job"], {"user_id": user})).fetchone()
    assert row is not None
    await conn.execute(LOAD["burst_reservation"], {"job_id": row["id"], "user_id": user})
    return uuid.UUID(str(row["id"]))


async def bursts(url: str, args: argparse.Namespace) -> list[tuple[Burst, list[uuid.UUID]]]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="cw-admission-") as tmp:
        async with (running_simulator() as sim, aiohttp.ClientSession() as http,
                    open_pool(url, min_size=4, max_size=args.workers + 2) as pool,
                    CallRunner(pool, http, sim.settings, LocalFolderStore(Path(tmp)),
                               config=CallConfig(poll_interval_s={KIND: 0.05})) as runner):
            for label, caps in (("unlimited", None),
                                ("tenant_in_flight=2",
                                 {"tenant_in_flight": 2, "wait_s": args.wait})):
                runs.append(await burst_run(url, runner, label, caps, args))
    return runs


def print_bursts(console: Console, runs: list[tuple[Burst, list[uuid.UUID]]],
                 args: argparse.Namespace) -> None:
    table = Table(title=f"(b) a burst of {args.burst} jobs of one user, then {args.others} of "
                        f"another; {args.workers} workers, tasks of {args.hold:g} s upstream")
    for col in ("limit", "wall s", "jobs/s", "results", "refusals",
                "the other user's starts, s after the burst", f"within {args.prompt:g} s"):
        table.add_column(col, justify="right")
    for run, others in runs:
        b_starts = sorted(run.started[j] for j in others)
        prompt = sum(1 for s in b_starts if s <= args.prompt)
        n = sum(run.results.values())
        table.add_row(run.label, f"{run.seconds:.2f}", f"{n / run.seconds:.1f}",
                      ", ".join(f"{k} {v}" for k, v in sorted(run.results.items())),
                      str(run.refusals), ", ".join(f"{s:.2f}" for s in b_starts),
                      f"{prompt} of {len(others)}")
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=300, help="(a) starts per writer and round")
    ap.add_argument("--rounds", type=int, default=3, help="(a) alternating rounds")
    ap.add_argument("--warmup", type=int, default=20, help="(a) starts per writer first")
    ap.add_argument("--burst", type=int, default=60, help="(b) one user's jobs")
    ap.add_argument("--others", type=int, default=4, help="(b) the other user's jobs")
    ap.add_argument("--workers", type=int, default=8, help="(b) concurrent workers")
    ap.add_argument("--hold", type=float, default=0.2, help="(b) seconds a task runs upstream")
    ap.add_argument("--wait", type=float, default=0.5, help="(b) the limit's wait_s")
    ap.add_argument("--prompt", type=float, default=1.0,
                    help="(b) a start within this many seconds is prompt")
    ap.add_argument("--skip-burst", action="store_true", help="run (a) only")
    args = ap.parse_args()
    console = Console(width=160)
    with fresh_database("bench_admission") as url:
        writers = asyncio.run(start_costs(url, args.jobs, args.rounds, args.warmup))
        runs = [] if args.skip_burst else asyncio.run(bursts(url, args))
    print_costs(console, writers, args.jobs, args.rounds)
    if runs:
        print_bursts(console, runs, args)

if __name__ == "__main__":
    main()
