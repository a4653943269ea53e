"""A job's page (pure): what happened, in order, as a picture and as a table.

The picture is the timeline's lanes (:mod:`callwarden.service.dashboard.timeline`: one
lane per actor, one dot per event, long gaps shortened). Then the table of events
(durations human-formatted), the settlement ledger (its ``usage_logs`` rows), the raw
stored events on demand, the provider's page for the task where there is one, and the
admin actions (buttons the page's script sends with the session's admin token).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlsplit

import msgspec

from callwarden.events.states import LEGAL, CallState
from callwarden.projections.timeline import TimelineRow
from callwarden.replay.audit import AuditReport
from callwarden.service.dashboard.format import credits, duration, when
from callwarden.service.dashboard.html import TOKEN_FORM, Cell, raw, table
from callwarden.service.dashboard.links import provider_task_url
from callwarden.service.dashboard.redaction import redact_text, redact_value
from callwarden.service.dashboard.timeline import lanes_svg

__all__ = ["ACTIONS", "JobIO", "job_page", "legal_actions", "media_origin", "safe_url"]


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
