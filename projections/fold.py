"""The fold: a job's events -> its call state and the ``jobs`` columns the projection owns.

One pure function used three ways: inside the append transaction (to compute the new
columns from the old ones plus one event), in replay/verify, and in audit timelines. It
never reads a clock or touches I/O. Illegal sequences raise
:class:`callwarden.events.states.InvalidTransition` (terminal states are absorbing).

The hot loop works on a mutable, slotted accumulator; :class:`CallProjection` is the frozen
value handed to callers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

import msgspec
from msgspec.structs import astuple

from callwarden.events.states import (
    HOST_SETTLES,
    LEGACY_KIND,
    LEGAL,
    SETTLEMENT,
    TERMINAL,
    CallState,
    InvalidTransition,
    next_state,
)
from callwarden.events.types import (
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    HostEnded,
    LeftoverSettled,
    ReconcileAttempted,
    StoredMedia,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)

__all__ = ["EMPTY", "OBSERVED_FIELDS", "STATE_STATUS", "CallProjection", "apply", "fold",
           "fold_from"]

ERROR_EXHAUSTED = "reconcile_exhausted"

#: The host status each state projects to (``None``: left as the host set it).
STATE_STATUS: dict[CallState, str | None] = {
    CallState.CREATED: None,  # pending or processing: left as the host set it
    CallState.POLLING: "processing",
    CallState.UPSTREAM_SUCCEEDED: "processing",
    CallState.FINALIZING: "processing",
    CallState.COMPLETED: "completed",
    CallState.FAILED: "failed",
    CallState.SWEPT: "failed",
    CallState.EXHAUSTED: "failed",
    CallState.CANCELLED: "cancelled",
}


class CallProjection(msgspec.Struct, frozen=True, kw_only=True):
    """What a job's events add up to. ``status`` ``None`` means "not set by the call".

    ``settled_reservations`` is *observed*, not folded: how many of the job's
    ``usage_logs`` rows were no longer ``reserved`` when the row was read. The fold
    carries it through untouched; the write path fences on it (a reservation the host
    settled meanwhile makes the write re-read and re-decide)."""

    state: CallState | None = None
    version: int = 0
    status: str | None = None
    provider_kind: str | None = None
    provider_task_id: str | None = None
    provider_call_started_at: datetime | None = None
    call_sync: bool = False
    reconcile_attempts: int = 0
    reconcile_last_error: str | None = None
    reconcile_next_at: datetime | None = None
    error_message: str | None = None
    finalize_owner: str | None = None
    finalize_lease_until: datetime | None = None
    upstream_result: UpstreamResult | None = None
    output_media: tuple[StoredMedia, ...] | None = None
    output_text: str | None = None
    output_stop_reason: str | None = None
    provider_cost: float | None = None
    call_finished_at: datetime | None = None
    settlement: str | None = None  # "committed" | "refunded" once terminal
    settled_reservations: int = 0  # observed on the row, never folded

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


EMPTY = CallProjection()
_FIELDS = CallProjection.__struct_fields__
# Fields read from the row as the host left it, not computed by the fold.
OBSERVED_FIELDS = frozenset({"settled_reservations"})


class _Acc:
    """Mutable twin of :class:`CallProjection` for the hot loop (same fields)."""

    __slots__ = _FIELDS
    state: CallState | None
    version: int
    status: str | None
    provider_kind: str | None
    provider_task_id: str | None
    provider_call_started_at: datetime | None
    call_sync: bool
    reconcile_attempts: int
    reconcile_last_error: str | None
    reconcile_next_at: datetime | None
    error_message: str | None
    finalize_owner: str | None
    finalize_lease_until: datetime | None
    upstream_result: UpstreamResult | None
    output_media: tuple[StoredMedia, ...] | None
    output_text: str | None
    output_stop_reason: str | None
    provider_cost: float | None
    call_finished_at: datetime | None
    settlement: str | None
    settled_reservations: int

    def __init__(self, p: CallProjection) -> None:
        # One C-level astuple and one unpacking: the per-job cost of the hot loop.
        (self.state, self.version, self.status, self.provider_kind, self.provider_task_id,
         self.provider_call_started_at, self.call_sync, self.reconcile_attempts,
         self.reconcile_last_error, self.reconcile_next_at, self.error_message,
         self.finalize_owner, self.finalize_lease_until, self.upstream_result,
         self.output_media, self.output_text, self.output_stop_reason, self.provider_cost,
         self.call_finished_at, self.settlement, self.settled_reservations) = astuple(p)

    def freeze(self) -> CallProjection:
        return CallProjection(
            state=self.state, version=self.version, status=self.status,
            provider_kind=self.provider_kind, provider_task_id=self.provider_task_id,
            provider_call_started_at=self.provider_call_started_at,
            call_sync=self.call_sync, reconcile_attempts=self.reconcile_attempts,
            reconcile_last_error=self.reconcile_last_error,
            reconcile_next_at=self.reconcile_next_at, error_message=self.error_message,
            finalize_owner=self.finalize_owner,
            finalize_lease_until=self.finalize_lease_until,
            upstream_result=self.upstream_result, output_media=self.output_media,
            output_text=self.output_text, output_stop_reason=self.output_stop_reason,
            provider_cost=self.provider_cost, call_finished_at=self.call_finished_at,
            settlement=self.settlement, settled_reservations=self.settled_reservations,
        )


# The unpacking in ``_Acc.__init__`` must follow CallProjection's field order.
_PROBE = CallProjection(**{f: i for i, f in enumerate(_FIELDS)})  # type: ignore[arg-type]
assert _Acc(_PROBE).freeze() == _PROBE, "_Acc.__init__ unpacks fields out of order"


def _call_started(a: _Acc, e: CallStarted) -> None:
    a.provider_kind = e.kind
    a.call_sync = e.sync
    a.provider_call_started_at = e.at


def _adopted(a: _Acc, e: Adopted) -> None:
    a.call_sync = e.sync
    if e.kind != LEGACY_KIND:  # a legacy row keeps the host's (empty) seed columns
        a.provider_kind = e.kind
        a.provider_call_started_at = e.call_started_at or e.at
        a.reconcile_attempts = e.reconcile_attempts
        a.reconcile_last_error = e.reconcile_last_error
    if e.task_id:
        a.provider_task_id = e.task_id
        a.state = CallState.POLLING


def _task_created(a: _Acc, e: TaskCreated) -> None:
    a.provider_task_id = e.task_id


def _upstream_succeeded(a: _Acc, e: UpstreamSucceeded) -> None:
    a.upstream_result = e.result


def _upstream_failed(a: _Acc, e: UpstreamFailed) -> None:
    a.error_message = e.error


def _finalize_claimed(a: _Acc, e: FinalizeClaimed) -> None:
    lease = a.finalize_lease_until
    if a.state is CallState.FINALIZING and lease is not None and e.at < lease:
        raise InvalidTransition(
            CallState.FINALIZING, "FinalizeClaimed",
            f"lease held by {a.finalize_owner} until {lease.isoformat()}")
    a.finalize_owner = e.owner
    a.finalize_lease_until = e.lease_until


def _finalize_failed(a: _Acc, e: FinalizeFailed) -> None:
    a.finalize_owner = None
    a.finalize_lease_until = None
    a.reconcile_last_error = e.error


def _completed(a: _Acc, e: Completed) -> None:
    a.output_media = e.media
    a.output_text = e.text
    a.output_stop_reason = e.stop_reason
    a.provider_cost = e.cost
    a.finalize_owner = None
    a.finalize_lease_until = None


def _swept(a: _Acc, e: Swept) -> None:
    a.error_message = e.reason


def _exhausted(a: _Acc, e: Exhausted) -> None:
    a.error_message = ERROR_EXHAUSTED
    a.reconcile_attempts = max(a.reconcile_attempts, e.attempts)
    if e.last_error is not None:
        a.reconcile_last_error = e.last_error


def _cancelled(a: _Acc, e: Cancelled) -> None:
    pass


_HOST_ENDINGS = {"completed": CallState.COMPLETED, "cancelled": CallState.CANCELLED}


def _host_ended(a: _Acc, e: HostEnded) -> None:
    a.state = _HOST_ENDINGS.get(e.status, CallState.FAILED)


def _leftover_settled(a: _Acc, e: LeftoverSettled) -> None:
    if a.settlement != HOST_SETTLES:
        raise InvalidTransition(a.state, "LeftoverSettled",
                                f"only a reservation left to the host (settlement "
                                f"{a.settlement!r})")
    a.settlement = e.settlement


def _reconcile_attempted(a: _Acc, e: ReconcileAttempted) -> None:
    a.reconcile_attempts += 1
    a.reconcile_next_at = e.next_attempt_at
    if e.error is not None:
        a.reconcile_last_error = e.error


_Handler = Callable[[_Acc, object], None]
_HANDLERS: dict[type, _Handler] = {
    CallStarted: _call_started,  # type: ignore[dict-item]
    Adopted: _adopted,  # type: ignore[dict-item]
    TaskCreated: _task_created,  # type: ignore[dict-item]
    UpstreamSucceeded: _upstream_succeeded,  # type: ignore[dict-item]
    UpstreamFailed: _upstream_failed,  # type: ignore[dict-item]
    FinalizeClaimed: _finalize_claimed,  # type: ignore[dict-item]
    FinalizeFailed: _finalize_failed,  # type: ignore[dict-item]
    Completed: _completed,  # type: ignore[dict-item]
    Swept: _swept,  # type: ignore[dict-item]
    Exhausted: _exhausted,  # type: ignore[dict-item]
    Cancelled: _cancelled,  # type: ignore[dict-item]
    HostEnded: _host_ended,  # type: ignore[dict-item]
    ReconcileAttempted: _reconcile_attempted,  # type: ignore[dict-item]
    LeftoverSettled: _leftover_settled,  # type: ignore[dict-item]
}


# Per event class: (state before -> state after, handler). Derived from LEGAL.
_BY_CLASS: dict[type, tuple[dict[CallState | None, CallState], _Handler]] = {
    cls: ({src: dest for (src, name), dest in LEGAL.items() if name == cls.__name__}, fn)
    for cls, fn in _HANDLERS.items()
}
# Per state entered: (status it projects to, settlement if terminal).
_ENTER: dict[CallState, tuple[str | None, str | None]] = {
    s: (STATE_STATUS[s], SETTLEMENT.get(s)) for s in CallState
}


def _enter(a: _Acc, e: Event, state: CallState) -> None:
    status, settlement = _ENTER[state]
    if status is not None:
        a.status = status
    if settlement is not None:
        a.settlement = settlement
        a.call_finished_at = e.at
        a.reconcile_next_at = None


def fold_from(p: CallProjection, events: Iterable[Event]) -> CallProjection:
    """``p`` advanced by ``events`` in order."""
    a = _Acc(p)
    for e in events:
        table, handler = _BY_CLASS[type(e)]
        previous = a.state
        dest = table.get(previous)
        if dest is None:
            dest = next_state(previous, type(e).__name__)  # raises the precise error
        a.state = dest
        handler(a, e)  # may refine the state (Adopted with a task id -> polling)
        a.version += 1
        if a.state is not previous:
            _enter(a, e, a.state or dest)
        if type(e) is HostEnded:
            a.status = e.status  # the host's own word stays on the row
            if a.state is CallState.COMPLETED:
                a.settlement = HOST_SETTLES  # the host commits its own amount
    return a.freeze()


def fold(events: Iterable[Event]) -> CallProjection:
    """The projection of a job's whole event history (from the empty call)."""
    return fold_from(EMPTY, events)


def apply(p: CallProjection, e: Event) -> CallProjection:
    """``p`` after one more event; raises ``InvalidTransition`` if it may not follow.

    A row with no event yet folds from :data:`EMPTY` (keeping only what was observed on
    it: the host's status and settled reservations), never from the seed columns the host
    wrote there — so the projection always equals the fold of the log."""
    if p.state is None and p.version == 0:
        p = msgspec.structs.replace(EMPTY, status=p.status,
                                    settled_reservations=p.settled_reservations)
    return fold_from(p, (e,))
