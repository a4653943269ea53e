"""The call's states and which event moves which state where: declared once, as data.

This is the single declaration of the state machine (DESIGN §3). ``callwarden.machine`` builds
a ``transitions`` machine from it (for diagrams and the engine's API); the fold in
``projections`` uses the derived lookup table ``LEGAL`` on its hot path. It lives in
``events`` because both ``projections`` and ``engine`` need it and ``projections`` may not
import ``engine``.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from callwarden.events.errors import CallwardenError

__all__ = [
    "HOST_SETTLES",
    "LEGACY_KIND",
    "LEGAL",
    "NON_TERMINAL",
    "OPEN_STATUSES",
    "SETTLEMENT",
    "TERMINAL",
    "TRANSITIONS",
    "CallState",
    "InvalidTransition",
    "TerminalStateError",
    "Transition",
    "next_state",
]


class CallState(StrEnum):
    CREATED = "created"
    POLLING = "polling"
    UPSTREAM_SUCCEEDED = "upstream_succeeded"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    SWEPT = "swept"
    EXHAUSTED = "exhausted"
    CANCELLED = "cancelled"


S = CallState
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.SWEPT, S.EXHAUSTED, S.CANCELLED})
NON_TERMINAL = frozenset(set(S) - TERMINAL)

# Terminal state -> what happens to the job's reservation in the same transaction.
SETTLEMENT: dict[CallState, str] = {
    S.COMPLETED: "committed",
    S.FAILED: "refunded",
    S.SWEPT: "refunded",
    S.EXHAUSTED: "refunded",
    S.CANCELLED: "refunded",
}


class Transition(msgspec.Struct, frozen=True):
    """``trigger`` (an event type) moves any of ``sources`` to ``dest``. ``None`` in
    ``sources`` is the empty call (no event yet); ``dest=None`` means "stay"."""

    trigger: str
    sources: tuple[CallState | None, ...]
    dest: CallState | None


_ACTIVE = (S.CREATED, S.POLLING)
_ALL_OPEN = (S.CREATED, S.POLLING, S.UPSTREAM_SUCCEEDED, S.FINALIZING)

TRANSITIONS: tuple[Transition, ...] = (
    Transition("CallStarted", (None,), S.CREATED),
    Transition("Adopted", (None,), S.CREATED),  # -> polling when it carries a task id
    Transition("TaskCreated", (S.CREATED,), S.POLLING),
    Transition("UpstreamSucceeded", _ACTIVE, S.UPSTREAM_SUCCEEDED),
    # From upstream_succeeded / finalizing too: the result is gone before it could be
    # stored (Replicate's data_removed, an expired URL) -- the call fails and refunds.
    Transition("UpstreamFailed", _ALL_OPEN, S.FAILED),
    Transition("FinalizeClaimed", (S.UPSTREAM_SUCCEEDED, S.FINALIZING), S.FINALIZING),
    Transition("FinalizeFailed", (S.FINALIZING,), S.UPSTREAM_SUCCEEDED),
    Transition("Completed", (S.FINALIZING,), S.COMPLETED),
    Transition("Swept", _ACTIVE, S.SWEPT),
    Transition("Exhausted", _ALL_OPEN, S.EXHAUSTED),
    Transition("Cancelled", (None, *_ALL_OPEN), S.CANCELLED),
    # The host wrote a terminal status first: -> completed or cancelled when it wrote
    # those, failed for any other status (the fold refines the state from the payload).
    Transition("HostEnded", (None, *_ALL_OPEN), S.FAILED),
    Transition("ReconcileAttempted", _ALL_OPEN, None),
    # The one move out of a terminal state, and it stays there: a reservation the host
    # was left to commit (HostEnded, settlement "host") and never did, settled by the
    # reconciler's policy once host_left_after_s has passed (the fold allows it only then).
    Transition("LeftoverSettled", (S.COMPLETED,), None),
)

# The ``jobs.status`` values of a job the host still considers open; any other status on
# an open call was written by host code: the host decided (DESIGN §10).
OPEN_STATUSES = frozenset({"pending", "processing"})

# The kind an ``Adopted`` event names for a legacy row (one that names no provider_kind):
# such a call owns none of the host's seed columns.
LEGACY_KIND = "legacy"

# The settlement of a call the host completed itself: its reservation is the host's to
# commit (only the host knows the amount); callwarden moves nothing.
HOST_SETTLES = "host"


def _table() -> dict[tuple[CallState | None, str], CallState]:
    table: dict[tuple[CallState | None, str], CallState] = {}
    for t in TRANSITIONS:
        for src in t.sources:
            dest = t.dest if t.dest is not None else src
            assert dest is not None
            table[(src, t.trigger)] = dest
    return table


# (state or None, event type) -> resulting state. Absent pair = illegal.
LEGAL: dict[tuple[CallState | None, str], CallState] = _table()


class InvalidTransition(CallwardenError):
    """``event_type`` may not follow ``state``."""

    def __init__(self, state: CallState | None, event_type: str, detail: str = "") -> None:
        where = state.value if state is not None else "none"
        msg = f"{event_type} may not follow state {where}"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.state = state
        self.event_type = event_type


class TerminalStateError(InvalidTransition):
    """The call is already terminal; terminal states are absorbing."""


def next_state(state: CallState | None, event_type: str) -> CallState:
    """The state after ``event_type`` in ``state``; raises if the pair is illegal."""
    dest = LEGAL.get((state, event_type))
    if dest is None:
        if state in TERMINAL:
            raise TerminalStateError(state, event_type)
        raise InvalidTransition(state, event_type)
    return dest
