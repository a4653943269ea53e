"""The main job with and without database faults, side by side in one run.

Run: ``python bench/chaos.py [--jobs 300] [--workers 3] [--every 30] [--rounds 1]``

Each round runs ``callwarden demo``'s workload (``callwarden.demo.run.run_demo``: real worker
processes, the reconciler, the webhook receiver, the simulator with its faults armed) on a
fresh embedded Postgres twice: once undisturbed, once with the database restarted in
immediate mode (down ``--down`` seconds) and every connection cut, alternately, every
``--every`` seconds on average. Workers are not killed (``--kill-rate 0``), so the two
runs differ only by the database faults. With ``--harness`` a third run goes through the
test suite's fault harness (``tests/faults.py``): the actors reach Postgres through a TCP
proxy, and restarts alternate with one backend killed, all killed, and the proxy
dropping, stalling and slowing connections. Prints jobs per second (jobs / seconds until
every job is terminal), p50/p95 time to terminal, the faults, and whether every invariant
held; the last row is the faulty run over the clean one (goal: throughput at least 80 %).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict
from rich.console import Console
from rich.table import Table

from callwarden.cli.process import setup_logging
from callwarden.database.db import EmbeddedServer
from callwarden.demo.run import DemoOptions, DemoRun, Tick, run_demo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fault harness in tests/
from tests.faults import DatabaseFaults, FaultLog, FaultProxy

console = Console(width=130)


def _quiet(_: Tick) -> None:
    """The live view is not drawn in a benchmark."""


def one(jobs: int, workers: int, seed: int, chaos: bool, every_s: float,
        down_s: float) -> DemoRun:
    folder = Path(tempfile.mkdtemp(prefix="cw-chaos-"))
    server = EmbeddedServer(folder / "pg", cleanup="delete")
    try:
        opts = DemoOptions(jobs=jobs, workers=workers, kill_rate=0.0, seed=seed,
                           duration=900.0, chaos=chaos, chaos_every_s=every_s)
        work = folder / "work"
        work.mkdir()
        setup_logging(file=folder / "bench-chaos.log")  # outages are logged, not printed
        return asyncio.run(run_demo(opts, server.url(), work, _quiet,
                                    lambda: server.restart(down_s=down_s)))
    finally:
        server.stop()


def through_harness(jobs: int, workers: int, seed: int, every_s: float,
                    down_s: float) -> tuple[DemoRun, FaultLog]:
    """The same workload through the fault harness's proxy, with its fault schedule."""
    folder = Path(tempfile.mkdtemp(prefix="cw-chaos-"))
    server = EmbeddedServer(folder / "pg", cleanup="delete")
    try:
        with FaultProxy(server.url()) as proxy:
            faults = DatabaseFaults(server, str(conninfo_to_dict(server.url())["dbname"]),
                                    proxy, rng=random.Random(seed),
                                    every_s=(0.6 * every_s, 1.4 * every_s),
                                    down_s=(down_s, down_s))
            opts = DemoOptions(jobs=jobs, workers=workers, kill_rate=0.0, seed=seed,
                               duration=900.0)
            work = folder / "work"
            work.mkdir()
            setup_logging(file=folder / "bench-chaos.log")
            faults.start(for_s=900.0)
            try:
                run = asyncio.run(run_demo(opts, proxy.url(), work, _quiet))
            finally:
                log = faults.stop()
        return run, log
    finally:
        server.stop()


def _row(name: str, run: DemoRun, faults: str | None = None) -> list[str]:
    s = run.summary
    return [name, str(s.jobs), f"{run.seconds:.1f}", f"{s.jobs / run.seconds:.2f}",
            f"{s.p50_s or 0:.1f}", f"{s.p95_s or 0:.1f}",
            faults or f"{s.database_restarts} restarts, {s.connections_cut} cuts",
            "PASS" if s.ok else "FAIL: " + "; ".join(s.violations)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--every", type=float, default=30.0, help="mean seconds between faults")
    ap.add_argument("--down", type=float, default=1.0, help="seconds a restart stays down")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--harness", action="store_true",
                    help="a third run through tests/faults.py's proxy and fault schedule")
    args = ap.parse_args()
    table = Table(title=f"callwarden demo workload, {args.jobs} jobs, {args.workers} workers, "
                        f"a database fault every ~{args.every:g} s")
    for col in ("run", "jobs", "seconds", "jobs/s", "p50 s", "p95 s",
                "faults", "invariants"):
        table.add_column(col, justify="right" if col not in ("run", "invariants") else "left")
    ratios = []
    for r in range(args.rounds):
        clean = one(args.jobs, args.workers, args.seed + r, False, args.every, args.down)
        faulty = one(args.jobs, args.workers, args.seed + r, True, args.every, args.down)
        table.add_row(*_row(f"no faults (round {r + 1})", clean))
        table.add_row(*_row(f"faults (round {r + 1})", faulty))
        ratios.append((faulty.summary.jobs / faulty.seconds) / (clean.summary.jobs / clean.seconds))
        if args.harness:
            run, log = through_harness(args.jobs, args.workers, args.seed + r, args.every,
                                       args.down)
            table.add_row(*_row(f"harness faults (round {r + 1})", run,
                                ", ".join(f"{n} {k}" for k, n in sorted(log.counts.items()))))
            ratios.append((run.summary.jobs / run.seconds) / (clean.summary.jobs / clean.seconds))
    table.add_row("faulty / clean throughput", "", "", " / ".join(f"{x:.2f}" for x in ratios),
                  "", "", "", "goal >= 0.80")
    console.print(table)


if __name__ == "__main__":
    main()
