"""Timelines are the fold, one event at a time: states, deltas, errors, settlement."""

from __future__ import annotations

import pytest

from callwarden.events.types import (
    Completed,
)
from callwarden.projections.fold import fold
from callwarden.projections.timeline import IllegalHistory, timeline
from tests.support.paths import (
    PATHS,
    W,
    at,
    cancelled_path,
    completed_path,
    exhausted_path,
    failed_path,
    swept_path,
)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_terminal_path_ends_with_its_settlement_and_who_settled(path: str) -> None:
    make, settlement, by = PATHS[path]
    rows = timeline(make())
    assert rows[-1].state_after == path
    assert (rows[-1].settlement, rows[-1].settled_by) == (settlement, by)
    assert all(r.settlement is None for r in rows[:-1])


def test_rows_chain_states_and_measure_time_between_events() -> None:
    rows = timeline(completed_path())
    assert [(r.state_before, r.state_after) for r in rows] == [
        (None, "created"), ("created", "polling"), ("polling", "upstream_succeeded"),
        ("upstream_succeeded", "finalizing"), ("finalizing", "completed")]
    assert [r.since_previous_s for r in rows] == [None, 1.5, 38.5, 1.0, 2.0]
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]


def test_completion_shows_the_committed_cost() -> None:
    last = timeline(completed_path(cost=2.5))[-1]
    assert (last.settlement, last.settled_cost) == ("committed", 2.5)
    assert last.detail == "1 media stored"


def test_task_id_and_attempts_are_carried_forward() -> None:
    rows = timeline(exhausted_path())
    assert [r.task_id for r in rows] == [None, "t-4", "t-4", "t-4", "t-4"]
    assert [r.attempts for r in rows] == [0, 0, 1, 2, 2]
    assert [r.error for r in rows] == [None, None, "timeout", "timeout", "timeout"]


def test_errors_and_reasons_are_shown_on_their_event() -> None:
    assert timeline(failed_path())[-1].error == "content policy"
    assert timeline(swept_path())[-1].error == "reconcile_no_recovery"


def test_refund_has_no_cost() -> None:
    assert timeline(cancelled_path())[-1].settled_cost is None


def test_timeline_agrees_with_the_fold() -> None:
    for make, _, _ in PATHS.values():
        events = make()
        p = fold(events)
        last = timeline(events)[-1]
        assert last.state_after == (p.state.value if p.state else None)
        assert last.attempts == p.reconcile_attempts


def test_illegal_history_names_the_seq() -> None:
    events = completed_path()
    events.insert(1, Completed(at=at(1), actor=W, cost=1.0))
    with pytest.raises(IllegalHistory, match="seq 2: Completed may not follow state created"):
        timeline(events)


def test_empty_history_has_no_rows() -> None:
    assert timeline([]) == []
