"""Webhook receiver throughput: bounded bursts of signed Replicate deliveries on 127.0.0.1.

Run: ``python bench/webhooks.py [--jobs 200] [--concurrency 1 8 32]``

``callwarden serve`` runs as its own process on a fresh migrated database. For each
concurrency level, ``--jobs`` calls are prepared beforehand (``CallStarted`` +
``TaskCreated`` for ``replicate-prediction``), then one Svix-signed terminal delivery per
call is sent with at most ``concurrency`` in flight. Each delivery is a failed prediction,
so it is one settling transition (refund) in one statement, plus the replay-protection
insert — finalization (downloads) is not measured. A second burst re-sends the same
deliveries: each is a duplicate, acknowledged 200 and changing nothing (signature check +
one insert that conflicts).
Reports deliveries/s and p50/p99 latency per level and burst.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import msgspec
from _common import fresh_database
from rich.console import Console
from rich.table import Table

from callwarden.database.db import connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.replicate.webhook import replicate_sign

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
Delivery = tuple[bytes, dict[str, str]]


async def prepare(url: str, count: int) -> list[str]:
    """``count`` polling calls; their task ids."""
    tasks = []
    async with await connect(url) as conn:
        for _ in range(count):
            job = await create_job(conn, credits=5)
            now = datetime.now(UTC)
            p = (await append(conn, job, await load(conn, job), CallStarted(
                at=now, actor="worker:bench", kind="replicate-prediction"))).projection
            task_id = f"bench-{uuid.uuid4().hex[:16]}"
            await append(conn, job, p, TaskCreated(at=now, actor="worker:bench",
                                                   task_id=task_id))
            tasks.append(task_id)
    return tasks


def delivery(task_id: str) -> Delivery:
    body = msgspec.json.encode({"id": task_id, "status": "failed", "error": "bench",
                                "output": None})
    msg_id, ts = f"msg_{uuid.uuid4().hex}", int(time.time())
    return body, {"Content-Type": "application/json", "webhook-id": msg_id,
                  "webhook-timestamp": str(ts),
                  "webhook-signature": replicate_sign(SECRET, msg_id, ts, body)}


async def burst(http: aiohttp.ClientSession, url: str, deliveries: list[Delivery],
                concurrency: int, expect: int) -> tuple[float, list[float]]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(d: Delivery) -> None:
        async with gate:
            started = time.perf_counter()
            async with http.post(url, data=d[0], headers=d[1]) as resp:
                await resp.read()
                if resp.status != expect:
                    raise RuntimeError(f"HTTP {resp.status}, expected {expect}")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(d) for d in deliveries))
    return time.perf_counter() - started, sorted(latencies)


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def start_service(db_url: str, media: Path
                        ) -> tuple[asyncio.subprocess.Process, str, str]:
    """``callwarden serve`` on free ports: the process, its webhook and operator URLs."""
    env = {**os.environ, "DATABASE_URL": db_url, "CALLWARDEN_MEDIA_DIR": str(media),
           "CALLWARDEN_REPLICATE_WEBHOOK_SECRET": SECRET}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "serve", "--port", "0", "--operator-port", "0",
        env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
    if "http://" not in line:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r}")
    return proc, line.split()[3], line.split("operator on ")[1].split()[0]


async def run(db_url: str, jobs: int, levels: list[int]) -> Table:
    with tempfile.TemporaryDirectory(prefix="cw-bench-media-") as media:
        return await _run(db_url, jobs, levels, Path(media))


async def _run(db_url: str, jobs: int, levels: list[int], media: Path) -> Table:
    proc, base, _ = await start_service(db_url, media)
    table = Table(title=f"webhook receiver, {jobs} signed Replicate deliveries per burst")
    for col in ("concurrency", "burst", "deliveries/s", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")
    try:
        async with aiohttp.ClientSession() as http:
            for level in levels:
                sent = [delivery(t) for t in await prepare(db_url, jobs)]
                for name, expect in (("settling", 200), ("replayed", 200)):
                    elapsed, lat = await burst(http, f"{base}/webhooks/replicate", sent,
                                               level, expect)
                    table.add_row(str(level), name, f"{jobs / elapsed:,.0f}",
                                  f"{pct(lat, 0.5) * 1e3:.1f}", f"{pct(lat, 0.99) * 1e3:.1f}")
    finally:
        proc.terminate()
        await proc.wait()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    with fresh_database("bench_webhooks") as url:
        table = asyncio.run(run(url, args.jobs, args.concurrency))
    Console().print(table)


if __name__ == "__main__":
    main()
