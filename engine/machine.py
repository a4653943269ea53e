"""The call state machine as a ``transitions`` machine, and the pure ``next_state``.

The states and transitions are declared once in :mod:`events.states`; this module builds
the ``transitions`` machine from that declaration (``auto_transitions=False``, no
callbacks, so nothing here can cause a side effect). The hot path uses the lookup table
derived from the same declaration (:func:`next_state`); a unit test proves the two agree
on every (state, event) pair.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine

from events.states import (
    TRANSITIONS,
    CallState,
    InvalidTransition,
    TerminalStateError,
    next_state,
)

__all__ = ["EMPTY", "InvalidTransition", "TerminalStateError", "build_machine", "next_state"]

EMPTY = "none"  # the pseudo-state of a call with no event yet


class _Model:
    """A bare model; ``transitions`` attaches ``state`` and trigger methods to it."""

    state: str


def build_machine(initial: CallState | None = None) -> tuple[Machine, Any]:
    """A ``transitions`` machine and its model, built from :data:`TRANSITIONS`."""
    states = [EMPTY, *[s.value for s in CallState]]
    spec = []
    for t in TRANSITIONS:
        for src in t.sources:
            source = EMPTY if src is None else src.value
            dest = source if t.dest is None else t.dest.value
            spec.append({"trigger": t.trigger, "source": source, "dest": dest})
    model = _Model()
    machine = Machine(
        model=model, states=states, transitions=spec,
        initial=EMPTY if initial is None else initial.value,
        auto_transitions=False, ignore_invalid_triggers=False,
    )
    return machine, model
