"""The call list (pure): its filters read from the query string, the keyset cursor, and
the page (a filter form, the table, a "next page" link that keeps the filters).

Filters: kind, call state, who ended the call (the terminal event's actor role), a range
of call starts (``from``/``to``, UTC), and text in the job's or the reconciler's last
error (a case-insensitive substring: ``%`` and ``_`` match themselves). Pages are keyed by
``(call start, job id)``, newest first: the cursor is the last row's key, never an offset.

When the service takes admin actions, each row has a checkbox (naming the actions its
state allows) and the page a bulk panel: select rows, or every call matching the filter,
then an action, confirmed with the count of calls and credits its preview states
(:mod:`.bulk`). Both are hidden until the page's script shows them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.providers.kinds import KINDS
from callwarden.service.dashboard.format import duration
from callwarden.service.dashboard.html import TOKEN_FORM, Cell, raw, table
from callwarden.service.dashboard.overview import OPEN_STATES
from callwarden.service.dashboard.story import ACTIONS, legal_actions

__all__ = ["ACTORS", "BULK_LIMIT", "STATES", "BadFilter", "Filters", "bulk_panel", "calls_page",
           "ilike_pattern", "parse_filters"]

STATES = (*OPEN_STATES, "completed", "failed", "swept", "exhausted", "cancelled")
ACTORS = ("worker", "reconciler", "webhook", "admin", "host", "user")
PAGE = 50
BULK_LIMIT = 500  # jobs per bulk admin action (:mod:`.bulk`)


class BadFilter(CallwardenError, ValueError):
    """A filter value the list cannot use (the page says which)."""


class Filters(msgspec.Struct, frozen=True, kw_only=True):
    kind: str | None = None
    state: str | None = None
    actor: str | None = None
    start: datetime | None = None  # the query string's "from"
    end: datetime | None = None    # "to"
    error: str | None = None
    cursor: tuple[datetime, uuid.UUID] | None = None

    def query(self, **changes: str | None) -> str:
        """The query string of these filters (without the cursor), with ``changes``."""
        pairs = {"kind": self.kind, "state": self.state, "actor": self.actor,
                 "from": _stamp(self.start), "to": _stamp(self.end), "error": self.error}
        pairs.update(changes)
        return urlencode({k: v for k, v in pairs.items() if v})


def _stamp(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _time(name: str, text: str) -> datetime | None:
    if not text:
        return None
    try:
        at = _utc(datetime.fromisoformat(text))
    except (ValueError, OverflowError):  # OverflowError: a zone that leaves the calendar
        raise BadFilter(f"{name}: not a date and time: {text!r}") from None
    return at


def _utc(at: datetime) -> datetime:
    """``at`` in UTC (a naive time is read as UTC)."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _choice(name: str, text: str, allowed: Sequence[str]) -> str | None:
    if not text:
        return None
    if text not in allowed:
        raise BadFilter(f"{name}: unknown value {text!r}")
    return text


def encode_cursor(at: datetime, job_id: uuid.UUID) -> str:
    return f"{at.astimezone(UTC).isoformat()}_{job_id}"


def parse_cursor(text: str) -> tuple[datetime, uuid.UUID] | None:
    if not text:
        return None
    at, _, job = text.rpartition("_")
    try:
        return _utc(datetime.fromisoformat(at)), uuid.UUID(job)
    except (ValueError, OverflowError):
        raise BadFilter(f"not a page cursor: {text!r}") from None


def parse_filters(query: Mapping[str, str]) -> Filters:
    """The filters of a query string; :class:`BadFilter` names a value that is wrong.
    A kind this version does not know is accepted (old rows may carry one)."""
    def get(name: str) -> str:
        value = query.get(name, "").strip()
        if "\x00" in value:  # Postgres refuses NUL in text: a 400, not a 500
            raise BadFilter(f"{name}: contains a NUL character")
        return value
    return Filters(kind=get("kind") or None, state=_choice("state", get("state"), STATES),
                   actor=_choice("ended by", get("actor"), ACTORS),
                   start=_time("from", get("from")), end=_time("to", get("to")),
                   error=get("error") or None, cursor=parse_cursor(get("cursor")))


