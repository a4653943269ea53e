"""The admin actions on one job or many (the I/O half; the routes and the admin token
check are :mod:`callwarden.service.operator`'s).

One decision per action, the same for the single-job endpoints and the bulk one:
force-fail appends ``Cancelled(by="admin")`` unless the call has ended (the refund is in
the same statement), requeue-reconcile appends ``ReconcileAttempted(outcome="requeued",
next_attempt_at=None)`` while a call is open. Each job is its own transition through the
write path (:func:`callwarden.database.write.transition`): a bulk action is many single
ones, never one statement over many rows.

A bulk action (``POST /admin/bulk/{action}``) has two phases:

- the preview, a dry run: a selection (``{"job_ids": [...]}``) or the call list's filter
  (``{"filter": {"state": "polling", "kind": ...}}``, the names of ``/jobs``' query
  string; a filter reaches the calls with a recorded state, at most :data:`LIMIT`, newest
  call start first) becomes the calls the action is legal for, with their call states,
  how many, and the credits they hold reserved: what a force-fail refunds, what a requeue
  leaves reserved. It writes nothing.
- the run (``{"confirm": <the preview's jobs>}``): the action on each of those jobs whose
  call state is still the one previewed; any other is skipped, with the reason, never
  forced. It answers how many were applied and skipped, and the credits refunded (the
  ``usage_logs`` rows the appended events settled).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec

from callwarden.database.boundary import connection
from callwarden.database.db import Conn, Pool
from callwarden.database.write import AppendResult, Decide, execute, transition
from callwarden.errors import ConflictExhausted, JobNotFound
from callwarden.events.errors import CallwardenError
from callwarden.events.types import Cancelled, Event, ReconcileAttempted
from callwarden.projections.fold import CallProjection
from callwarden.service.dashboard.calls import (
    BULK_LIMIT,
    STATES,
    BadFilter,
    parse_filters,
    sql_params,
)
from callwarden.service.dashboard.format import credits
from callwarden.service.dashboard.story import ACTIONS, legal_actions

__all__ = ["LIMIT", "BadBulk", "act", "bulk", "decision"]

LIMIT = BULK_LIMIT  # jobs per bulk action: a selection or a run over more is refused (413)
FILTER_NAMES = frozenset({"kind", "state", "actor", "from", "to", "error"})


class BadBulk(CallwardenError, ValueError):
    """A bulk request the service refuses: ``status`` 400 (malformed), 404 (no such
    action) or 413 (too many jobs)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A job the preview found the action legal for: its call state then, and the
    credits it held reserved. A run takes them back (``credits`` is not read)."""

    id: uuid.UUID
    call_state: str | None
    credits: float = 0.0


class Skip(msgspec.Struct, frozen=True):
    """A job left out of a preview or skipped by a run, and why."""

    id: uuid.UUID
    reason: str


class Request(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A bulk request's body: a preview's ``job_ids`` or ``filter``, or a run's
    ``confirm`` (an unknown field is refused: a typo never widens what is acted on)."""

    job_ids: list[uuid.UUID] | None = None
    filter: dict[str, str] | None = None
    confirm: list[Planned] | None = None


def _state(p: CallProjection) -> str | None:
    return None if p.state is None else p.state.value


def decision(action: str, now: datetime, *,
             only_in: Collection[str | None] | None = None) -> Decide:
    """``action``'s decision (the event it appends, or ``None``: nothing to do), made on the
    projection read (force-fail's is :func:`callwarden.database.write.cancel`'s); with
    ``only_in``, nothing either when the call's state is not one of those (a bulk run: the
    state its preview saw)."""
    def decide(p: CallProjection) -> Event | None:
        if only_in is not None and _state(p) not in only_in:
            return None
        if action == "force-fail":
            return None if p.terminal else Cancelled(at=now, actor="admin", by="admin")
        if p.state is None or p.terminal:
            return None
        return ReconcileAttempted(at=now, actor="admin", outcome="requeued",
                                  next_attempt_at=None)
    if action not in ACTIONS:
        raise ValueError(f"unknown admin action {action!r}")
    return decide


async def act(conn: Conn, job_id: uuid.UUID, action: str, now: datetime, *,
              only_in: Collection[str | None] | None = None) -> AppendResult:
    """``action`` on one job, through the write path (:class:`JobNotFound` if none)."""
    return await transition(conn, job_id, decision(action, now, only_in=only_in))


def _not_legal(action: str, state: str | None) -> str:
    if action == "requeue-reconcile" and state is None:
        return "no call to requeue (it never started)"
    return f"not legal in its state ({state or 'no call'})"


def _filters(given: dict[str, str]) -> dict[str, Any]:
    """``dashboard_list_calls``' parameters for the list's filter ``given`` (every page:
    no cursor); an unknown name is refused, never read as "any"."""
    unknown = sorted(set(given) - FILTER_NAMES)
    if unknown:
        raise BadBulk(f"filter: unknown name(s) {', '.join(map(repr, unknown))} "
                      f"(known: {', '.join(sorted(FILTER_NAMES))})")
    try:
        return sql_params(parse_filters(given), limit=LIMIT)
    except BadFilter as exc:
        raise BadBulk(f"filter: {exc}") from None


