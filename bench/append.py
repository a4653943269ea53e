"""State changes committed per second: raw SQL floor vs callwarden's append vs eventsourcing.

Run: ``python bench/append.py [--jobs 1000] [--fold-events 1000000]``

All three write to the same Postgres with the same settings, in one run:
- ``floor (3 statements)``: the INSERT event + UPDATE jobs + settlement UPDATE sent by
  psycopg in one explicit transaction, parameters precomputed, no engine logic;
- ``floor (1 statement)``: the engine's own single CTE statement with precomputed
  parameters (what the engine would cost with zero Python work);
- ``callwarden append``: ``callwarden.database.write.append`` — fold, encode, one statement;
- ``eventsourcing``: the ``eventsourcing`` library (a ``bench`` extra) saving one event per
  aggregate, from threads (it is a synchronous library).
Each job goes through five state changes (the last one settles its reservation).
Also measures decode + fold of N events in process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import SQL, conninfo_parts, fresh_database
from rich.console import Console
from rich.table import Table

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.queries import QUERIES
from callwarden.database.write import append, append_params
from callwarden.events import codec
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    FinalizeClaimed,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import EMPTY, CallProjection, apply, fold

T0 = datetime(2026, 11, 30, tzinfo=UTC)
Op = Callable[[Conn, uuid.UUID], Awaitable[None]]


def lifecycle(job: uuid.UUID) -> list[Event]:
    return [
        CallStarted(at=T0, actor="bench", kind="kie-standard"),
        TaskCreated(at=T0, actor="bench", task_id=f"t-{job}"),
        UpstreamSucceeded(at=T0, actor="bench", result=UpstreamResult(
            media_urls=("https://tempfile.example/r/a.png",), cost=2.0)),
        FinalizeClaimed(at=T0, actor="bench", owner="bench",
                        lease_until=T0 + timedelta(minutes=1)),
        Completed(at=T0, actor="bench", cost=2.0),
    ]


def precomputed(job: uuid.UUID) -> list[dict[str, Any]]:
    """The append statement's parameters for each event, computed before timing."""
    out, p = [], EMPTY
    for e in lifecycle(job):
        new = apply(p, e)
        params = append_params(job, p, new, [e])
        # the 3-statement floor inserts one event: its columns as scalars
        kind, version, payload = codec.encode(e)
        params.update(type=kind, event_version=version, payload=payload.decode(),
                      actor=e.actor)
        out.append(params)
        p = new
    return out


async def engine_op(conn: Conn, job: uuid.UUID) -> None:
    p: CallProjection = EMPTY
    for e in lifecycle(job):
        r = await append(conn, job, p, e)
        assert r.ok
        p = r.projection


def cte_op(pre: dict[uuid.UUID, list[dict[str, Any]]]) -> Op:
    async def op(conn: Conn, job: uuid.UUID) -> None:
        for params in pre[job]:
            name = ("append_start" if params["is_start"] else "append_event"
                    if params["settle_to"] is not None else "append_move")
            await conn.execute(QUERIES[name], params)
    return op


def three_statement_op(pre: dict[uuid.UUID, list[dict[str, Any]]]) -> Op:
    async def op(conn: Conn, job: uuid.UUID) -> None:
        for params in pre[job]:
            async with conn.transaction():
                await conn.execute(SQL["floor_insert_event"], params)
                await conn.execute(SQL["floor_update_projection"], params)
                if params["settle_to"]:
                    await conn.execute(SQL["floor_settle"], params)
    return op


async def make_jobs(url: str, n: int) -> list[uuid.UUID]:
    async with await connect(url) as conn:
        return [await create_job(conn, credits=5) for _ in range(n)]


async def run_mode(url: str, op: Op, jobs: list[uuid.UUID], concurrency: int) -> float:
    conns = [await connect(url) for _ in range(concurrency)]
    shards = [jobs[i::concurrency] for i in range(concurrency)]

    async def worker(conn: Conn, mine: list[uuid.UUID]) -> None:
        for job in mine:
            await op(conn, job)

    start = time.perf_counter()
    await asyncio.gather(*(worker(c, s) for c, s in zip(conns, shards, strict=True)))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    return len(jobs) * 5 / elapsed


