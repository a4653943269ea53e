"""Operator statistics as values, and the pure arithmetic behind them.

The database does the counting (``callwarden.replay.audit``); this module holds the report's shape,
the window parsing, the percentile definition (the same as Postgres ``percentile_cont``:
linear interpolation between closest ranks) and the folding of terminal-event counts into
recoveries and sweeps. Nothing here reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import msgspec

__all__ = [
    "HostLeft",
    "KindStale",
    "KindState",
    "Latency",
    "StatsReport",
    "TerminalCount",
    "parse_window",
    "percentile",
    "recoveries",
    "sweeps",
]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_WINDOW = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_window(text: str) -> timedelta:
    """``"24h"``, ``"90m"``, ``"1d12h"``, ``"30s"``, ``"2w"`` -> a positive timedelta."""
    spec = text.strip().lower()
    parts = _WINDOW.findall(spec)
    if not parts or "".join(n + u for n, u in parts) != spec:
        raise ValueError(f"invalid window {text!r} (expected e.g. 24h, 90m, 1d12h)")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"window {text!r} must be positive")
    return timedelta(seconds=seconds)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, interpolated like ``percentile_cont``."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class KindState(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    state: str
    calls: int


class KindStale(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    threshold_s: float | None  # None: a kind this version does not know
    stale: int


class TerminalCount(msgspec.Struct, frozen=True, kw_only=True):
    """Terminal events of one type recorded in the window for one kind."""

    kind: str
    type: str
    by_reconciler: bool
    events: int


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """Time to terminal (``call_finished_at - provider_call_started_at``), seconds."""

    kind: str  # "all" for every kind together
    calls: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None


class HostLeft(msgspec.Struct, frozen=True, kw_only=True):
    """Reservations still ``reserved`` on jobs the host ended more than ``after_s`` ago."""

    reservations: int = 0
    credits: float = 0.0
    after_s: float = 300.0


class StatsReport(msgspec.Struct, frozen=True, kw_only=True):
    now: datetime
    window_s: float
    by_kind_state: list[KindState]
    stale: list[KindStale]
    recoveries: dict[str, int]  # terminal event type -> count, written by a reconciler
    sweeps: dict[str, int]  # kind -> Swept events, any actor
    terminal_events: list[TerminalCount]
    time_to_terminal: list[Latency]
    # In-flight jobs with credits reserved and no call, newer than the legacy cutoff and
    # older than the legacy threshold: the host's, never swept — reported here.
    jobs_without_call: int = 0
    # Reservations still held on jobs the host ended (its commit or refund never came),
    # past host_left_after_s: the reconciler's policy settles them, what stays is here.
    host_left: HostLeft = msgspec.field(default_factory=lambda: HostLeft())


def recoveries(counts: Iterable[TerminalCount]) -> dict[str, int]:
    """Terminal transitions recorded by reconcilers, per event type."""
    out: dict[str, int] = {}
    for c in counts:
        if c.by_reconciler:
            out[c.type] = out.get(c.type, 0) + c.events
    return dict(sorted(out.items()))


def sweeps(counts: Iterable[TerminalCount]) -> dict[str, int]:
    """``Swept`` events per kind, whoever recorded them."""
    out: dict[str, int] = {}
    for c in counts:
        if c.type == "Swept":
            out[c.kind] = out.get(c.kind, 0) + c.events
    return dict(sorted(out.items()))
