"""The overview page's content (pure): calls in flight and stale per kind with their
thresholds, calls reaching each terminal state over the window, who ended them, time to
terminal per kind, credits settled over time, and the lists (stale, exhausted, recent);
when provider accounts are limited, a card of their caps and calls in flight, and when a
job waits for a provider account's slot, a card of the waiting jobs per account
(:mod:`.waiting`).

:func:`overview` renders the part the page's script refreshes (``/overview/live``); the
page itself is the same markup in the frame, so it reads complete without JavaScript.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

import msgspec

from callwarden.rules.stale import StaleRule
from callwarden.service import charts
from callwarden.service.dashboard.format import credits, duration
from callwarden.service.dashboard.html import table
from callwarden.service.dashboard.waiting import limits_card, waiting_card

__all__ = ["OPEN_STATES", "ORIGIN", "TERMINAL", "WINDOWS", "Overview", "Window", "overview"]

Row = Mapping[str, Any]
OPEN_STATES = ("created", "polling", "upstream_succeeded", "finalizing")
#: terminal event type -> the state it ends the call in (as the charts name it)
TERMINAL = {"Completed": "completed", "UpstreamFailed": "failed", "Swept": "swept",
            "Exhausted": "exhausted", "Cancelled": "cancelled", "HostEnded": "host ended"}
ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # buckets are aligned on it


class Window(msgspec.Struct, frozen=True):
    name: str
    label: str
    bucket: timedelta
    buckets: int

    def starts(self, now: datetime) -> list[datetime]:
        """The buckets' start times: the last one holds ``now``."""
        last = now - (now - ORIGIN) % self.bucket
        return [last - (self.buckets - 1 - i) * self.bucket for i in range(self.buckets)]


WINDOWS = {"hour": Window("hour", "last hour", timedelta(minutes=5), 12),
           "day": Window("day", "last day", timedelta(hours=1), 24)}


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    """What the overview shows: the rows of its queries (service.sql, dashboard_*)."""

    now: datetime
    window: Window
    stale_rule: StaleRule
    open_calls: Sequence[Row]     # metrics_open_calls: kind, state, calls
    stale_counts: Sequence[Row]   # metrics_stale_calls: kind, stale
    terminal: Sequence[Row]       # dashboard_terminal_buckets: bucket, type, actor, calls
    latency: Sequence[Row]        # rollup.latency_rows: kind, calls, pcts (p50, p95)
    settled: Sequence[Row]        # dashboard_credit_buckets: bucket, committed, ...
    stale: Sequence[Row]          # dashboard_stale_calls
    exhausted: Sequence[Row]      # dashboard_recent_outcomes (Exhausted)
    recent: Sequence[Row]         # dashboard_recent_outcomes (every terminal type)
    waiting: Sequence[Row] = ()   # metrics_waiting: account, jobs, oldest, next_retry, ...
    limits: Sequence[Row] = ()    # limits_show: account, kinds, caps, open_calls, ...


def _switch(current: Window) -> str:
    links = []
    for w in WINDOWS.values():
        here = ' aria-current="true"' if w.name == current.name else ""
        links.append(f'<a href="/?window={w.name}"{here}>{escape(w.label)}</a>')
    return f'<p class="switch">Window: {" · ".join(links)}</p>'


