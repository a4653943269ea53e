"""The reconciler at scale: claim-query cost, calls reconciled per second, recovery latency.

Run: ``python bench/reconcile.py [--rows 1000000] [--stale 10000] [--processes 1 4]``

1. ``--rows`` rows in ``jobs`` (terminal calls, loaded with ``generate_series``), plus
   ``--stale`` in-flight calls whose worker died 30 minutes ago after creating a KIE task
   in the simulator (which succeeded upstream). Prints the claim statement's time per
   batch (wall time, rolled back, and ``EXPLAIN ANALYZE``) and whether any plan node is a
   sequential scan of ``jobs``.
2. For each ``--processes`` count: that many reconciler processes (separate pools) drain a
   fresh set of ``--stale`` calls (poll + download + store + complete each); prints calls
   reconciled per second, from the first pass's start to the last productive pass's end.
3. Recovery latency: a real worker process runs a call, heartbeating; once its heartbeat
   is seen it is SIGKILLed while the upstream task goes on to succeed; the reconciler loop
   (heartbeat timeout and scan interval scaled by ``--scale``) completes the job. Prints
   the measured latency, its projection to the default settings (heartbeat timeout 60 s +
   one jittered 30 s scan + one poll), and the seed's cron design for comparison
   (kie-standard threshold 10 min + up to one 5-min cadence = 10-15 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import aiohttp
from _common import SQL, fresh_database
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from rich.console import Console

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import connect, open_pool
from callwarden.database.queries import QUERIES
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.base import AsyncKindClient, ProviderSettings
from callwarden.providers.registry import client_for
from callwarden.providers.simulator.core import running_simulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Counts, Reconciler

console = Console()
SUCCEED: dict[str, Any] = {"steps": [], "end": "succeeded"}
# -- loading ------------------------------------------------------------------------------

async def load_rows(url: str, rows: int) -> None:
    async with await connect(url) as conn:
        for lo in range(1, rows + 1, 250_000):
            await conn.execute(SQL["load_completed_jobs"],
                               {"lo": lo, "hi": min(lo + 249_999, rows)})
        await conn.execute(SQL["vacuum_jobs"])


async def make_stale(url: str, settings: ProviderSettings, n: int) -> list[uuid.UUID]:
    """``n`` calls whose worker recorded CallStarted + TaskCreated 30 min ago and died."""
    async with aiohttp.ClientSession() as http, open_pool(url, max_size=8, check=True) as pool:
        client = cast(AsyncKindClient, client_for("kie-standard", http, settings))
        async with pool.connection() as conn:
            rows = await (await conn.execute(SQL["load_stale_jobs"], {"n": n})).fetchall()
        jobs = [r["job_id"] for r in rows]
        gate = asyncio.Semaphore(16)
        at = utcnow() - timedelta(minutes=30)

        async def one(job: uuid.UUID) -> None:
            async with gate:
                task = await client.create({"model": "nano-banana-pro",
                                            "input": {"prompt": "x", "_sim": SUCCEED}})
                async with pool.connection() as conn:
                    p = (await append(conn, job, await load(conn, job), CallStarted(
                        at=at, actor="worker:dead", kind="kie-standard"))).projection
                    await append(conn, job, p, TaskCreated(at=at, actor="worker:dead",
                                                           task_id=task))

        await asyncio.gather(*(one(j) for j in jobs))
        async with pool.connection() as conn:
            await conn.execute("ANALYZE jobs")
    return jobs


# -- 1. the claim statement -------------------------------------------------------------

def _seq_scans(plan: dict[str, Any]) -> int:
    own = plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") == "jobs"
    return int(own) + sum(_seq_scans(p) for p in plan.get("Plans", []))


async def claim_cost(url: str, repeats: int = 30) -> dict[str, Any]:
    """Claim statement timings, each claim rolled back so every repeat sees the same rows."""
    async with open_pool(url, max_size=1, check=True) as pool, aiohttp.ClientSession() as http:
        r = Reconciler(pool, http, ProviderSettings(), LocalFolderStore(Path("/tmp")))
        params = r.claim_params(utcnow())
    conn = await AsyncConnection.connect(url, row_factory=dict_row)
    async with conn:
        walls, claimed = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            claimed = len(await (await conn.execute(QUERIES["reconcile_claim"], params)
                                 ).fetchall())
            walls.append((time.perf_counter() - t) * 1000)
            await conn.rollback()
        row = await (await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) "
                                        + QUERIES["reconcile_claim"], params)).fetchone()
        await conn.rollback()
    assert row is not None
    plan = row["QUERY PLAN"][0]
    return {"batch": claimed, "wall_median_ms": statistics.median(walls),
            "wall_p95_ms": sorted(walls)[int(0.95 * (len(walls) - 1))],
            "explain_exec_ms": plan["Execution Time"],
            "explain_plan_ms": plan["Planning Time"], "seq_scans": _seq_scans(plan["Plan"])}


# -- 2. throughput with N reconciler processes -------------------------------------------

async def reconciler_role(url: str, sim_url: str, media: str) -> None:
    """One reconciler process: passes until a pass claims nothing; JSON totals out."""
    settings = ProviderSettings.for_simulator(sim_url)
    total, start, end = Counts(), time.time(), time.time()
    async with open_pool(url, max_size=10, check=True) as pool, \
            aiohttp.ClientSession() as http, \
            Reconciler(pool, http, settings, LocalFolderStore(Path(media))) as r:
        while True:
            c = await r.reconcile_once()
            if not c.claimed:
                break
            end = time.time()
            for name in ("claimed", "completed", "errors", "lost_race"):
                setattr(total, name, getattr(total, name) + getattr(c, name))
    print(json.dumps({"start": start, "end": end, "completed": total.completed,
                      "claimed": total.claimed, "errors": total.errors}), flush=True)


async def throughput(url: str, sim_url: str, jobs: list[uuid.UUID], processes: int,
                     media: str) -> dict[str, Any]:
    """``processes`` reconciler processes drain the stale calls ``jobs``."""
    stale = len(jobs)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "reconciler", "--url", url, "--sim", sim_url,
        "--media", media, stdout=asyncio.subprocess.PIPE) for _ in range(processes)]
    outs = [json.loads((await p.communicate())[0]) for p in procs]
    seconds = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    async with await connect(url) as conn:
        done = await (await conn.execute(SQL["count_completed"], {"ids": jobs})).fetchone()
    assert done is not None
    return {"processes": processes, "calls": stale, "completed": done["n"],
            "seconds": seconds, "per_second": done["n"] / seconds if seconds else 0.0,
            "errors": sum(o["errors"] for o in outs)}


# -- 3. recovery latency after SIGKILL ---------------------------------------------------

async def worker_role(url: str, sim_url: str, media: str, job: str, beat_s: float) -> None:
    config = CallConfig(heartbeat_every_s=beat_s, poll_interval_s={"kie-standard": beat_s})
    async with open_pool(url, max_size=2, check=True) as pool, aiohttp.ClientSession() as http:
        runner = CallRunner(pool, http, ProviderSettings.for_simulator(sim_url),
                            LocalFolderStore(Path(media)), config=config)
        await runner.run(uuid.UUID(job), "kie-standard", {
            "model": "nano-banana-pro", "input": {"prompt": "x", "_sim": {
                "steps": [{"phase": "running", "seconds": 3600, "progress": 92}],
                "end": "succeeded"}}})


async def _wait_for(url: str, query: str, job: uuid.UUID, timeout_s: float) -> float:
    """Time (unix s) at which the named ``query`` first returns a row for ``job``."""
    deadline = time.time() + timeout_s
    async with await connect(url) as conn:
        while time.time() < deadline:
            if await (await conn.execute(SQL[query], {"job_id": job})).fetchone():
                return time.time()
            await asyncio.sleep(0.02)
    raise TimeoutError(f"job {job}: condition not met within {timeout_s} s")


async def recovery_latency(url: str, sim: Any, scale: float, media: str) -> float:
    async with await connect(url) as conn:
        rows = await (await conn.execute(SQL["load_stale_jobs"], {"n": 1})).fetchall()
    job = rows[0]["job_id"]
    beat = max(0.2, 10 * scale)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "worker", "--url", url, "--sim", sim.base_url,
        "--media", media, "--job", str(job), "--beat", str(beat))
    await _wait_for(url, "job_heartbeated", job, 60)
    proc.send_signal(signal.SIGKILL)
    killed = time.time()
    await proc.wait()
    sim.sim.clock.advance(3600)  # upstream finishes while the worker is dead
    config = ReconcileConfig(heartbeat_timeout_s=60 * scale, scan_interval_s=30 * scale)
    stop = asyncio.Event()
    async with open_pool(url, max_size=4, check=True) as pool, aiohttp.ClientSession() as http:
        r = Reconciler(pool, http, sim.settings, LocalFolderStore(Path(media)), config=config)
        loop = asyncio.create_task(r.run(stop))
        done = await _wait_for(url, "job_completed", job, 600 * scale + 60)
        stop.set()
        await loop
    return done - killed


# -- main ---------------------------------------------------------------------------------

async def bench(args: argparse.Namespace, url: str) -> None:
    with tempfile.TemporaryDirectory() as media:
        async with running_simulator() as sim:
            t = time.perf_counter()
            await load_rows(url, args.rows)
            jobs = await make_stale(url, sim.settings, args.stale)
            console.print(f"loaded {args.rows:,} terminal rows + {args.stale:,} stale calls "
                          f"in {time.perf_counter() - t:.1f} s")
            cost = await claim_cost(url)
            console.print(
                f"claim (batch {cost['batch']}): wall median {cost['wall_median_ms']:.2f} ms,"
                f" p95 {cost['wall_p95_ms']:.2f} ms; EXPLAIN ANALYZE execution "
                f"{cost['explain_exec_ms']:.2f} ms (+ planning {cost['explain_plan_ms']:.2f}"
                f" ms); seq scans on jobs: {cost['seq_scans']}")
            for i, n in enumerate(args.processes):
                if i:  # a fresh set of stale calls for each run
                    jobs = await make_stale(url, sim.settings, args.stale)
                res = await throughput(url, sim.base_url, jobs, n, media)
                console.print(
                    f"{n} reconciler process(es): {res['completed']:,}/{res['calls']:,} "
                    f"completed in {res['seconds']:.1f} s = {res['per_second']:.0f} calls/s "
                    f"(errors {res['errors']})")
            lat = [await recovery_latency(url, sim, args.scale, media)
                   for _ in range(args.trials)]
            formula = 60 + 30 * 1.2
            console.print(
                f"recovery after SIGKILL at scale {args.scale} (heartbeat timeout "
                f"{60 * args.scale:g} s, scan {30 * args.scale:g} s): measured "
                f"{', '.join(f'{x:.2f}' for x in lat)} s -> x{1 / args.scale:g} = "
                f"{max(lat) / args.scale:.0f} s at defaults; bound: heartbeat 60 s + scan "
                f"<= {30 * 1.2:g} s + one poll = {formula:.0f} s + poll; "
                f"seed cron design for kie-standard: 600-900 s (10-15 min)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--stale", type=int, default=10_000)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--scale", type=float, default=0.1,
                    help="heartbeat timeout and scan interval scale for the latency run")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--role", choices=["bench", "reconciler", "worker"], default="bench")
    ap.add_argument("--url")
    ap.add_argument("--sim")
    ap.add_argument("--media")
    ap.add_argument("--job")
    ap.add_argument("--beat", type=float, default=1.0)
    args = ap.parse_args()
    if args.role == "reconciler":
        asyncio.run(reconciler_role(args.url, args.sim, args.media))
    elif args.role == "worker":
        asyncio.run(worker_role(args.url, args.sim, args.media, args.job, args.beat))
    else:
        with fresh_database("bench_reconcile") as url:
            asyncio.run(bench(args, url))


if __name__ == "__main__":
    main()
