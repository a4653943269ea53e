"""A single node versus the Citus cluster, on the same server and the same cores.

Run: ``python bench/citus.py [--jobs 240] [--rounds 4]`` with ``DATABASE_URL`` (or
``CALLWARDEN_CITUS_URL``) at a Citus coordinator (``bash .ci/citus start DIR`` makes one:
a coordinator and two workers on 127.0.0.1).

Two databases on that coordinator's server: ``single`` (plain tables, no extension: one
node, as any Postgres) and ``cluster`` (made on every node, the tables distributed over
both workers by ``callwarden migrate``). The same happy async lifecycle as
``bench/lifecycle.py`` (``CallRunner.run`` on ``kie-standard``: create, one ``running``
poll, success, 256-byte media stored, the asset row and the committed reservation), N jobs
shared by 1 or 8 asyncio tasks over a pool of 8, in alternating rounds. Per call: the
client's transactions (``bench/counting.py``); on the cluster the
transactions the workers ran (``pg_stat_database`` on each worker, read once the stats
are flushed: an estimate, each worker flushes at most once a second) and the commits
that were two-phase (rows ``pg_dist_transaction`` gained: one per worker prepared).

Every node runs on the same two cores here, so the ratio is what distribution costs, not
what it buys: on separate machines each worker brings its own cores, disk and WAL. The
remote commands of each transition are counted by
``tests/integration/test_citus.py::test_each_transition_goes_to_the_jobs_one_worker_without_two_phase_commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from _common import SQL
from counting import CountingConnection
from lifecycle import POOL_SIZE, counting_pool, make_jobs, make_runner, run_callwarden, timed
from psycopg.conninfo import make_conninfo
from rich.console import Console
from rich.table import Table

from callwarden.calls.runner import CallRunner
from callwarden.database.databases import cluster_workers, create_database, drop_database
from callwarden.database.db import connect
from callwarden.database.migrate import migrate
from callwarden.providers.simulator.core import running_simulator

CONCURRENCY = (1, 8)


@dataclass
class Cell:
    seconds: float = 0.0
    jobs: int = 0
    client_xacts: int = 0
    worker_xacts: int = 0
    prepared: int = 0

    def per_call(self, value: float) -> str:
        return f"{value / self.jobs:.2f}"


@dataclass
class Target:
    name: str
    url: str
    workers: list[str]  # the workers' URLs for this database (none: one node)

    async def worker_xacts(self) -> int:
        await asyncio.sleep(1.2)  # each backend flushes its stats at most once a second
        total = 0
        for url in self.workers:
            async with await connect(url) as conn:
                row = await (await conn.execute(SQL["stats_own_transactions"])).fetchone()
                total += int(row["n"]) if row else 0
        return total

    async def prepared(self) -> int:
        if not self.workers:
            return 0
        async with await connect(self.url) as conn:
            row = await (await conn.execute(SQL["citus_prepared"])).fetchone()
        return int(row["n"]) if row else 0


async def one_round(target: Target, runner: CallRunner, pool_jobs: list[uuid.UUID],
                    concurrency: int, into: Cell) -> None:
    xacts, prepared = await target.worker_xacts(), await target.prepared()
    CountingConnection.reset()
    into.seconds += await timed(lambda j: run_callwarden(runner, j), pool_jobs, concurrency)
    into.jobs += len(pool_jobs)
    into.client_xacts += CountingConnection.transactions
    into.worker_xacts += await target.worker_xacts() - xacts
    into.prepared += await target.prepared() - prepared


async def measure(targets: list[Target], args: argparse.Namespace
                  ) -> dict[tuple[str, int], Cell]:
    cells = {(t.name, c): Cell() for t in targets for c in CONCURRENCY}
    with tempfile.TemporaryDirectory(prefix="cw-bench-citus-") as tmp:
        async with (running_simulator() as sim, aiohttp.ClientSession() as http,
                    AsyncExitStack() as stack):
            pools = [await stack.enter_async_context(counting_pool(t.url))
                     for t in targets]
            runners = [make_runner(p, http, sim.settings, Path(tmp, t.name))
                       for p, t in zip(pools, targets, strict=True)]
            for runner, pool in zip(runners, pools, strict=True):  # warm-up
                for job in await make_jobs(pool, 5 * POOL_SIZE):
                    await run_callwarden(runner, job)
            size = args.jobs // args.rounds
            for c in CONCURRENCY:
                for _ in range(args.rounds):
                    for target, runner, pool in zip(targets, runners, pools, strict=True):
                        jobs = await make_jobs(pool, size)
                        await one_round(target, runner, jobs, c, cells[(target.name, c)])
    return cells


def report(console: Console, cells: dict[tuple[str, int], Cell]) -> None:
    jobs = cells[("single", 1)].jobs
    table = Table(title=f"happy async calls, one node vs the Citus cluster ({jobs} jobs per "
                        "cell, alternating rounds, all nodes on the same cores)")
    table.add_column("")
    for c in CONCURRENCY:
        for name in ("single", "cluster"):
            table.add_column(f"{name} c={c}", justify="right")
    order = [(n, c) for c in CONCURRENCY for n in ("single", "cluster")]
    table.add_row("calls/s", *(f"{cells[k].jobs / cells[k].seconds:,.0f}" for k in order))
    table.add_row("client transactions/call",
                  *(cells[k].per_call(cells[k].client_xacts) for k in order))
    table.add_row("worker transactions/call (estimate)",
                  *(cells[k].per_call(cells[k].worker_xacts) if k[0] == "cluster" else "-"
                    for k in order))
    table.add_row("two-phase participants/call",
                  *(cells[k].per_call(cells[k].prepared) if k[0] == "cluster" else "-"
                    for k in order))
    console.print(table)
    for c in CONCURRENCY:
        single, cluster = cells[("single", c)], cells[("cluster", c)]
        ratio = (cluster.jobs / cluster.seconds) / (single.jobs / single.seconds)
        console.print(f"c={c}: the cluster runs {ratio:.2f}x the single node's calls/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=240, help="jobs per cell")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per cell")
    args = ap.parse_args()
    admin = os.environ.get("DATABASE_URL") or os.environ.get("CALLWARDEN_CITUS_URL")
    workers = cluster_workers(admin) if admin else []
    if not admin or not workers:
        sys.exit("bench/citus.py needs DATABASE_URL at a Citus coordinator with workers "
                 "(bash .ci/citus start DIR prints one)")
    tag = uuid.uuid4().hex[:8]
    single, cluster = f"bench_single_{tag}", f"bench_cluster_{tag}"
    targets = [Target("single", create_database(admin, single, cluster=False), []),
               Target("cluster", create_database(admin, cluster),
                      [make_conninfo(admin, host=h, port=p, dbname=cluster)
                       for h, p in workers])]
    try:
        for t in targets:
            asyncio.run(_migrate(t.url))
        cells = asyncio.run(measure(targets, args))
    finally:
        drop_database(admin, single)
        drop_database(admin, cluster)
    report(Console(), cells)


async def _migrate(url: str) -> None:
    async with await connect(url) as conn:
        await migrate(conn)


if __name__ == "__main__":
    main()
