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
import re
import statistics
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlsplit

import msgspec

from callwarden.events.states import LEGAL, CallState
from callwarden.projections.timeline import TimelineRow
from callwarden.replay.audit import AuditReport
from callwarden.service.charts import PALETTE
from callwarden.service.dashboard.format import credits, duration, when
from callwarden.service.dashboard.html import TOKEN_FORM, Cell, raw, table
from callwarden.service.dashboard.links import provider_task_url
from callwarden.service.dashboard.redaction import redact_text, redact_value

__all__ = ["ACTIONS", "MIN_STEP", "JobIO", "gap_layout", "job_page", "lanes_svg", "legal_actions",
           "media_origin", "safe_url"]

_LANE_H, _PAD = 34, 14
MIN_STEP = 30.0   # between two markers: room for a marker (12) and a seq label (4 digits)
_NAME_CHARS = 24   # a lane label longer than this is cut (in full in its tooltip)


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


def _label_w(text: str, size: float) -> float:
    """A generous estimate of ``text``'s width at ``size`` (user units): wide enough for
    any sans-serif, so what is laid out by it never touches its neighbour."""
    return len(text) * size * 0.62 + 4


def _lane_name(actor: str) -> str:
    return actor if len(actor) <= _NAME_CHARS else actor[:_NAME_CHARS - 1] + "\u2026"


def _steps(gaps: Sequence[float], drawn: Sequence[float], floors: Sequence[float],
           plot: float) -> list[float]:
    """Each gap's length on the drawing: its floor (room for the markers and a label),
    plus its share of what is left of ``plot``, in proportion to its drawn seconds."""
    free = max(0.0, plot - sum(floors))
    total = sum(drawn)
    return [f + (d / total * free if total else free / len(gaps))
            for f, d in zip(floors, drawn, strict=True)]


def lanes_svg(rows: Sequence[TimelineRow], *, width: int = 900) -> str:
    """The timeline picture of ``rows``: one lane per actor (in order of first event).

    No two markers overlap at any width: consecutive events are at least
    :data:`MIN_STEP` apart on the drawing (the picture is scaled as a whole, so what does
    not overlap in its own units overlaps at no size), a shortened gap is wide enough for
    its label, and the drawing grows when the events need more room than ``width``. The
    lane labels get the room the longest needs (a name over :data:`_NAME_CHARS`
    characters is cut, in full in its tooltip)."""
    if not rows:
        return ""
    actors = list(dict.fromkeys(r.actor for r in rows))
    gaps = [r.since_previous_s or 0.0 for r in rows[1:]]
    drawn, cap = gap_layout(gaps)
    name_w = max(60.0, max(_label_w(_lane_name(a), 12) for a in actors)) + 10
    broken = [cap is not None and g > cap for g in gaps]
    floors = [max(MIN_STEP, _label_w(duration(g), 10) + 8) if b else MIN_STEP
              for g, b in zip(gaps, broken, strict=True)]
    width = max(width, round(name_w + 2 * _PAD + sum(floors) + 1))
    plot = width - name_w - 2 * _PAD
    xs = [name_w + _PAD]
    for step in (_steps(gaps, drawn, floors, plot) if gaps else []):
        xs.append(xs[-1] + step)
    height = len(actors) * _LANE_H + 30
    span = (rows[-1].at - rows[0].at).total_seconds()
    label = (f"Timeline of {len(rows)} events by {len(actors)} actor(s) over {duration(span)}"
             + (f"; gaps over {duration(cap)} are shortened" if cap else ""))
    out = [f'<svg class="lanes" role="img" aria-label="{escape(label)}" '
           f'viewBox="0 0 {width} {height}" width="100%" xmlns="http://www.w3.org/2000/svg">'
           f"<title>{escape(label)}</title>"]
    for i, actor in enumerate(actors):
        y = i * _LANE_H + _LANE_H / 2
        out.append(f'<text class="tick lane-name" x="{name_w - 6:.1f}" y="{y + 4:.0f}" '
                   f'text-anchor="end" font-size="12"><title>{escape(actor)}</title>'
                   f'{escape(_lane_name(actor))}</text><line class="lane" x1="{name_w:.1f}" '
                   f'y1="{y:.0f}" x2="{width - 4}" y2="{y:.0f}" stroke="#8884"/>')
    axis = len(actors) * _LANE_H + 4
    for i, g in enumerate(gaps):
        x0, x1 = xs[i], xs[i + 1]
        text = duration(g)
        if broken[i]:
            mid = (x0 + x1) / 2
            out.append(f'<path class="break" d="M{mid - 4:.1f},{axis + 6} l4,-6 l4,6" '
                       f'fill="none" stroke="#c62828"/>')
        if broken[i] or x1 - x0 >= _label_w(text, 10) + 8:
            cls = "gap broken" if broken[i] else "gap"
            out.append(f'<text class="{cls}" x="{(x0 + x1) / 2:.1f}" y="{axis + 20}" '
                       f'text-anchor="middle" font-size="10">{escape(text)}</text>')
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


