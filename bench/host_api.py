"""The host API, this release's against an earlier one's, side by side in one run.

Run: ``python bench/host_api.py [--jobs 200] [--rounds 12] [--before 16]``

Two databases on one server (``DATABASE_URL``, or an embedded one in a temp dir): one
migrated only up to ``--before`` (the host functions as that release wrote them), one
migrated to the newest. Each runs the five calls a Node worker makes for a happy async
call (``create_job``, ``start_call``, ``task_created``, ``heartbeat``, ``succeeded`` with a
result, an asset and a cost), one connection, autocommit, in alternating rounds so that
noise falls on both. Prints each step's milliseconds and the whole call's, the median of
the rounds, and the ratio of the two sides.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _common import SQL, fresh_database, postgres
from rich.console import Console
from rich.table import Table

from callwarden.database.db import Conn, connect
from callwarden.database.migrate import available

MEDIA = '[{"key": "k/0", "url": "/m/k/0", "content_type": "image/png", "size": 3}]'
RESULT = '{"media_urls": ["u"], "cost": 2.5}'


STEPS = ("host_create_job", "host_start_call", "host_task_created", "host_heartbeat",
         "host_succeeded")


async def one_call(conn: Conn, spent: dict[str, float]) -> None:
    """The five steps, each one's time added to ``spent``."""
    job: object = None
    for step in STEPS:
        params = {"job": job, "task": f"t-{job}", "media": MEDIA, "result": RESULT}
        start = time.perf_counter()
        cur = await conn.execute(SQL[step], params)
        row = await cur.fetchone()
        spent[step] += time.perf_counter() - start
        if job is None:
            assert row is not None
            job = row["id"]


async def round_ms(url: str, jobs: int) -> dict[str, float]:
    """Milliseconds per call of each step, and of all five (``"call"``)."""
    spent = dict.fromkeys(STEPS, 0.0)
    async with await connect(url) as conn:
        for _ in range(jobs):
            await one_call(conn, spent)
    out = {step: s / jobs * 1000 for step, s in spent.items()}
    return {**out, "call": sum(out.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200, help="calls per round")
    ap.add_argument("--rounds", type=int, default=12, help="alternating rounds per side")
    ap.add_argument("--before", type=int, default=16, help="the earlier release's last migration")
    args = ap.parse_args()
    newest = available()[-1].version
    with postgres() as admin, \
            fresh_database("bench_host", admin=admin, upto=args.before) as before, \
            fresh_database("bench_host", admin=admin) as new:
        urls = {args.before: before, newest: new}
        for url in urls.values():
            asyncio.run(round_ms(url, args.jobs // 2))  # warm-up
        times: dict[int, list[dict[str, float]]] = {v: [] for v in urls}
        for r in range(args.rounds):
            for version in (sorted(urls) if r % 2 == 0 else sorted(urls, reverse=True)):
                times[version].append(asyncio.run(round_ms(urls[version], args.jobs)))
    table = Table(title=f"the host API: one happy async call, {args.jobs} calls x "
                        f"{args.rounds} rounds")
    table.add_column("ms (median of rounds)")
    for version in sorted(times):
        table.add_column(f"up to {version:04d}")
    table.add_column("newest / before")
    for step in (*STEPS, "call"):
        med = {v: statistics.median(r[step] for r in rounds) for v, rounds in times.items()}
        table.add_row(step.removeprefix("host_"), *(f"{med[v]:.3f}" for v in sorted(med)),
                      f"{med[newest] / med[args.before]:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
