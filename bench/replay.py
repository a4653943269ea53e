"""Replay throughput: decode + fold in process, and ``verify`` end to end from Postgres.

Run: ``python bench/replay.py [--events 1000000] [--batch 1000]``

Builds ``--events`` events as realistic 5-event histories (80% completed, 15% failed
after reconcile attempts, 5% exhausted), then measures:
- in process: the verify hot path per job — one msgspec decode of the job's JSON array
  (as ``audit_histories`` builds it in SQL) with its signature check, then the fold —
  and the two halves alone (GC left on, as in production);
- end to end: the histories COPYed into a fresh database (``DATABASE_URL`` or an
  embedded server in a temp dir), then ``verify`` over all of them, through the library
  and through the ``callwarden verify`` command.
Goals: >= 1,000,000 events/s in process; verify of 1,000,000 events in < 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from _common import fresh_database
from rich.console import Console
from rich.table import Table

from callwarden.database.db import connect
from callwarden.database.queries import load_queries
from callwarden.events.codec import encode
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    ReconcileAttempted,
    StoredMedia,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.columns import to_columns
from callwarden.projections.fold import fold
from callwarden.projections.stats import percentile
from callwarden.replay.history import decode_fast, signatures
from callwarden.replay.verify import verify

SQL = load_queries((Path(__file__).parent / "replay.sql").read_text(encoding="utf-8"))
T0 = datetime(2026, 11, 1, tzinfo=UTC)
KINDS = ["kie-standard", "kie-veo", "replicate-prediction", "elevenlabs-async", "kie-suno"]
console = Console()


class Job(msgspec.Struct, frozen=True):
    id: uuid.UUID
    events: list[Event]


def _at(start: datetime) -> Callable[[float], datetime]:
    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)
    return at


def _completed(rng: random.Random, i: int, start: datetime, worker: str) -> list[Event]:
    s = _at(start)
    done = rng.uniform(20, 600)
    cost = round(rng.uniform(0.5, 8), 2)
    return [
        CallStarted(at=s(0), actor=worker, kind=rng.choice(KINDS)),
        TaskCreated(at=s(1.2), actor=worker, task_id=f"task-{i:08d}-{rng.getrandbits(32):x}"),
        UpstreamSucceeded(at=s(done - 3), actor=worker, result=UpstreamResult(
            media_urls=(f"https://tempfile.example/{i}/out.png",), cost=cost)),
        FinalizeClaimed(at=s(done - 2), actor=worker, owner=worker, lease_until=s(done + 58)),
        Completed(at=s(done), actor=worker, cost=cost, media=(StoredMedia(
            key=f"media/{i:08d}/0.png", url=f"https://media.example/media/{i:08d}/0.png",
            content_type="image/png", size=rng.randint(10_000, 4_000_000)),)),
    ]


def _failed(rng: random.Random, i: int, start: datetime, worker: str) -> list[Event]:
    s = _at(start)
    rec = f"reconciler:{rng.getrandbits(32):08x}"
    last: Event = UpstreamFailed(at=s(1500), actor=rec, error="upstream task failed",
                                 code="500")
    if rng.random() < 0.25:
        last = Exhausted(at=s(1500), actor=rec, attempts=2, last_error="timeout")
    return [
        CallStarted(at=s(0), actor=worker, kind=rng.choice(KINDS)),
        TaskCreated(at=s(1.5), actor=worker, task_id=f"task-{i:08d}-{rng.getrandbits(32):x}"),
        ReconcileAttempted(at=s(900), actor=rec, outcome="still_running", error="timeout",
                           next_attempt_at=s(1200)),
        ReconcileAttempted(at=s(1200), actor=rec, outcome="still_running", error="timeout",
                           next_attempt_at=s(1500)),
        last,
    ]


def histories(n_jobs: int, seed: int = 7) -> Iterator[Job]:
    rng = random.Random(seed)
    for i in range(n_jobs):
        start = T0 + timedelta(seconds=i * 0.5)
        worker = f"worker:{rng.getrandbits(32):08x}"
        make = _completed if rng.random() < 0.8 else _failed
        yield Job(uuid.UUID(int=rng.getrandbits(128), version=4), make(rng, i, start, worker))


def as_row(job: Job) -> dict[str, Any]:
    """The job's log as ``audit_histories`` returns it."""
    encoded = [encode(e) for e in job.events]
    return {"payloads": "[" + ",".join(p.decode() for _, _, p in encoded) + "]",
            "sig": " ".join(f"{t}/{v}" for t, v, _ in encoded),
            "n": len(encoded), "last_seq": len(encoded)}


