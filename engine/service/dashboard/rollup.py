"""The overview's aggregates over time, each closed bucket read once per process.

A bucket (5 min for the hour window, 1 h for the day window) closes when its end is
``settle_s`` in the past: the events, call ends and settlements it counts are stamped by
the database when written (``now()`` of their transaction), so nothing lands in it after
that but a transaction that stayed open for longer than ``settle_s``. A closed bucket's
rows are kept in memory and the database is asked only for the buckets not yet read and
for the open one (the last, with the current time in it), so the day window costs one
hour's rows per refresh, not a day's. Buckets older than the day window are dropped.

The percentiles of time to terminal are computed here from the kept durations
(:func:`percentile`: the same linear interpolation as SQL's ``percentile_cont``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from callwarden.database.db import Conn
from callwarden.database.write import execute

__all__ = ["Rollup", "latency_rows", "percentile"]

Row = Mapping[str, Any]
QUERIES = ("dashboard_terminal_buckets", "dashboard_finished_durations",
           "dashboard_credit_buckets")


def percentile(ordered: Sequence[float], p: float) -> float | None:
    """The ``p`` quantile (0..1) of ascending ``ordered``, interpolated linearly between
    the closest ranks (``percentile_cont``); ``None`` for no value."""
    if not ordered:
        return None
    pos = p * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_rows(durations: Sequence[Row]) -> list[dict[str, Any]]:
    """``dashboard_finished_durations`` rows (seconds per bucket and kind) → per kind:
    calls, p50 and p95 seconds."""
    per: dict[str, list[float]] = defaultdict(list)
    for r in durations:
        per[r["kind"]].extend(float(v) for v in r["seconds"])
    out = []
    for kind in sorted(per):
        values = sorted(per[kind])
        out.append({"kind": kind, "calls": len(values),
                    "pcts": [percentile(values, 0.5), percentile(values, 0.95)]})
    return out


class Rollup:
    """Closed buckets' rows per query and bucket width (see the module docstring)."""

    def __init__(self, *, settle_s: float = 120.0, keep: timedelta = timedelta(days=1, hours=2)
                 ) -> None:
        self.settle = timedelta(seconds=settle_s)
        self.keep = keep
        self.closed: dict[tuple[str, timedelta, datetime], list[Row]] = {}

    async def rows(self, conn: Conn, name: str, starts: Sequence[datetime],
                   bucket: timedelta, origin: datetime, now: datetime) -> list[Row]:
        """The rows of ``name`` for the buckets beginning at ``starts``."""
        closed = [s for s in starts if s + bucket <= now - self.settle]
        missing = [s for s in closed if (name, bucket, s) not in self.closed]
        if missing:
            got = await execute(conn, name, {"since": missing[0], "until": missing[-1] + bucket,
                                             "bucket": bucket, "origin": origin})
            by_start: dict[datetime, list[Row]] = {s: [] for s in missing}
            for r in got:
                if r["bucket"] in by_start:
                    by_start[r["bucket"]].append(r)
            for s, found in by_start.items():
                self.closed[(name, bucket, s)] = found
        opened = [s for s in starts if s not in closed]
        live = await execute(conn, name, {"since": opened[0], "until": None, "bucket": bucket,
                                          "origin": origin}) if opened else []
        self._forget(now)
        return [r for s in closed for r in self.closed[(name, bucket, s)]] + list(live)

    def _forget(self, now: datetime) -> None:
        for key in [k for k in self.closed if k[2] < now - self.keep]:
            del self.closed[key]
