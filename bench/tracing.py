"""What the OpenTelemetry spans cost the write path: ``append`` with tracing absent, present
with no provider (the API's no-op), and present with the SDK.

Run: ``python bench/tracing.py [--jobs 300] [--rounds 2] [--spans 20000]``

Each mode runs in its own process (the global tracer provider is set once per process):
- ``absent``: ``opentelemetry`` hidden from the import system (as if the ``otel`` extra were
  not installed): no hook, each append checks one module attribute;
- ``no-op provider``: the extra installed, no provider set: the spans are the API's no-op;
- ``SDK``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` (an exporter that drops
  the spans, so only callwarden's side and the SDK's are measured).
Per mode: appends committed per second on one connection (``--jobs`` x 5 state changes,
the best of ``--rounds``, modes interleaved), and the microseconds one append's span
costs in process (``--spans`` transition spans opened and ended with no database, the
best of five batches, less an empty call; absent: the one attribute check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import timeit
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import fresh_database
from rich.console import Console
from rich.table import Table

MODES = ("absent", "no-op provider", "SDK")


class _Hide:
    """Makes ``opentelemetry`` unimportable (the ``absent`` mode)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")


def _setup(mode: str) -> None:
    if mode == "absent":
        sys.meta_path.insert(0, _Hide())
    from callwarden.observe import tracing  # installs the hooks unless absent

    assert tracing.ENABLED is (mode != "absent")
    if mode == "SDK":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        sdk = TracerProvider()
        sdk.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(sdk)


def _span_cost_us(n: int) -> float:
    """Microseconds per append spent in the tracing hook (none: the ``None`` check)."""
    from append import lifecycle

    from callwarden.database import write
    from callwarden.projections.fold import EMPTY, apply

    job = uuid.uuid4()
    event = lifecycle(job)[0]
    result = write.AppendResult(ok=True, projection=apply(EMPTY, event), event=event)
    hook = write._trace

    def once() -> None:
        if hook is None:
            if write._trace is None:
                pass
        else:
            with hook(job, EMPTY, (event,)) as done:
                done(result)

    def nothing() -> None:
        pass

    def best(f: Callable[[], None]) -> float:
        return min(timeit.repeat(f, number=n // 5, repeat=5)) / (n // 5)

    return max(0.0, best(once) - best(nothing)) * 1e6


def child(mode: str, url: str, jobs: int, spans: int) -> dict[str, float]:
    _setup(mode)
    from append import engine_op, make_jobs, run_mode

    ids = asyncio.run(make_jobs(url, jobs))
    rate = asyncio.run(run_mode(url, engine_op, ids, 1))
    return {"appends_per_s": rate, "span_us": _span_cost_us(spans)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.jobs, args.spans)))
        return
    best: dict[str, dict[str, float]] = {}
    with fresh_database("bench_tracing") as url:
        for _ in range(args.rounds):
            for mode in MODES:
                out = subprocess.run(
                    [sys.executable, str(Path(__file__)), "--child", mode, "--url", url,
                     "--jobs", str(args.jobs), "--spans", str(args.spans)],
                    capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                old = best.setdefault(mode, got)
                old["appends_per_s"] = max(old["appends_per_s"], got["appends_per_s"])
                old["span_us"] = min(old["span_us"], got["span_us"])
    base = best["absent"]["appends_per_s"]
    table = Table(title=f"append with tracing (c=1, {args.jobs} jobs x 5, best of "
                        f"{args.rounds}; span cost over {args.spans:,} spans)")
    for col in ("tracing", "appends/s", "vs absent", "µs per append in the hook"):
        table.add_column(col, justify="right")
    for mode in MODES:
        r = best[mode]
        table.add_row(mode, f"{r['appends_per_s']:,.0f}", f"{r['appends_per_s'] / base:.2f}x",
                      f"{r['span_us']:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