async def _selected(conn: Conn, action: str, req: Request) -> tuple[list[uuid.UUID], bool]:
    """The jobs a preview looks at (selected, or the filter's legal ones) and whether the
    filter matched more than :data:`LIMIT`."""
    if (req.job_ids is None) == (req.filter is None):
        raise BadBulk('a preview takes "job_ids" or "filter" (one of them)')
    if req.job_ids is not None:
        ids = list(dict.fromkeys(req.job_ids))
        if len(ids) > LIMIT:
            raise BadBulk(f"{len(ids)} jobs selected: a bulk action takes at most {LIMIT}",
                          413)
        return ids, False
    params = _filters(req.filter or {})
    wanted = params["states"] or STATES
    params["states"] = [s for s in STATES if s in wanted and action in legal_actions(s)]
    rows = await execute(conn, "dashboard_list_calls", params) if params["states"] else []
    return [r["id"] for r in rows[:LIMIT]], len(rows) > LIMIT


async def preview(conn: Conn, action: str, req: Request) -> dict[str, Any]:
    """The dry run: the jobs ``action`` is legal for, their count and credits."""
    ids, truncated = await _selected(conn, action, req)
    found = {r["id"]: r for r in await execute(conn, "dashboard_bulk_jobs", {"ids": ids})}
    jobs: list[Planned] = []
    left: list[Skip] = []
    reserved = Decimal(0)
    for job in ids:
        row = found.get(job)
        if row is None:
            left.append(Skip(job, "no such job"))
        elif action not in legal_actions(row["call_state"]):
            left.append(Skip(job, _not_legal(action, row["call_state"])))
        else:
            reserved += row["reserved"]
            jobs.append(Planned(id=job, call_state=row["call_state"],
                                credits=float(row["reserved"])))
    moved = reserved if action == "force-fail" else Decimal(0)
    return {"action": action, "dry_run": True, "limit": LIMIT, "calls": len(jobs),
            "credits": float(moved), "credits_reserved": float(reserved),
            "truncated": truncated, "summary": summary(action, len(jobs), reserved,
                                                       truncated, len(left)),
            "jobs": msgspec.to_builtins(jobs), "not_eligible": msgspec.to_builtins(left)}


def summary(action: str, calls: int, reserved: Decimal, truncated: bool, left: int) -> str:
    """The confirmation's sentence: how many calls, how many credits it moves."""
    n = f"{calls} call{'' if calls == 1 else 's'}"
    c = credits(float(reserved))
    if calls == 0:
        text = f"0 calls, 0 credits: no call here can be {_verb(action)}."
    elif action == "force-fail":
        text = (f"{n}, {c} credits: cancel {'it' if calls == 1 else 'them'} (by admin) and "
                f"refund the {c} credits still reserved.")
    else:
        text = (f"{n}, 0 credits: the next reconcile scan takes "
                f"{'it' if calls == 1 else 'them'}; the {c} credits reserved stay reserved.")
    if left:
        text += f" {left} selected call{'' if left == 1 else 's'} left out (not legal in " \
                "its state, or gone)."
    if truncated:
        text += f" Only the newest {LIMIT} matching calls: run it again for the rest."
    return text


def _verb(action: str) -> str:
    return "force-failed" if action == "force-fail" else "requeued"


def _skipped(planned: Planned, result: AppendResult) -> str:
    if result.host_ended:
        return "the host had ended the job (HostEnded recorded instead)"
    now = _state(result.projection)
    if now != planned.call_state:
        return f"changed since the preview ({planned.call_state or 'no call'} -> " \
               f"{now or 'no call'})"
    return "nothing to do in its state"


async def run(conn: Conn, action: str, planned: Sequence[Planned],
              now: Callable[[], datetime]) -> dict[str, Any]:
    """The confirmed run: each planned job its own transition, only from its state."""
    if len(planned) > LIMIT:
        raise BadBulk(f"{len(planned)} jobs to confirm: a bulk action takes at most {LIMIT}",
                      413)
    unique = list({p.id: p for p in planned}.values())
    applied, refunded, skips = 0, Decimal(0), []
    for p in unique:
        try:
            result = await act(conn, p.id, action, now(), only_in=(p.call_state,))
        except JobNotFound:
            skips.append(Skip(p.id, "no such job"))
            continue
        except ConflictExhausted:
            skips.append(Skip(p.id, "lost every race to other writers: try again"))
            continue
        if not result.ok:
            skips.append(Skip(p.id, _skipped(p, result)))
            continue
        applied += 1
        if result.settlement == "settled":
            rows = await execute(conn, "dashboard_refunded_by", {
                "job_id": p.id, "seq": result.projection.version})
            refunded += rows[0]["credits"]
    return {"action": action, "dry_run": False, "limit": LIMIT, "applied": applied,
            "skipped": len(skips), "skips": msgspec.to_builtins(skips),
            "credits_refunded": float(refunded)}


async def bulk(pool: Pool, action: str, body: bytes,
               now: Callable[[], datetime]) -> dict[str, Any]:
    """A bulk request's answer: the preview, or with ``confirm`` the run."""
    if action not in ACTIONS:
        raise BadBulk(f"unknown action {action!r}", 404)
    try:
        req = msgspec.json.decode(body or b"{}", type=Request)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise BadBulk(f"not a bulk request: {exc}") from None
    async with connection(pool) as conn:
        if req.confirm is None:
            return await preview(conn, action, req)
        if req.job_ids is not None or req.filter is not None:
            raise BadBulk('a run takes "confirm" alone: the jobs its preview returned')
        return await run(conn, action, req.confirm, now)
