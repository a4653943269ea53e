"""``python -m tests.simulation --seed N [--schedules K] [--jobs J]``: run the schedules of
seeds N .. N + K - 1 on Postgres (over J processes); a violation prints the seed, the
invariant, the step trace and the replay command, and exits 1. ``--trace`` prints each
schedule's trace digest (the same seed gives the same digest every run)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from tests.simulation.driver import Violation
from tests.simulation.run import merge_labels, rate, run_parallel, run_seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--schedules", type=int, default=1, help="how many seeds")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--trace", action="store_true",
                        help="print each schedule's seed, step count and trace digest")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.jobs > 1:
        n, labels, bad = run_parallel(args.seed, args.schedules, jobs=args.jobs)
        for text in bad:
            print(text, file=sys.stderr)
        elapsed = time.perf_counter() - started
        print(f"{n} schedules in {elapsed:.1f} s ({n / elapsed:.1f}/s) over "
              f"{args.jobs} processes, {len(bad)} violations")
        print("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
        return 1 if bad else 0
    seeds = range(args.seed, args.seed + args.schedules)
    try:
        outcomes = asyncio.run(run_seeds(seeds))
    except Violation as v:
        print(v, file=sys.stderr)
        return 1
    if args.trace:
        for o in outcomes:
            print(f"seed {o.seed}: {o.jobs} jobs, {o.steps} steps, trace {o.digest}")
    print(f"{rate(outcomes, started)}, 0 violations")
    labels = merge_labels(outcomes)
    print("labels: " + ", ".join(f"{k}={n}" for k, n in sorted(labels.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