def in_flight(o: Overview) -> str:
    """Open calls per kind and state, stale per kind, and each kind's threshold."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for r in o.open_calls:
        counts[r["kind"]][r["state"]] = int(r["calls"])
    stale = {r["kind"]: int(r["stale"]) for r in o.stale_counts}
    rows = []
    for kind in sorted(set(counts) | set(stale)):
        by_state = counts.get(kind, {})
        rows.append([kind, *(by_state.get(s, 0) for s in OPEN_STATES),
                     sum(by_state.values()), stale.get(kind, 0),
                     duration(o.stale_rule.threshold_for(None if kind == "-" else kind))])
    note = (f'<p class="muted">A call that heartbeats is stale after '
            f"{escape(duration(o.stale_rule.heartbeat_timeout_s))} without a heartbeat; one "
            f"that does not, after its kind's threshold (unknown kinds: "
            f"{escape(duration(o.stale_rule.legacy_threshold_s))}).</p>")
    return ("<h2>Calls in flight</h2>" + table(
        ["kind", *OPEN_STATES, "in flight", "stale", "stale after"], rows,
        empty="no call in flight") + note)


def _labels(starts: Sequence[datetime], w: Window) -> list[str]:
    return [s.strftime("%H:%M") for s in starts]


def _index(starts: Sequence[datetime]) -> dict[datetime, int]:
    return {s: i for i, s in enumerate(starts)}


def ended_chart(o: Overview) -> str:
    starts = o.window.starts(o.now)
    at = _index(starts)
    per: dict[str, list[float]] = {s: [0.0] * len(starts) for s in TERMINAL.values()}
    for r in o.terminal:
        i = at.get(r["bucket"])
        if i is not None and r["type"] in TERMINAL:
            per[TERMINAL[r["type"]]][i] += r["calls"]
    series = [(name, vs) for name, vs in per.items() if any(vs)]
    total = sum(sum(vs) for _, vs in series)
    label = (f"Calls ended per {duration(o.window.bucket.total_seconds())}, "
             f"{o.window.label}, by terminal state: {total:.0f} in all")
    chart = charts.stacked_bars(label, _labels(starts, o.window),
                                series or [("completed", per["completed"])])
    return "<h2>Calls ended</h2>" + chart


def enders(o: Overview) -> str:
    """Who ended the calls of the window: the actor role of each terminal event."""
    by_role: dict[str, float] = defaultdict(float)
    cells: dict[tuple[str, str], int] = defaultdict(int)
    for r in o.terminal:
        role = str(r["actor"]).split(":", 1)[0]  # worker:<id> -> worker
        by_role[role] += r["calls"]
        cells[(role, TERMINAL.get(r["type"], str(r["type"])))] += int(r["calls"])
    if not by_role:
        return ('<h2>Who ended them</h2><p class="muted">no call ended in the '
                f"{escape(o.window.label)}</p>")
    items = sorted(by_role.items(), key=lambda kv: (-kv[1], kv[0]))
    states = [s for s in TERMINAL.values() if any(k[1] == s for k in cells)]
    rows = [[role, *(cells.get((role, s), 0) for s in states)] for role, _ in items]
    return ("<h2>Who ended them</h2>"
            + charts.hbars(f"Calls ended in the {o.window.label} by who ended them", items)
            + table(["ended by", *states], rows))


def latency(o: Overview) -> str:
    rows = []
    for r in o.latency:
        p50, p95 = r["pcts"] or (None, None)
        rows.append([r["kind"], r["calls"], duration(p50), duration(p95)])
    return (f"<h2>Time to terminal, {escape(o.window.label)}</h2>"
            + table(["kind", "calls", "p50", "p95"], rows, empty="no call finished"))


def credit_chart(o: Overview) -> str:
    starts = o.window.starts(o.now)
    at = _index(starts)
    series: dict[str, list[float]] = {k: [0.0] * len(starts)
                                      for k in ("committed", "released", "refunded")}
    for r in o.settled:
        i = at.get(r["bucket"])
        if i is not None:
            for k, vs in series.items():
                vs[i] += float(r[k])
    sums = {k: sum(vs) for k, vs in series.items()}
    label = (f"Credits settled per {duration(o.window.bucket.total_seconds())}, "
             f"{o.window.label}: " + ", ".join(f"{k} {credits(v)}" for k, v in sums.items()))
    return "<h2>Credits settled</h2>" + charts.lines(label, _labels(starts, o.window),
                                                     list(series.items()), fmt=credits)


def _outcomes(rows: Sequence[Row], empty: str) -> str:
    return table(["job", "event", "kind", "state", "ended by", "at", "error", "settlement"], (
        [r["job_id"], r["type"], r["provider_kind"], r["call_state"], r["actor"],
         r["recorded_at"], r["error_message"], r["call_settlement"]] for r in rows),
        link_first=True, empty=empty)


def lists(o: Overview) -> str:
    stale = table(
        ["job", "kind", "state", "task", "call started", "attempts", "last error", "heartbeat"],
        ([r["id"], r["provider_kind"], r["call_state"], r["provider_task_id"],
          r["provider_call_started_at"], r["reconcile_attempts"], r["reconcile_last_error"],
          r["heartbeat_at"]] for r in o.stale), link_first=True, empty="no stale call")
    return ("<h2>Stale calls</h2>" + stale
            + "<h2>Exhausted calls</h2>" + _outcomes(o.exhausted, "no exhausted call")
            + "<h2>Recent outcomes</h2>" + _outcomes(o.recent, "no call ended recently"))


def overview(o: Overview) -> str:
    """The live part of the overview (the script swaps it every few seconds)."""
    stamp = o.now.astimezone(UTC).strftime("%H:%M:%S UTC")
    return (f'<div id="live" data-window="{escape(o.window.name)}">'
            f'<p class="muted" id="stamp" role="status">As of {escape(stamp)}</p>'
            + _switch(o.window)
            + '<div class="grid">'
            + f'<section class="card wide">{in_flight(o)}</section>'
            + limits_card(o.limits)
            + waiting_card(o.waiting, o.now)
            + f'<section class="card">{ended_chart(o)}</section>'
            + f'<section class="card">{enders(o)}</section>'
            + f'<section class="card">{latency(o)}</section>'
            + f'<section class="card">{credit_chart(o)}</section>'
            + f'<section class="card wide">{lists(o)}</section>'
            + "</div></div>")
