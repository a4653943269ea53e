"""A job's page (pure): what happened, in order, as a picture and as a table.

The picture is one lane per actor, one dot per event, placed by time. Gaps are drawn to
scale, except a gap longer than four times the (low) median one and over a second, which is
drawn at that cap with a break mark and labelled with its real length, so a call that
waited an hour for the reconciler still shows its first seconds. Then the table of events
(durations human-formatted), the settlement ledger (its ``usage_logs`` rows), the raw
stored events on demand, the provider's page for the task where there is one, and the
admin actions (buttons the page's script sends with the session's admin token).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from callwarden.projections.timeline import TimelineRow
from callwarden.replay.audit import AuditReport
from callwarden.service.charts import PALETTE
from callwarden.service.dashboard.format import credits, duration, when
from callwarden.service.dashboard.html import table
from callwarden.service.dashboard.links import provider_task_url

__all__ = ["gap_layout", "job_page", "lanes_svg"]

_LANE_H, _NAME_W, _PAD = 34, 150, 14


def gap_layout(gaps: Sequence[float]) -> tuple[list[float], float | None]:
    """Each gap's drawn length (seconds of the drawing) and the cap (``None``: none is
    capped). A gap over ``max(1 s, 4 × the low median gap)`` is drawn at that cap."""
    positive = [g for g in gaps if g > 0]
    if not positive:
        return [0.0 for _ in gaps], None
    cap = max(1.0, 4 * statistics.median_low(positive))
    if max(positive) <= cap:
        return list(gaps), None
    return [min(g, cap) for g in gaps], cap


def lanes_svg(rows: Sequence[TimelineRow], *, width: int = 900) -> str:
    """The timeline picture of ``rows``: one lane per actor (in order of first event)."""
    if not rows:
        return ""
    actors = list(dict.fromkeys(r.actor for r in rows))
    gaps = [r.since_previous_s or 0.0 for r in rows[1:]]
    drawn, cap = gap_layout(gaps)
    total = sum(drawn)
    plot = width - _NAME_W - 2 * _PAD
    xs = [float(_NAME_W + _PAD)]
    for d in drawn:
        xs.append(xs[-1] + (d / total * plot if total else plot / len(drawn)))
    height = len(actors) * _LANE_H + 30
    span = (rows[-1].at - rows[0].at).total_seconds()
    label = (f"Timeline of {len(rows)} events by {len(actors)} actor(s) over {duration(span)}"
             + (f"; gaps over {duration(cap)} are shortened" if cap else ""))
    out = [f'<svg class="lanes" role="img" aria-label="{escape(label)}" '
           f'viewBox="0 0 {width} {height}" width="100%" xmlns="http://www.w3.org/2000/svg">'
           f"<title>{escape(label)}</title>"]
    for i, actor in enumerate(actors):
        y = i * _LANE_H + _LANE_H / 2
        out.append(f'<text class="tick" x="{_NAME_W - 6}" y="{y + 4:.0f}" text-anchor="end" '
                   f'font-size="12">{escape(actor)}</text><line class="lane" x1="{_NAME_W}" '
                   f'y1="{y:.0f}" x2="{width - 4}" y2="{y:.0f}" stroke="#8884"/>')
    axis = len(actors) * _LANE_H + 4
    for i, g in enumerate(gaps):
        x0, x1 = xs[i], xs[i + 1]
        broken = cap is not None and g > cap
        if broken:
            mid = (x0 + x1) / 2
            out.append(f'<path class="break" d="M{mid - 4:.1f},{axis + 6} l4,-6 l4,6" '
                       f'fill="none" stroke="#c62828"/>')
        if broken or x1 - x0 >= 46:
            cls = "gap broken" if broken else "gap"
            out.append(f'<text class="{cls}" x="{(x0 + x1) / 2:.1f}" y="{axis + 20}" '
                       f'text-anchor="middle" font-size="10">{escape(duration(g))}</text>')
    out.append(f'<line class="axis" x1="{xs[0]:.1f}" y1="{axis}" x2="{xs[-1]:.1f}" '
               f'y2="{axis}" stroke="#888"/>')
    for r, x in zip(rows, xs, strict=True):
        lane = actors.index(r.actor)
        y = lane * _LANE_H + _LANE_H / 2
        colour = PALETTE[lane % len(PALETTE)]
        tip = (f"#{r.seq} {r.type} at {when(r.at)} by {r.actor}: "
               f"{r.state_before or '-'} -> {r.state_after}"
               + (f" (+{duration(r.since_previous_s)})" if r.since_previous_s else ""))
        out.append(f'<g class="event"><circle class="s{lane % len(PALETTE)}" cx="{x:.1f}" '
                   f'cy="{y:.0f}" r="6" fill="{colour}"><title>{escape(tip)}</title></circle>'
                   f'<text x="{x:.1f}" y="{y - 9:.0f}" text-anchor="middle" font-size="10">'
                   f"{r.seq}</text></g>")
    out.append("</svg>")
    return "".join(out)


def _summary(report: AuditReport) -> str:
    rows = report.timeline
    task = next((r.task_id for r in reversed(rows) if r.task_id), None)
    url = provider_task_url(report.provider_kind, task)
    task_html = escape(task or "-")
    if url:
        task_html += (f' (<a href="{escape(url)}" rel="noreferrer noopener" '
                      f'target="_blank">open on the provider</a>)')
    took = (rows[-1].at - rows[0].at).total_seconds() if len(rows) > 1 else None
    items = [("status", escape(report.status)), ("call state", escape(report.call_state or "-")),
             ("kind", escape(report.provider_kind or "-")), ("version", str(report.call_version)),
             ("upstream task", task_html),
             ("first event", escape(when(rows[0].at) if rows else "-")),
             ("first to last event", escape(duration(took)))]
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) \
        + "</dl>"


def _events(rows: Sequence[TimelineRow]) -> str:
    def settled(r: TimelineRow) -> str | None:
        if r.settlement is None:
            return None
        cost = "" if r.settled_cost is None else f" (cost {credits(r.settled_cost)})"
        return f"{r.settlement}{cost} by {r.settled_by}"
    return table(["seq", "event", "at", "after", "actor", "state", "task", "attempts",
                  "error", "detail", "settlement"], (
        [r.seq, r.type, r.at, duration(r.since_previous_s) if r.seq > 1 else None, r.actor,
         f"{r.state_before or '-'} -> {r.state_after}", r.task_id, r.attempts, r.error,
         r.detail, settled(r)] for r in rows), empty="no call events")


def _ledger(ledger: Sequence[Mapping[str, Any]]) -> str:
    return table(["row", "status", "reserved", "charged", "reserved at", "settled at",
                  "settled by event"], (
        [r["id"], r["status"], credits(float(r["credits_reserved"])),
         None if r["credits_charged"] is None else credits(float(r["credits_charged"])),
         r["created_at"], r["settled_at"],
         None if r["settled_by_seq"] is None else f"#{r['settled_by_seq']}"]
        for r in ledger), empty="no reservation")


def _payloads(events: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for e in events:
        try:
            text = json.dumps(json.loads(e["payload"]), indent=2, sort_keys=True)
        except ValueError:
            text = e["payload"]
        parts.append(f'<details><summary>#{e["seq"]} {escape(e["type"])} (v{e["version"]}, '
                     f'{escape(e["actor"])}, recorded {escape(when(e["recorded_at"]))})'
                     f"</summary><pre>{escape(text)}</pre></details>")
    return (f'<details class="raw"><summary>Raw stored events ({len(events)})</summary>'
            f'{"".join(parts)}</details>')


def _admin(report: AuditReport) -> str:
    j = escape(report.job_id)
    return (f'<section class="admin" aria-labelledby="admin-h" data-job="{j}">'
            '<h2 id="admin-h">Admin actions</h2>'
            '<form id="token-form" class="token" hidden><label for="admin-token">Admin token '
            '(kept for this browser session only)</label> <input id="admin-token" '
            'type="password" autocomplete="off"> <button type="submit">Use token</button> '
            '<button type="button" id="forget-token">Forget token</button></form>'
            '<p class="actions" hidden>'
            '<button type="button" class="danger" data-action="force-fail">Force-fail '
            '(cancel, refund)</button> <button type="button" data-action="requeue-reconcile">'
            "Requeue for the reconciler</button></p>"
            '<p id="admin-status" role="status" aria-live="polite"></p>'
            f'<noscript><p class="muted">Without JavaScript: <code>curl -X POST -H '
            f"'Authorization: Bearer $TOKEN' /admin/jobs/{j}/force-fail</code> or "
            "<code>.../requeue-reconcile</code></p></noscript></section>")


def job_page(report: AuditReport, ledger: Sequence[Mapping[str, Any]],
             events: Sequence[Mapping[str, Any]]) -> str:
    """The page's body: ``ledger`` rows of ``dashboard_ledger``, ``events`` of
    ``dashboard_job_events``."""
    return (_summary(report) + "<h2>Timeline</h2>"
            + f'<figure class="story">{lanes_svg(report.timeline)}</figure>'
            + _events(report.timeline) + "<h2>Settlement ledger</h2>" + _ledger(ledger)
            + "<h2>Stored events</h2>" + _payloads(events) + _admin(report))

