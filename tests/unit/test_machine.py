"""Every (state, event) pair of DESIGN §3, from an explicit table written independently of
the implementation's declaration; and the ``transitions`` machine driven along histories
walked from the table (``tests/histories.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transitions.core import MachineError

from callwarden.events.states import (
    TERMINAL,
    TRANSITIONS,
    CallState,
    InvalidTransition,
    TerminalStateError,
    next_state,
)
from callwarden.events.types import EVENT_TYPES, Adopted, HostEnded
from callwarden.machine import EMPTY, build_machine, state_diagram
from tests.histories import histories, label
from tests.support.paths import EXPECTED, C, F, P, U

OPEN = (C, P, U, F)


PAIRS = [(s, e) for s in EXPECTED for e in sorted(EVENT_TYPES)]


def _state(name: str) -> CallState | None:
    return None if name == EMPTY else CallState(name)


@pytest.mark.parametrize(("state", "event"), PAIRS)
def test_next_state_matches_the_design_table(state: str, event: str) -> None:
    expected = EXPECTED[state].get(event)
    if expected is None:
        with pytest.raises(InvalidTransition):
            next_state(_state(state), event)
    else:
        assert next_state(_state(state), event) == CallState(expected)


@pytest.mark.parametrize(("state", "event"), PAIRS)
def test_transitions_library_machine_agrees(state: str, event: str) -> None:
    _, model = build_machine(_state(state))
    expected = EXPECTED[state].get(event)
    if expected is None:
        with pytest.raises(MachineError):
            model.trigger(event)
    else:
        model.trigger(event)
        assert model.state == expected


@pytest.mark.parametrize("state", sorted(t.value for t in TERMINAL))
def test_terminal_states_raise_the_terminal_error(state: str) -> None:
    for event in EVENT_TYPES:
        if event in EXPECTED[state]:  # completed's LeftoverSettled loop
            continue
        with pytest.raises(TerminalStateError):
            next_state(CallState(state), event)


def test_table_covers_every_state() -> None:
    assert set(EXPECTED) == {EMPTY, *(s.value for s in CallState)}


def test_docs_states_page_draws_the_declared_machine() -> None:
    """docs/states.md shows exactly the machine events/states.py declares (drawn by
    transitions' mermaid engine); regenerate with ``python -m callwarden.machine``."""
    page = (Path(__file__).parents[2] / "docs" / "states.md").read_text(encoding="utf-8")
    block = page.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block == state_diagram()
    for t in TRANSITIONS:
        assert f": {t.trigger}" in block or f"| {t.trigger}" in block


@pytest.mark.parametrize("illegal_rate", [0, 1], ids=["legal", "one_illegal"])
@given(data=st.data())
def test_the_machine_follows_every_walk_and_refuses_its_illegal_event(
        illegal_rate: float, data: st.DataObject) -> None:
    """Invariant: along every walk of the table, the ``transitions`` machine (one model,
    triggered event by event) and ``next_state`` move to the same state, which is the
    state the fold enters except for its two payload refinements (Adopted with a task id
    polls; HostEnded ends as the host's status says, from the table's "failed"); the
    machine stays on the fold's state from there. The injected illegal event is refused
    by both (MachineError; InvalidTransition, TerminalStateError after a terminal state),
    except a takeover of a live lease, which only the fold's lease rule refuses. (Run
    twice: walks without an illegal event, and walks with one.)"""
    h = data.draw(histories(illegal_rate=illegal_rate))
    label(h)
    _, model = build_machine()
    for e, state in zip(h.legal, h.states, strict=True):
        before = _state(model.state)
        name = type(e).__name__
        model.trigger(name)
        assert model.state == next_state(before, name).value
        refined = ((isinstance(e, Adopted) and e.task_id is not None)
                   or (isinstance(e, HostEnded) and e.status in ("completed", "cancelled")))
        assert (model.state == state.value) != refined
        _, model = build_machine(state)  # continue from the fold's state
    if h.illegal_at is None:
        return
    name = type(h.events[h.illegal_at]).__name__
    before = _state(model.state)
    if h.illegal_kind == "live lease takeover":
        assert next_state(before, name) is CallState.FINALIZING
        return
    with pytest.raises(MachineError):
        model.trigger(name)
    assert h.error is not None
    with pytest.raises(h.error):
        next_state(before, name)
    if before in TERMINAL:
        assert h.error is TerminalStateError