def ilike_pattern(text: str) -> str:
    """An ILIKE pattern matching ``text`` anywhere (``\\`` is the escape character)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def sql_params(f: Filters, limit: int = PAGE) -> dict[str, Any]:
    """The parameters of ``dashboard_list_calls``; one row more than a page tells whether
    there is a next one."""
    return {"kind": f.kind, "states": None if f.state is None else [f.state],
            "actor": f.actor, "user_id": None, "from": f.start, "to": f.end,
            "error": None if f.error is None else ilike_pattern(f.error),
            "cursor_at": f.cursor[0] if f.cursor else None,
            "cursor_id": f.cursor[1] if f.cursor else None, "limit": limit + 1}


def _select(name: str, label: str, options: Sequence[str], current: str | None) -> str:
    opts = ['<option value="">any</option>'] + [
        f'<option value="{escape(o)}"{" selected" if o == current else ""}>{escape(o)}</option>'
        for o in options]
    return (f'<label>{escape(label)} <select name="{name}">{"".join(opts)}</select></label>')


def _input(name: str, label: str, value: str | None, kind: str = "text") -> str:
    return (f'<label>{escape(label)} <input type="{kind}" name="{name}" '
            f'value="{escape(value or "")}"></label>')


def filter_form(f: Filters) -> str:
    kinds = sorted(set(KINDS) | ({f.kind} if f.kind else set()))
    return ('<form class="filters" action="/jobs" method="get" aria-label="filter calls">'
            + _select("kind", "kind", kinds, f.kind)
            + _select("state", "call state", STATES, f.state)
            + _select("actor", "ended by", ACTORS, f.actor)
            + _input("from", "started from (UTC)", _stamp(f.start), "datetime-local")
            + _input("to", "to (UTC)", _stamp(f.end), "datetime-local")
            + _input("error", "error contains", f.error)
            + '<button type="submit">Filter</button> <a href="/jobs">clear</a></form>')


def _picks(rows: Sequence[Mapping[str, Any]]) -> tuple[Cell, list[Cell]]:
    """The checkbox column: one box per row, naming the actions its call state allows."""
    head = raw('<th scope="col" class="pick" hidden><input type="checkbox" id="pick-page" '
               'aria-label="select every call on this page"></th>')
    cells = [raw(f'<td class="pick" hidden><input type="checkbox" class="pick-row" '
                 f'value="{escape(str(r["id"]))}" '
                 f'data-actions="{escape(" ".join(legal_actions(r["call_state"])))}" '
                 f'aria-label="select {escape(str(r["id"]))}"></td>') for r in rows]
    return head, cells


def bulk_panel(f: Filters) -> str:
    """The bulk actions' panel (the script shows it): the token form, "every call matching
    the filter", one button per action (shown for a selection it is legal for), the
    confirmation dialog and the status line."""
    danger = ' class="danger"'
    buttons = " ".join(
        f'<button type="button"{danger if a == "force-fail" else ""} data-bulk="{a}" '
        f'hidden>{escape(ACTIONS[a])}</button>' for a in ACTIONS)
    return (f'<section class="bulk" id="bulk" aria-labelledby="bulk-h" '
            f'data-filter="{escape(f.query())}" hidden><h2 id="bulk-h">Bulk actions</h2>'
            + TOKEN_FORM + '<p class="bulk-bar"><label><input type="checkbox" id="pick-all"> '
            f'Every call matching the filter (up to {BULK_LIMIT})</label> '
            f'<span id="bulk-count">No call selected</span> {buttons}</p>'
            '<p id="bulk-status" role="status" aria-live="polite"></p>'
            '<dialog id="bulk-confirm" aria-labelledby="bulk-title" '
            'aria-describedby="bulk-question"><h2 id="bulk-title">Confirm</h2>'
            '<p id="bulk-question"></p><p class="bulk-bar"><button type="button" '
            'id="bulk-go" class="danger">Confirm</button> <button type="button" '
            'id="bulk-cancel">Cancel</button></p></dialog></section>')


def calls_page(f: Filters, rows: Sequence[Mapping[str, Any]], *, limit: int = PAGE,
               admin: bool = False) -> str:
    """The form, one page of ``rows`` (up to ``limit + 1``: the extra one means a next
    page exists) and the link to it; with ``admin``, the rows' checkboxes and the bulk
    panel."""
    shown = rows[:limit]
    body = table(["job", "kind", "state", "ended by", "task", "call started", "took",
                  "error"], ([r["id"], r["provider_kind"], r["call_state"], r["ended_by"],
                              r["provider_task_id"], r["started_at"], _took(r), r["error"]]
                             for r in shown), link_first=True, empty="no call matches",
                 lead=_picks(shown) if admin else None)
    more = ""
    if len(rows) > limit:
        last = shown[-1]
        q = f.query(cursor=encode_cursor(last["started_at"], last["id"]))
        more = f'<p class="pager"><a rel="next" href="/jobs?{escape(q)}">Next page</a></p>'
    first = "" if f.cursor is None else (
        f'<p class="pager"><a href="/jobs?{escape(f.query())}">First page</a></p>')
    panel = bulk_panel(f) if admin and shown else ""
    return filter_form(f) + panel + f'<p class="muted">{len(shown)} call(s) on this page</p>' \
        + body + more + first


def _took(r: Mapping[str, Any]) -> str | None:
    if r["finished_at"] is None or r["started_at"] is None:
        return None
    return duration((r["finished_at"] - r["started_at"]).total_seconds())
