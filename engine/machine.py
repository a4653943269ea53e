"""The call state machine as a ``transitions`` machine, and the pure ``next_state``.

The states and transitions are declared once in :mod:`callwarden.events.states`; this module builds
the ``transitions`` machine from that declaration (``auto_transitions=False``, no
callbacks, so nothing here can cause a side effect). The hot path uses the lookup table
derived from the same declaration (:func:`next_state`); a unit test proves the two agree
on every (state, event) pair. :func:`state_diagram` draws the same machine (``transitions``'
mermaid engine) into ``docs/states.md``; a test checks the page shows the machine as
declared (``python -m callwarden.machine`` prints it).
"""

from __future__ import annotations

from typing import Any

from transitions import Machine
from transitions.extensions import GraphMachine

from callwarden.events.states import (
    TRANSITIONS,
    CallState,
    InvalidTransition,
    TerminalStateError,
    next_state,
)

__all__ = ["EMPTY", "InvalidTransition", "TerminalStateError", "build_machine", "next_state",
           "state_diagram"]

EMPTY = "none"  # the pseudo-state of a call with no event yet


class _Model:
    """A bare model; ``transitions`` attaches ``state`` and trigger methods to it."""

    state: str


def _spec() -> tuple[list[str], list[dict[str, str]]]:
    states = [EMPTY, *[s.value for s in CallState]]
    spec = []
    for t in TRANSITIONS:
        for src in t.sources:
            source = EMPTY if src is None else src.value
            dest = source if t.dest is None else t.dest.value
            spec.append({"trigger": t.trigger, "source": source, "dest": dest})
    return states, spec


def build_machine(initial: CallState | None = None) -> tuple[Machine, Any]:
    """A ``transitions`` machine and its model, built from :data:`TRANSITIONS`."""
    states, spec = _spec()
    model = _Model()
    machine = Machine(
        model=model, states=states, transitions=spec,
        initial=EMPTY if initial is None else initial.value,
        auto_transitions=False, ignore_invalid_triggers=False,
    )
    return machine, model


def state_diagram() -> str:
    """The machine as a mermaid ``stateDiagram-v2`` (drawn by ``transitions``; its
    styling lines dropped so the page reads as text too)."""
    states, spec = _spec()
    model = _Model()
    GraphMachine(model=model, states=states, transitions=spec, initial=EMPTY,
                 auto_transitions=False, graph_engine="mermaid",
                 title="callwarden call states")
    source = str(model.get_graph().draw(None))  # type: ignore[attr-defined]
    keep = [ln.rstrip() for ln in source.splitlines()
            if not ln.strip().startswith(("classDef", "Class "))]
    return "\n".join(ln for i, ln in enumerate(keep) if ln or (i and keep[i - 1])) + "\n"


if __name__ == "__main__":
    print(state_diagram(), end="")
