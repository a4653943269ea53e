"""What each event writes on the projection: declared once, as data.

The fold (:mod:`callwarden.projections.fold`) is built from this table, and the host API's
``callwarden.apply_event`` is rendered from it as SQL
(:mod:`callwarden.database.declared`): one declaration, two readers, and
``tests/integration/test_apply_event.py`` holds them equal on every (state, event).

A :class:`Rule` per event type: its :class:`Refuse` (the one check beyond the transition
table), its steps (field writes, each maybe under a condition on the payload, maybe
refining the state the table gives) and its ``then`` steps (after the state is entered:
the fold sets a new state's host status and settlement first). Fields are
:class:`CallProjection`'s; names in sources and conditions are the event's payload fields.
Pure data: no I/O.
"""

from __future__ import annotations

import msgspec

from callwarden.events.states import HOST_SETTLES, LEGACY_KIND, CallState

__all__ = ["ERROR_EXHAUSTED", "RULES", "AtLeast", "Const", "Differs", "Either", "Equals",
           "Given", "IfSet", "LeaseHeld", "Payload", "Plus", "Refuse", "Rule", "Source",
           "Step", "Unless"]

ERROR_EXHAUSTED = "reconcile_exhausted"


class Payload(msgspec.Struct, frozen=True):
    """The event's field ``name``."""

    name: str


class Const(msgspec.Struct, frozen=True):
    """A constant (``None``: cleared)."""

    value: str | None


class Either(msgspec.Struct, frozen=True):
    """The event's field ``name``, or its field ``otherwise`` when that one is ``None``."""

    name: str
    otherwise: str


class IfSet(msgspec.Struct, frozen=True):
    """The event's field ``name``; the field keeps its value when that is ``None``."""

    name: str


class AtLeast(msgspec.Struct, frozen=True):
    """The greater of the field's value and the event's field ``name``."""

    name: str


class Plus(msgspec.Struct, frozen=True):
    """The field's value plus ``n``."""

    n: int


Source = Payload | Const | Either | IfSet | AtLeast | Plus


class Equals(msgspec.Struct, frozen=True):
    """The event's field ``name`` is ``value``."""

    name: str
    value: str


class Differs(msgspec.Struct, frozen=True):
    """The event's field ``name`` is not ``value``."""

    name: str
    value: str


class Given(msgspec.Struct, frozen=True):
    """The event's field ``name`` is neither ``None`` nor empty."""

    name: str


Cond = Equals | Differs | Given


class LeaseHeld(msgspec.Struct, frozen=True):
    """Refused in ``state`` while the event's time is before the field ``until`` (a lease
    another holder holds); ``owner`` names the holder in the error."""

    state: CallState
    until: str
    owner: str


class Unless(msgspec.Struct, frozen=True):
    """Refused unless the field ``name`` is ``value``."""

    name: str
    value: str
    why: str


Refuse = LeaseHeld | Unless


class Step(msgspec.Struct, frozen=True):
    """Write ``set`` (field, source) in order, and refine the state to ``state`` when
    given; all only when ``when`` holds (``None``: always)."""

    set: tuple[tuple[str, Source], ...] = ()
    when: Cond | None = None
    state: CallState | None = None


class Rule(msgspec.Struct, frozen=True):
    steps: tuple[Step, ...] = ()
    then: tuple[Step, ...] = ()
    refuse: Refuse | None = None


def _sets(**fields: Source) -> Step:
    return Step(set=tuple(fields.items()))


_NO_LEASE = (("finalize_owner", Const(None)), ("finalize_lease_until", Const(None)))

RULES: dict[str, Rule] = {
    "CallStarted": Rule(steps=(_sets(provider_kind=Payload("kind"), call_sync=Payload("sync"),
                                     provider_call_started_at=Payload("at")),)),
    "Adopted": Rule(steps=(
        _sets(call_sync=Payload("sync")),
        # a legacy row keeps the host's (empty) seed columns
        Step(when=Differs("kind", LEGACY_KIND), set=(
            ("provider_kind", Payload("kind")),
            ("provider_call_started_at", Either("call_started_at", "at")),
            ("reconcile_attempts", Payload("reconcile_attempts")),
            ("reconcile_last_error", Payload("reconcile_last_error")))),
        Step(when=Given("task_id"), set=(("provider_task_id", Payload("task_id")),),
             state=CallState.POLLING),
    )),
    "TaskCreated": Rule(steps=(_sets(provider_task_id=Payload("task_id")),)),
    "UpstreamSucceeded": Rule(steps=(_sets(upstream_result=Payload("result")),)),
    "UpstreamFailed": Rule(steps=(_sets(error_message=Payload("error")),)),
    "FinalizeClaimed": Rule(
        refuse=LeaseHeld(CallState.FINALIZING, "finalize_lease_until", "finalize_owner"),
        steps=(_sets(finalize_owner=Payload("owner"),
                     finalize_lease_until=Payload("lease_until")),)),
    "FinalizeFailed": Rule(steps=(Step(set=(*_NO_LEASE,
                                            ("reconcile_last_error", Payload("error")))),)),
    "Completed": Rule(steps=(Step(set=(
        ("output_media", Payload("media")), ("output_text", Payload("text")),
        ("output_stop_reason", Payload("stop_reason")), ("provider_cost", Payload("cost")),
        *_NO_LEASE)),)),
    "Swept": Rule(steps=(_sets(error_message=Payload("reason")),)),
    "Exhausted": Rule(steps=(_sets(error_message=Const(ERROR_EXHAUSTED),
                                   reconcile_attempts=AtLeast("attempts"),
                                   reconcile_last_error=IfSet("last_error")),)),
    "Cancelled": Rule(),
    # The host wrote a terminal status first: its word stays on the row, and a job it
    # completed is its own to commit (only the host knows the amount).
    "HostEnded": Rule(
        steps=(Step(when=Equals("status", "completed"), state=CallState.COMPLETED),
               Step(when=Equals("status", "cancelled"), state=CallState.CANCELLED)),
        then=(_sets(status=Payload("status")),
              Step(when=Equals("status", "completed"),
                   set=(("settlement", Const(HOST_SETTLES)),)))),
    "ReconcileAttempted": Rule(steps=(_sets(reconcile_attempts=Plus(1),
                                            reconcile_next_at=Payload("next_attempt_at"),
                                            reconcile_last_error=IfSet("error")),)),
    "LeftoverSettled": Rule(
        refuse=Unless("settlement", HOST_SETTLES, "only a reservation left to the host"),
        steps=(_sets(settlement=Payload("settlement")),)),
}