def _words(name: str) -> Cell:
    """An event type that may wrap between its words (``Reconcile``/``Attempted``)."""
    return raw(re.sub(r"(?<=[a-z])(?=[A-Z])", "<wbr>", escape(name)))


def _events(rows: Sequence[TimelineRow]) -> str:
    def settled(r: TimelineRow) -> str | None:
        if r.settlement is None:
            return None
        cost = "" if r.settled_cost is None else f" (cost {credits(r.settled_cost)})"
        return f"{r.settlement}{cost} by {r.settled_by}"

    def shown(text: str | None) -> str | None:
        return None if text is None else redact_text(text)
    return table(["seq", "event", "at", "after", "actor", "state", "task", "attempts",
                  "error", "detail", "settlement"], (
        [r.seq, _words(r.type), r.at, duration(r.since_previous_s) if r.seq > 1 else None, r.actor,
         f"{r.state_before or '-'} -> {r.state_after}", r.task_id, r.attempts,
         shown(r.error), shown(r.detail), settled(r)] for r in rows),
        empty="no call events", fit=True, long=(4, 5, 6, 8, 9, 10))


def _ledger(ledger: Sequence[Mapping[str, Any]]) -> str:
    return table(["row", "status", "reserved", "charged", "reserved at", "settled at",
                  "settled by event"], (
        [r["id"], r["status"], credits(float(r["credits_reserved"])),
         None if r["credits_charged"] is None else credits(float(r["credits_charged"])),
         r["created_at"], r["settled_at"],
         None if r["settled_by_seq"] is None else f"#{r['settled_by_seq']}"]
        for r in ledger), empty="no reservation")


def _pretty(stored: str | None) -> str:
    """A stored JSON text indented, secrets redacted (:mod:`.redaction`); a text that is
    not JSON redacted as text."""
    if stored is None:
        return ""
    try:
        return json.dumps(redact_value(json.loads(stored)), indent=2, sort_keys=True,
                          ensure_ascii=False)
    except ValueError:
        return redact_text(stored)


