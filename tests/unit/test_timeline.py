"""Timelines are the fold, one event at a time: states, deltas, errors, settlement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from callwarden.events.types import (
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    ReconcileAttempted,
    StoredMedia,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import fold
from callwarden.projections.timeline import IllegalHistory, timeline

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
W = "worker:7f3a"
R = "reconciler:b21c"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def completed_path(task: str = "t-1", cost: float = 4.0) -> list[Event]:
    return [
        CallStarted(at=at(0), actor=W, kind="kie-standard"),
        TaskCreated(at=at(1.5), actor=W, task_id=task),
        UpstreamSucceeded(at=at(40), actor=W, result=UpstreamResult(
            media_urls=("https://cdn.example/a.png",), cost=cost)),
        FinalizeClaimed(at=at(41), actor=W, owner=W, lease_until=at(101)),
        Completed(at=at(43), actor=W, cost=cost, media=(StoredMedia(
            key="media/j/0.png", url="file:///m/0.png", content_type="image/png", size=9),)),
    ]


def failed_path(task: str = "t-2") -> list[Event]:
    return [
        CallStarted(at=at(0), actor=W, kind="kie-veo"),
        TaskCreated(at=at(2), actor=W, task_id=task),
        ReconcileAttempted(at=at(1800), actor=R, outcome="still_running", error="slow"),
        UpstreamFailed(at=at(2100), actor=R, error="content policy", code="400"),
    ]


def swept_path(task: str = "") -> list[Event]:
    return [
        CallStarted(at=at(0), actor=W, kind="elevenlabs-sync", sync=True),
        Swept(at=at(600), actor=R),
    ]


def exhausted_path(task: str = "t-4") -> list[Event]:
    return [
        CallStarted(at=at(0), actor=W, kind="replicate-prediction"),
        TaskCreated(at=at(1), actor=W, task_id=task),
        ReconcileAttempted(at=at(1200), actor=R, outcome="still_running", error="timeout"),
        ReconcileAttempted(at=at(1500), actor=R, outcome="still_running", error="timeout"),
        Exhausted(at=at(1800), actor=R, attempts=2, last_error="timeout"),
    ]


def cancelled_path(task: str = "t-5") -> list[Event]:
    return [
        CallStarted(at=at(0), actor=W, kind="kie-suno"),
        TaskCreated(at=at(1), actor=W, task_id=task),
        Cancelled(at=at(30), actor="user:42", by="user:42"),
    ]


# terminal path -> (history factory, settlement, who settles)
PATHS = {
    "completed": (completed_path, "committed", W),
    "failed": (failed_path, "refunded", R),
    "swept": (swept_path, "refunded", R),
    "exhausted": (exhausted_path, "refunded", R),
    "cancelled": (cancelled_path, "refunded", "user:42"),
}


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
