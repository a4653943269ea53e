"""The fold: a job's events -> its call state and the ``jobs`` columns the projection owns.

One pure function used three ways: inside the append transaction (to compute the new
columns from the old ones plus one event), in replay/verify, and in audit timelines. It
never reads a clock or touches I/O. Illegal sequences raise
:class:`callwarden.events.states.InvalidTransition` (terminal states are absorbing).

What each event writes is not written here: it is the rules of
:mod:`callwarden.projections.writes`, compiled below into one handler per event type (as
Python source, so the hot loop runs plain attribute writes) and rendered as SQL for the
host API (:mod:`callwarden.database.declared`): one definition, two readers.

The hot loop works on a mutable, slotted accumulator; :class:`CallProjection` is the frozen
value handed to callers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
from msgspec.structs import astuple

from callwarden.events.states import (
    LEGAL,
    SETTLEMENT,
    TERMINAL,
    CallState,
    InvalidTransition,
    next_state,
)
from callwarden.events.types import EVENT_TYPES, Event, StoredMedia, UpstreamResult
from callwarden.projections.writes import (
    RULES,
    AtLeast,
    Cond,
    Const,
    Differs,
    Either,
    Equals,
    IfSet,
    LeaseHeld,
    Payload,
    Refuse,
    Source,
    Step,
)

__all__ = ["EMPTY", "OBSERVED_FIELDS", "STATE_STATUS", "CallProjection", "apply", "apply_all",
           "fold", "fold_from"]

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


_Handler = Callable[[_Acc, Any], None]


def _expr(field: str, src: Source) -> str:
    """``src``'s value for ``field`` as a Python expression over ``a`` (the accumulator)
    and ``e`` (the event). A source reads no field but its own, so a step's writes may run
    in order."""
    if isinstance(src, Payload):
        return f"e.{src.name}"
    if isinstance(src, Const):
        return repr(src.value)
    if isinstance(src, Either):
        return f"(e.{src.name} if e.{src.name} is not None else e.{src.otherwise})"
    if isinstance(src, IfSet):
        return f"(a.{field} if e.{src.name} is None else e.{src.name})"
    if isinstance(src, AtLeast):
        return f"max(a.{field}, e.{src.name})"
    return f"a.{field} + {src.n!r}"


def _test(cond: Cond) -> str:
    if isinstance(cond, Equals):
        return f"e.{cond.name} == {cond.value!r}"
    if isinstance(cond, Differs):
        return f"e.{cond.name} != {cond.value!r}"
    return f"e.{cond.name}"


def _source(name: str, steps: tuple[Step, ...]) -> str:
    """The handler for ``steps`` as Python source: the declaration rendered, as
    :mod:`callwarden.database.declared` renders it as SQL (the hot loop then runs plain
    attribute writes, as fast as the handlers written by hand it replaces)."""
    lines = [f"def {name}(a, e):"]
    for step in steps:
        body = [f"a.{field} = {_expr(field, src)}" for field, src in step.set]
        if step.state is not None:
            body.append(f"a.state = _State.{step.state.name}")
        if step.when is not None:
            lines.append(f"    if {_test(step.when)}:")
            body = ["    " + line for line in body or ["pass"]]
        lines.extend("    " + line for line in body)
    return "\n".join(lines if len(lines) > 1 else [*lines, "    pass"])


def _steps(event: str, part: str, steps: tuple[Step, ...]) -> _Handler | None:
    """``steps`` compiled (``None`` when there are none)."""
    if not steps:
        return None
    names = [n for s in steps for f, src in s.set
             for n in (f, *(getattr(src, a) for a in ("name", "otherwise") if hasattr(src, a)))]
    names += [s.when.name for s in steps if s.when is not None]
    if not all(n.isidentifier() for n in names):  # the declaration's names, nothing else
        raise ValueError(f"{event}: a field or payload name is not an identifier")
    name = f"_{event}_{part}"
    scope: dict[str, Any] = {"_State": CallState}
    exec(compile(_source(name, steps), f"<rule {event}>", "exec"), scope)
    fn: _Handler = scope[name]
    return fn


def _refusal(refuse: Refuse | None) -> Callable[[_Acc, Any], str | None] | None:
    """Why the event is refused on ``a`` (``None``: it is not), beyond the table."""
    if refuse is None:
        return None
    if isinstance(refuse, LeaseHeld):
        state, until, owner = refuse.state, attrgetter(refuse.until), attrgetter(refuse.owner)

        def held(a: _Acc, e: Any) -> str | None:
            lease = until(a)
            if a.state is state and lease is not None and e.at < lease:
                return f"lease held by {owner(a)} until {lease.isoformat()}"
            return None
        return held
    name, value, why = refuse.name, refuse.value, refuse.why
    get = attrgetter(name)
    return lambda a, e: None if get(a) == value else f"{why} ({name} {get(a)!r})"


class _Compiled(NamedTuple):
    table: dict[CallState | None, CallState]  # state before -> state after
    refused: Callable[[_Acc, Any], str | None] | None
    steps: _Handler | None
    then: _Handler | None


# Per event class, its rule (projections/writes.py) compiled, and its transitions from LEGAL.
_BY_CLASS: dict[type, _Compiled] = {
    cls: _Compiled({src: dest for (src, name), dest in LEGAL.items() if name == cls.__name__},
                   _refusal(RULES[cls.__name__].refuse),
                   _steps(cls.__name__, "steps", RULES[cls.__name__].steps),
                   _steps(cls.__name__, "then", RULES[cls.__name__].then))
    for cls in EVENT_TYPES.values()
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
        table, refused, steps, then = _BY_CLASS[type(e)]
        previous = a.state
        dest = table.get(previous)
        if dest is None:
            dest = next_state(previous, type(e).__name__)  # raises the precise error
        if refused is not None and (why := refused(a, e)) is not None:
            raise InvalidTransition(previous, type(e).__name__, why)
        a.state = dest
        if steps is not None:
            steps(a, e)  # may refine the state (Adopted with a task id -> polling)
        a.version += 1
        if a.state is not previous:
            _enter(a, e, a.state or dest)
        if then is not None:
            then(a, e)  # after the state is entered (HostEnded: the host's own word)
    return a.freeze()


def fold(events: Iterable[Event]) -> CallProjection:
    """The projection of a job's whole event history (from the empty call)."""
    return fold_from(EMPTY, events)


def apply(p: CallProjection, e: Event) -> CallProjection:
    """``p`` after one more event; raises ``InvalidTransition`` if it may not follow."""
    return apply_all(p, (e,))


def apply_all(p: CallProjection, events: Iterable[Event]) -> CallProjection:
    """``p`` (a job's row as read) after ``events``, in one pass.

    A row with no event yet folds from :data:`EMPTY` (keeping only what was observed on
    it: the host's status and settled reservations), never from the seed columns the host
    wrote there — so the projection always equals the fold of the log."""
    if p.state is None and p.version == 0:
        p = msgspec.structs.replace(EMPTY, status=p.status,
                                    settled_reservations=p.settled_reservations)
    return fold_from(p, events)
