"""Does Postgres plan the append statements once (a generic plan) or at every execution?

Run: ``python bench/plan_cache.py [--jobs 200] [--rounds 3]``

For each prepared statement the engine's appends use (``append_start``, ``append_event``
and ``append_completion``, once prepared by psycopg), Postgres either keeps custom plans
(planned at every execution, with the parameters' values) or switches to one generic plan
after five executions when it costs no more (``plan_cache_mode = auto``). The first table
counts, per statement, the generic and custom plans one connection used over ``--jobs``
lifecycles (``pg_prepared_statements``). The second times the same lifecycles (``append``,
five transitions each) under ``auto``, ``force_custom_plan`` and ``force_generic_plan``,
the three modes alternating in each round, and prints the median transitions/s per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from _common import SQL, fresh_database
from append import engine_op, make_jobs
from rich.console import Console
from rich.table import Table

from callwarden.database.db import connect

MODES = ("auto", "force_custom_plan", "force_generic_plan")


async def plan_counts(url: str, jobs: list[uuid.UUID]) -> Table:
    table = Table(title=f"plans per prepared append statement, {len(jobs)} lifecycles")
    for col in ("statement", "generic plans", "custom plans"):
        table.add_column(col, justify="right" if col != "statement" else "left")
    async with await connect(url) as conn:
        for job in jobs:
            await engine_op(conn, job)
        rows = await (await conn.execute(SQL["plan_counts"])).fetchall()
    for row in rows:
        table.add_row(row["shape"], str(row["generic_plans"]), str(row["custom_plans"]))
    return table


async def timed(url: str, jobs: list[uuid.UUID], mode: str) -> float:
    async with await connect(url) as conn:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        start = time.perf_counter()
        for job in jobs:
            await engine_op(conn, job)
        return len(jobs) * 5 / (time.perf_counter() - start)


async def run(url: str, n: int, rounds: int) -> list[Table]:
    counts = await plan_counts(url, await make_jobs(url, n))
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        order = MODES[r % 3:] + MODES[:r % 3]  # each mode first once in three rounds
        for mode in order:
            rates[mode].append(await timed(url, await make_jobs(url, n), mode))
    table = Table(title=f"append, {n} lifecycles x 5 transitions, one connection, "
                        f"{rounds} rounds alternating")
    for col in ("plan_cache_mode", "transitions/s (median)", "each round"):
        table.add_column(col, justify="right")
    for mode in MODES:
        table.add_row(mode, f"{statistics.median(rates[mode]):,.0f}",
                      " ".join(f"{x:,.0f}" for x in rates[mode]))
    return [counts, table]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with fresh_database("plans") as url:
        tables = asyncio.run(run(url, args.jobs, args.rounds))
    for t in tables:
        Console().print(t)


if __name__ == "__main__":
    main()