def _payloads(events: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for e in events:
        parts.append(f'<details><summary>#{e["seq"]} {escape(e["type"])} (v{e["version"]}, '
                     f'{escape(e["actor"])}, recorded {escape(when(e["recorded_at"]))})'
                     f"</summary><pre>{escape(_pretty(e['payload']))}</pre></details>")
    return (f'<details class="raw"><summary>Raw stored events ({len(events)})</summary>'
            f'{"".join(parts)}</details>')


ACTIONS = {"force-fail": "Force-fail (cancel, refund)",
           "requeue-reconcile": "Requeue for the reconciler"}
#: The event each action appends (:mod:`.bulk`, for one job or many): an action is legal
#: when the transition table lets that event follow the call's state.
ACTION_EVENTS = {"force-fail": "Cancelled", "requeue-reconcile": "ReconcileAttempted"}


def legal_actions(call_state: str | None) -> list[str]:
    """The admin actions the call's state allows (:data:`callwarden.events.states.LEGAL`):
    force-fail until the call ends (also a job whose call never started), a requeue
    while a call is open; none once it has ended (the server answers 409 to them)."""
    try:
        state = None if call_state is None else CallState(call_state)
    except ValueError:  # a state this version does not know: offer nothing
        return []
    return [a for a, event in ACTION_EVENTS.items() if (state, event) in LEGAL]


def _admin(report: AuditReport, enabled: bool) -> str:
    head = '<section class="admin" aria-labelledby="admin-h"{}><h2 id="admin-h">Admin actions</h2>'
    if not enabled:
        return (head.format("") + '<p class="muted">Disabled: this service has no admin '
                "token configured (read-only).</p></section>")
    actions = legal_actions(report.call_state)
    if not actions:
        why = f"the call has ended ({report.call_state or '-'})"
        return head.format("") + f'<p class="muted">No action applies: {escape(why)}.</p>' \
            + "</section>"
    j = escape(report.job_id)
    danger = ' class="danger"'
    buttons = " ".join(
        f'<button type="button"{danger if a == "force-fail" else ""} '
        f'data-action="{a}">{escape(ACTIONS[a])}</button>' for a in actions)
    curl = " or ".join(f"<code>curl -X POST -H 'Authorization: Bearer $TOKEN' "
                       f"/admin/jobs/{j}/{a}</code>" for a in actions)
    return (head.format(f' data-job="{j}"')
            + TOKEN_FORM
            + f'<p class="actions" hidden>{buttons}</p>'
            '<p id="admin-status" role="status" aria-live="polite"></p>'
            f'<noscript><p class="muted">Without JavaScript: {curl}</p></noscript></section>')


class JobIO(msgspec.Struct, frozen=True, kw_only=True):
    """What went into a job and what came out of it: its ``jobs`` row's request, result
    and error (JSON texts as stored) and its ``assets`` rows (``dashboard_job_io``,
    ``dashboard_job_assets``)."""

    input_data: str | None = None
    output_data: str | None = None
    error_message: str | None = None
    assets: Sequence[Mapping[str, Any]] = ()


_NETLOC = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def safe_url(url: str) -> str | None:
    """``url`` if the page may link to it: http(s) or a path on this origin, with no user
    info, query string or fragment (where signatures and tokens travel); else ``None``."""
    if any(c in url for c in " \t\r\n\"'<>\\"):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.query or parts.fragment:
        return None
    if parts.scheme in ("http", "https") and _NETLOC.fullmatch(parts.netloc):
        return url
    if not parts.scheme and not parts.netloc and url.startswith("/"):
        return url
    return None


def media_origin(url: str) -> str | None:
    """The origin of a :func:`safe_url` on another site (for the page's
    Content-Security-Policy), ``None`` for this origin's paths or an unsafe URL."""
    if safe_url(url) is None:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme else None


def _prompts(value: Any, found: list[str]) -> list[str]:
    """Every string under a key naming a prompt, in document order."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and "prompt" in k.lower() and isinstance(v, str) and v:
                found.append(v)
            else:
                _prompts(v, found)
    elif isinstance(value, list):
        for v in value:
            _prompts(v, found)
    return found


def _decoded(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _preview(a: Mapping[str, Any]) -> str:
    url, kind = str(a["url"]), str(a["content_type"] or "")
    href = safe_url(url)
    what = (f'{escape(a["storage_key"])} <span class="muted">({escape(kind)}, '
            f'{escape(_size(a["size_bytes"]))})</span>')
    if href is None:
        return (f'<li><p>{what}</p><p class="muted">{escape(redact_text(url))} (not linked: '
                "it carries a query string or user info, where tokens travel)</p></li>")
    src = escape(href)
    alt = escape(f"stored {kind} {a['storage_key']}")
    if kind.startswith("image/"):
        media = f'<img class="preview" src="{src}" alt="{alt}" loading="lazy">'
    elif kind.startswith("audio/"):
        media = f'<audio class="preview" controls preload="metadata" src="{src}"></audio>'
    elif kind.startswith("video/"):
        media = (f'<video class="preview" controls preload="metadata" src="{src}">'
                 "</video>")
    else:
        media = ""
    return (f'<li>{media}<p><a href="{src}" rel="noreferrer noopener" target="_blank">'
            f"{what}</a></p></li>")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def _completed(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The payload of the job's last ``Completed`` event (its text, media), or ``{}``."""
    for e in reversed(events):
        if e["type"] == "Completed":
            payload = _decoded(e["payload"])
            return payload if isinstance(payload, dict) else {}
    return {}


def _io(io: JobIO, events: Sequence[Mapping[str, Any]]) -> str:
    """The request (its prompt first), then the stored media with previews, the text
    result, the stored result and the error: every string redacted and escaped."""
    request = _decoded(io.input_data)
    prompts = _prompts(request, [])
    went = "".join(f'<blockquote class="prompt">{escape(redact_text(p))}</blockquote>'
                   for p in prompts) or '<p class="muted">no prompt in the request</p>'
    went += (f'<pre class="request" tabindex="0">{escape(_pretty(io.input_data))}</pre>'
             if io.input_data not in (None, "{}", "null") else
             '<p class="muted">no request stored on the job</p>')
    done = _completed(events)
    out = []
    if io.assets:
        out.append('<ul class="media">' + "".join(_preview(a) for a in io.assets) + "</ul>")
    text = done.get("text")
    if isinstance(text, str) and text:
        out.append(f'<h3>Text</h3><pre class="text" tabindex="0">{escape(redact_text(text))}'
                   "</pre>")
    if io.output_data not in (None, "null"):
        out.append('<h3>Stored result (jobs.output_data)</h3><pre class="result" '
                   f'tabindex="0">{escape(_pretty(io.output_data))}</pre>')
    if io.error_message:
        out.append(f'<p class="error">Error: {escape(redact_text(io.error_message))}</p>')
    came = "".join(out) or '<p class="muted">nothing yet: no media, text or result</p>'
    return ('<section class="io" aria-labelledby="io-h"><h2 id="io-h">What went in, what '
            'came out</h2><div class="io-grid"><div><h3>Request</h3>' + went
            + "</div><div><h3>Result</h3>" + came + "</div></div></section>")


def job_page(report: AuditReport, ledger: Sequence[Mapping[str, Any]],
             events: Sequence[Mapping[str, Any]], *, io: JobIO | None = None,
             admin: bool = False) -> str:
    """The page's body: ``ledger`` rows of ``dashboard_ledger``, ``events`` of
    ``dashboard_job_events``, ``io`` the job's request and results; ``admin``: whether
    the service has an admin token (else no action is offered)."""
    return (_summary(report) + _io(io or JobIO(), events) + "<h2>Timeline</h2>"
            + f'<figure class="story">{lanes_svg(report.timeline)}</figure>'
            + _events(report.timeline) + "<h2>Settlement ledger</h2>" + _ledger(ledger)
            + "<h2>Stored events</h2>" + _payloads(events) + _admin(report, admin))
