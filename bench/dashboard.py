"""The dashboard at scale: its pages over HTTP against the raw SQL they run.

Run: ``python bench/dashboard.py [--rows 1000000] [--requests 40]``

Loads ``--rows`` jobs, as many ``call_events`` and ``usage_logs`` rows (bench/dashboard.sql,
set-based: 30 days of calls, the newest 200 still open) into a fresh migrated database,
vacuums and analyses it, starts ``callwarden serve`` as its own process, then requests each
page ``--requests`` times, one at a time, and reports the median and p95. The "SQL floor" is
the same named queries the page runs (engine/service/service.sql), timed on one direct
connection: what is left above it is rendering, HTTP and the pool. The overview's
aggregates over time read each closed bucket once per process (the service's rollup, kept
in memory) and then only the open one; "cold" times the queries of the first request,
which read the whole window.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
from _common import fresh_database
from rich.console import Console
from rich.table import Table
from webhooks import start_service

from callwarden.database.db import Conn, connect
from callwarden.database.queries import load_queries
from callwarden.database.write import execute
from callwarden.reconciler.config import ReconcileConfig
from callwarden.service.dashboard.calls import Filters, encode_cursor, sql_params
from callwarden.service.dashboard.overview import ORIGIN, TERMINAL, WINDOWS

LOAD = load_queries((Path(__file__).parent / "dashboard.sql").read_text(encoding="utf-8"))
console = Console()
Queries = list[tuple[str, dict[str, Any]]]


async def load(url: str, rows: int) -> float:
    start = time.perf_counter()
    async with await connect(url) as conn:
        for name in ("load_jobs", "load_call_events", "load_usage_logs"):
            await conn.execute(LOAD[name], {"rows": rows, "open": 200})
        await conn.execute(LOAD["vacuum_analyze"])
    return time.perf_counter() - start


def overview_queries(window: str, *, cold: bool = False) -> Queries:
    """The queries ``/`` runs for ``window`` (as engine/service/dashboard/handlers.py): on a
    refresh, the aggregates over time read only the open bucket (the closed ones are kept
    by the service's rollup); ``cold``: the first request, which reads the whole window."""
    now = datetime.now(UTC)
    w = WINDOWS[window]
    starts = w.starts(now)
    since = starts[0] if cold else starts[-1]
    span = {"since": since, "until": None, "bucket": w.bucket, "origin": ORIGIN}
    stale = ReconcileConfig().stale.sql_params(now)
    day = now - timedelta(days=1)
    return [("metrics_open_calls", {}), ("metrics_stale_calls", stale),
            ("dashboard_terminal_buckets", span), ("dashboard_finished_durations", span),
            ("dashboard_credit_buckets", span),
            ("dashboard_stale_calls", {**stale, "limit": 50}),
            ("dashboard_recent_outcomes", {"since": day, "types": ["Exhausted"], "limit": 20}),
            ("dashboard_recent_outcomes", {"since": day, "types": list(TERMINAL),
                                           "limit": 30})]


def pages(cursor: tuple[datetime, Any], number: int, failed: Any
          ) -> list[tuple[str, str, Queries]]:
    """``(label, path, the queries it runs)`` per page measured: ``cursor`` starts list
    page ``number``; ``failed`` is a failed call's job id."""
    listing = [
        ("calls, first page", "/jobs", Filters()),
        ("calls, kind filter", "/jobs?kind=kie-veo", Filters(kind="kie-veo")),
        ("calls, state filter", "/jobs?state=failed", Filters(state="failed")),
        ("calls, error text", "/jobs?error=content_policy", Filters(error="content_policy")),
    ]
    out = [("overview, last hour", "/?window=hour", overview_queries("hour")),
           ("overview, last day", "/?window=day", overview_queries("day")),
           ("overview, last day, cold (SQL only)", "", overview_queries("day", cold=True))]
    out += [(label, path, [("dashboard_list_calls", sql_params(f))]) for label, path, f in listing]
    later = Filters(cursor=cursor)
    job = {"job_id": failed}
    out.append(("job page (failed call)", f"/jobs/{failed}", [
        ("audit_job", job), ("load_events", job), ("audit_reservations", job),
        ("dashboard_ledger", job), ("dashboard_job_events", job)]))
    out.append((f"calls, page {number}", "/jobs?" + urlencode({"cursor": encode_cursor(*cursor)}),
                [("dashboard_list_calls", sql_params(later))]))
    return out


async def timed(fn: Callable[[], Awaitable[object]], n: int) -> list[float]:
    await fn()  # warm: connections, caches
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1e3)
    return sorted(out)


def p95(values: list[float]) -> float:
    return values[min(len(values) - 1, int(0.95 * len(values)))]


async def run(url: str, rows: int, n: int) -> Table:
    async with await connect(url) as conn:
        offset = min(4999, rows // 2)  # 4999: the last row of page 100
        cursor_row = await (await conn.execute(LOAD["page_cursor"], {"offset": offset})
                            ).fetchone()
        assert cursor_row is not None
        cursor = (cursor_row["at"], cursor_row["id"])
        failed = await (await conn.execute(LOAD["failed_job"], {})).fetchone()
        assert failed is not None
        measured = pages(cursor, offset // 50 + 2, failed["id"])
        floors = {}
        for label, _, queries in measured:
            async def sql(conn: Conn = conn, queries: Any = queries) -> None:
                for name, params in queries:
                    await execute(conn, name, params)
            floors[label] = await timed(sql, n)
    media = tempfile.TemporaryDirectory(prefix="cw-bench-media-")
    proc, _, base = await start_service(url, Path(media.name))
    table = Table(title=f"dashboard pages, {n} sequential requests each")
    for col in ("page", "HTTP median ms", "HTTP p95 ms", "SQL floor median ms",
                "SQL floor p95 ms", "bytes"):
        table.add_column(col, justify="right")
    try:
        async with aiohttp.ClientSession() as http:
            for label, path, _ in measured:
                f = floors[label]
                if not path:  # no page: the SQL of a first request, for comparison
                    table.add_row(label, "-", "-", f"{statistics.median(f):.1f}",
                                  f"{p95(f):.1f}", "-")
                    continue
                size = 0

                async def get(path: str = path) -> None:
                    nonlocal size
                    async with http.get(base + path) as resp:
                        assert resp.status == 200, (path, resp.status)
                        size = len(await resp.read())
                lat = await timed(get, n)
                table.add_row(label, f"{statistics.median(lat):.1f}", f"{p95(lat):.1f}",
                              f"{statistics.median(f):.1f}", f"{p95(f):.1f}", f"{size:,}")
    finally:
        proc.terminate()
        await proc.wait()
        media.cleanup()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    with fresh_database("bench_dashboard") as url:
        console.print(f"loading {args.rows:,} jobs, call_events and usage_logs rows...")
        seconds = asyncio.run(load(url, args.rows))
        console.print(f"loaded, vacuumed and analysed in {seconds:.1f} s")
        console.print(asyncio.run(run(url, args.rows, args.requests)))


if __name__ == "__main__":
    main()
