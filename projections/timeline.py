"""A job's history as a readable timeline: one row per event (pure).

Each row says when the event happened, how long after the previous one, who recorded it,
the call state before and after, the upstream task id and reconcile attempts at that
point, the error it carries, and — for the event that ended the call — how the
reservation was settled (committed at what cost, or refunded) and by whom. The rows come
from folding the events one at a time, so a timeline and ``verify`` can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.events.states import InvalidTransition
from callwarden.events.types import (
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    ReconcileAttempted,
    Swept,
    UpstreamFailed,
    UpstreamSucceeded,
)
from callwarden.projections.fold import EMPTY, CallProjection, apply

__all__ = ["IllegalHistory", "TimelineRow", "detail", "error_of", "steps", "timeline"]


class TimelineRow(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    type: str
    at: datetime
    since_previous_s: float | None
    actor: str
    state_before: str | None
    state_after: str
    task_id: str | None
    attempts: int
    error: str | None
    detail: str | None
    settlement: str | None = None  # "committed" | "refunded", on the settling event only
    settled_cost: float | None = None
    settled_by: str | None = None


class IllegalHistory(CallwardenError):
    """The stored events cannot be folded: ``seq`` may not follow its predecessors."""

    def __init__(self, seq: int, cause: InvalidTransition) -> None:
        super().__init__(f"seq {seq}: {cause}")
        self.seq = seq
        self.cause = cause


def steps(events: Sequence[Event]) -> Iterator[tuple[int, CallProjection, CallProjection]]:
    """``(seq, before, after)`` for each event; :class:`IllegalHistory` names the first
    event that may not follow."""
    before = EMPTY
    for seq, e in enumerate(events, start=1):
        try:
            after = apply(before, e)
        except InvalidTransition as exc:
            raise IllegalHistory(seq, exc) from exc
        yield seq, before, after
        before = after


def error_of(e: Event) -> str | None:
    """The error or reason an event records, if any."""
    match e:
        case UpstreamFailed() | FinalizeFailed() | ReconcileAttempted():
            return e.error
        case Exhausted():
            return e.last_error
        case Swept():
            return e.reason
    return None


def detail(e: Event) -> str | None:
    """A short, human description of what the event adds."""
    match e:
        case CallStarted():
            return f"{e.kind} ({'sync' if e.sync else 'async'})"
        case Adopted():
            return f"{e.kind} adopted (status {e.observed_status})"
        case UpstreamSucceeded():
            return _result_detail(e)
        case FinalizeClaimed():
            return f"lease {e.owner} until {e.lease_until.strftime('%H:%M:%S')}"
        case Completed():
            return f"{len(e.media)} media stored"
        case Cancelled():
            return f"cancelled by {e.by}"
        case ReconcileAttempted():
            return e.outcome
        case Exhausted():
            return f"after {e.attempts} attempts"
    return None


def _result_detail(e: UpstreamSucceeded) -> str:
    cost = "" if e.result.cost is None else f", cost {e.result.cost:g}"
    return f"{len(e.result.media_urls)} media url(s){cost}"


def _row(seq: int, e: Event, before: CallProjection, after: CallProjection,
         previous_at: datetime | None) -> TimelineRow:
    settles = after.terminal and not before.terminal
    return TimelineRow(
        seq=seq, type=type(e).__name__, at=e.at,
        since_previous_s=None if previous_at is None else (e.at - previous_at).total_seconds(),
        actor=e.actor,
        state_before=None if before.state is None else before.state.value,
        state_after=after.state.value if after.state is not None else "-",
        task_id=after.provider_task_id, attempts=after.reconcile_attempts,
        error=error_of(e), detail=detail(e),
        settlement=after.settlement if settles else None,
        settled_cost=after.provider_cost if settles and isinstance(e, Completed) else None,
        settled_by=e.actor if settles else None,
    )


def timeline(events: Sequence[Event]) -> list[TimelineRow]:
    """One row per event, in order; :class:`IllegalHistory` if the log cannot be folded."""
    rows: list[TimelineRow] = []
    previous_at: datetime | None = None
    for seq, before, after in steps(events):
        e = events[seq - 1]
        rows.append(_row(seq, e, before, after, previous_at))
        previous_at = e.at
    return rows