def _rate(events: int, seconds: float) -> str:
    return f"{events / seconds:,.0f}"


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_in_process(rows: list[dict[str, Any]], events: int) -> list[list[str]]:
    """Streaming, as verify runs: each job decoded, folded, dropped (GC on)."""
    sigs = signatures()
    both = _timed(lambda: [fold(decode_fast(r, sigs) or []).version for r in rows])
    dec = _timed(lambda: [len(decode_fast(r, sigs) or ()) for r in rows])
    decoded = [decode_fast(r, sigs) or [] for r in rows]
    fld = _timed(lambda: [fold(evs).version for evs in decoded])
    return [["decode + fold (in process)", f"{events:,}", f"{both:.2f}", _rate(events, both)],
            ["  decode only", f"{events:,}", f"{dec:.2f}", _rate(events, dec)],
            ["  fold only", f"{events:,}", f"{fld:.2f}", _rate(events, fld)]]


def _job_row(job: Job) -> tuple[Any, ...]:
    p = fold(job.events)
    c = to_columns(p)
    return (job.id, "user-1", "image", c["status"], c["call_state"], c["new_version"],
            c["provider_kind"], c["provider_task_id"], c["provider_call_started_at"],
            c["call_sync"], c["reconcile_attempts"], c["reconcile_last_error"],
            c["reconcile_next_at"], c["error_message"], c["finalize_owner"],
            c["finalize_lease_until"], c["upstream_result"], c["call_output"],
            c["call_output"],
            c["provider_cost"], c["call_finished_at"], c["call_settlement"],
            c["call_finished_at"] if c["call_state"] == "completed" else None,
            100 if c["call_state"] == "completed" else 0)


def _usage_row(job: Job) -> tuple[Any, ...]:
    p = fold(job.events)
    charged = min(p.provider_cost or 10.0, 10.0) if p.settlement == "committed" else 0
    return (job.id, "user-1", p.settlement, 10, charged, p.call_finished_at)


def _event_rows(job: Job) -> Iterator[tuple[Any, ...]]:
    for seq, e in enumerate(job.events, start=1):
        name, version, payload = encode(e)
        yield (job.id, seq, name, version, payload.decode(), e.actor, e.at)


async def load(url: str, jobs: list[Job]) -> float:
    """COPY the jobs, their reservations and their events; seconds taken."""
    t0 = time.perf_counter()
    async with await connect(url) as conn, conn.cursor() as cur:
        async with cur.copy(SQL["copy_jobs"]) as cp:
            for job in jobs:
                await cp.write_row(_job_row(job))
        async with cur.copy(SQL["copy_usage_logs"]) as cp:
            for job in jobs:
                await cp.write_row(_usage_row(job))
        async with cur.copy(SQL["copy_call_events"]) as cp:
            for job in jobs:
                for row in _event_rows(job):
                    await cp.write_row(row)
        await cur.execute(SQL["analyze"])
    return time.perf_counter() - t0


async def bench_verify(url: str, batch: int) -> tuple[list[str], list[float]]:
    async with await connect(url) as conn:
        summary, batches = await verify(conn, batch=batch)
    if not summary.ok:
        raise SystemExit(f"verify found problems in the bench data: {summary}")
    row = ["verify (library, from Postgres)", f"{summary.events:,}",
           f"{summary.seconds:.2f}", _rate(summary.events, summary.seconds)]
    return row, [b.seconds for b in batches]


def bench_cli(url: str, batch: int, events: int) -> list[str]:
    env = {**os.environ, "DATABASE_URL": url}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "callwarden.cli", "verify", "--batch",
                           str(batch)], env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"callwarden verify failed:\n{done.stdout}\n{done.stderr}")
    return ["callwarden verify (command)", f"{events:,}", f"{seconds:.2f}",
            _rate(events, seconds)]


def _table(rows: list[list[str]], batch_times: list[float], batch: int) -> Table:
    table = Table(title="replay: decode + fold + verify")
    for col in ("what", "events", "seconds", "events/s"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for row in rows:
        table.add_row(*row)
    p50, p99 = percentile(batch_times, 0.5), percentile(batch_times, 0.99)
    if p50 is not None and p99 is not None:
        table.caption = (f"verify batches of {batch} jobs: p50 {p50 * 1000:.0f} ms, "
                         f"p99 {p99 * 1000:.0f} ms")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()
    n_jobs = max(1, args.events // 5)
    events = n_jobs * 5
    console.print(f"building {n_jobs:,} histories ({events:,} events)...")
    jobs = list(histories(n_jobs))
    rows = bench_in_process([as_row(j) for j in jobs], events)
    with fresh_database("replay") as url:
        console.print(f"loading them with COPY: {asyncio.run(load(url, jobs)):.1f} s")
        del jobs
        verify_row, batch_times = asyncio.run(bench_verify(url, args.batch))
        rows += [verify_row, bench_cli(url, args.batch, events)]
    console.print(_table(rows, batch_times, args.batch))


if __name__ == "__main__":
    main()