_ES_APP: Any = None


def _es_app(url: str, concurrency: int) -> Any:
    """One eventsourcing application (its aggregate class is defined once per process)."""
    global _ES_APP
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate

    parts = conninfo_parts(url)
    os.environ.update({
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": parts["dbname"], "POSTGRES_HOST": parts.get("host", "127.0.0.1"),
        "POSTGRES_PORT": parts.get("port", "5432"), "POSTGRES_USER": parts.get("user", "postgres"),
        "POSTGRES_PASSWORD": parts.get("password", "x"),
        "POSTGRES_POOL_SIZE": "8", "POSTGRES_MAX_OVERFLOW": "2",
    })
    if _ES_APP is None:
        class Call(Aggregate):  # type: ignore[misc, unused-ignore]
            def __init__(self, kind: str) -> None:
                self.kind = kind

        _ES_APP = (Application(), Call)
    return _ES_APP


def eventsourcing_rate(url: str, n_events: int, concurrency: int) -> float | None:
    try:
        app, call_cls = _es_app(url, concurrency)
    except ImportError:
        return None
    per_thread = n_events // concurrency
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(per_thread):
                app.save(call_cls("kie-standard"))
        except BaseException as exc:  # reported below: a crashed thread voids the figure
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"eventsourcing threads failed: {errors[0]!r}")
    return per_thread * concurrency / (time.perf_counter() - start)


def fold_rate(n_events: int) -> float:
    job = uuid.uuid4()
    stored = [codec.encode(e) for e in lifecycle(job)]
    histories = n_events // len(stored)
    start = time.perf_counter()
    for _ in range(histories):
        fold([codec.decode(name, v, payload) for name, v, payload in stored])
    return histories * len(stored) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=800, help="jobs per mode and concurrency")
    ap.add_argument("--fold-events", type=int, default=1_000_000)
    args = ap.parse_args()
    console = Console()
    results: dict[str, dict[int, float | None]] = {}
    with fresh_database("bench_append") as url:
        for conc in (1, 8):
            jobs = {m: asyncio.run(make_jobs(url, args.jobs))
                    for m in ("floor3", "floor1", "engine")}
            pre = {j: precomputed(j) for m in ("floor3", "floor1") for j in jobs[m]}
            results.setdefault("floor (3 statements, 1 tx)", {})[conc] = asyncio.run(
                run_mode(url, three_statement_op(pre), jobs["floor3"], conc))
            results.setdefault("floor (1 statement)", {})[conc] = asyncio.run(
                run_mode(url, cte_op(pre), jobs["floor1"], conc))
            results.setdefault("callwarden append", {})[conc] = asyncio.run(
                run_mode(url, engine_op, jobs["engine"], conc))
            results.setdefault("eventsourcing (1 event/aggregate)", {})[conc] = (
                eventsourcing_rate(url, args.jobs * 5, conc))
    floor = results["floor (3 statements, 1 tx)"]
    table = Table(title="state changes committed per second (same Postgres, one run)")
    for col in ("writer", "c=1", "c=8", "vs floor c=1", "vs floor c=8"):
        table.add_column(col, justify="right")
    for name, by_c in results.items():
        cells = [f"{by_c[c]:,.0f}" if by_c[c] else "n/a" for c in (1, 8)]
        ratios = [f"{(by_c[c] or 0) / (floor[c] or 1):.2f}x" for c in (1, 8)]
        table.add_row(name, *cells, *ratios)
    console.print(table)
    es = results["eventsourcing (1 event/aggregate)"]
    ours = results["callwarden append"]
    for c in (1, 8):
        theirs = es[c]
        if theirs:
            console.print(f"callwarden / eventsourcing at c={c}: {(ours[c] or 0) / theirs:.2f}x")
    console.print(f"decode + fold in process: {fold_rate(args.fold_events):,.0f} events/s "
                  f"({args.fold_events:,} events)")


if __name__ == "__main__":
    main()
