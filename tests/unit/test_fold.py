"""The pure fold: specific paths, and a fuzz test that it accepts exactly the legal
event sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.states import CallState, InvalidTransition
from events.types import (
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    HostEnded,
    ReconcileAttempted,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from projections.fold import EMPTY, apply, fold
from tests.unit.test_machine import EXPECTED

T0 = datetime(2026, 5, 19, tzinfo=UTC)


def _make(name: str, at: datetime, lease_s: float) -> Event:
    match name:
        case "CallStarted":
            return CallStarted(at=at, actor="a", kind="kie-standard")
        case "Adopted":
            return Adopted(at=at, actor="a", kind="kie-veo", observed_status="processing")
        case "TaskCreated":
            return TaskCreated(at=at, actor="a", task_id="t")
        case "UpstreamSucceeded":
            return UpstreamSucceeded(at=at, actor="a", result=UpstreamResult(media_urls=("u",)))
        case "UpstreamFailed":
            return UpstreamFailed(at=at, actor="a", error="e")
        case "FinalizeClaimed":
            return FinalizeClaimed(at=at, actor="a", owner="o",
                                   lease_until=at + timedelta(seconds=lease_s))
        case "FinalizeFailed":
            return FinalizeFailed(at=at, actor="a", error="s3 down")
        case "Completed":
            return Completed(at=at, actor="a", cost=1.0)
        case "Swept":
            return Swept(at=at, actor="a")
        case "Exhausted":
            return Exhausted(at=at, actor="a", attempts=18)
        case "Cancelled":
            return Cancelled(at=at, actor="a", by="user")
        case "HostEnded":
            return HostEnded(at=at, actor="a", status="failed")
        case "ReconcileAttempted":
            return ReconcileAttempted(at=at, actor="a", outcome="still_running")
    raise AssertionError(name)


NAMES = sorted({e for row in EXPECTED.values() for e in row} | {"Completed"})


def test_happy_path_projects_the_seed_columns() -> None:
    p = fold([
        CallStarted(at=T0, actor="w", kind="kie-standard"),
        TaskCreated(at=T0, actor="w", task_id="t1"),
        ReconcileAttempted(at=T0, actor="r", outcome="still_running", error="slow"),
        UpstreamSucceeded(at=T0, actor="r", result=UpstreamResult(media_urls=("u",))),
        FinalizeClaimed(at=T0, actor="r", owner="r", lease_until=T0 + timedelta(minutes=1)),
        Completed(at=T0 + timedelta(seconds=5), actor="r", cost=2.5),
    ])
    assert p.state is CallState.COMPLETED
    assert p.version == 6
    assert (p.status, p.settlement, p.provider_cost) == ("completed", "committed", 2.5)
    assert (p.provider_task_id, p.reconcile_attempts, p.reconcile_last_error) == (
        "t1", 1, "slow")
    assert p.provider_call_started_at == T0
    assert p.call_finished_at == T0 + timedelta(seconds=5)
    assert p.finalize_owner is None


def test_created_leaves_host_status_alone_and_sweep_sets_the_seed_error() -> None:
    p = apply(EMPTY, CallStarted(at=T0, actor="w", kind="anthropic-sync", sync=True))
    assert p.status is None
    assert p.call_sync
    p = apply(p, Swept(at=T0, actor="r"))
    assert (p.status, p.error_message, p.settlement) == (
        "failed", "reconcile_no_recovery", "refunded")


def test_exhausted_sets_the_seed_error() -> None:
    p = fold([CallStarted(at=T0, actor="w", kind="kie-standard"),
              Exhausted(at=T0, actor="r", attempts=18, last_error="502")])
    assert (p.error_message, p.reconcile_attempts, p.reconcile_last_error) == (
        "reconcile_exhausted", 18, "502")


@pytest.mark.parametrize(("status", "state", "settlement"), [
    ("completed", CallState.COMPLETED, "host"),  # the host commits its own amount
    ("cancelled", CallState.CANCELLED, "refunded"),
    ("failed", CallState.FAILED, "refunded"),
    ("timed_out", CallState.FAILED, "refunded"),
])
def test_host_ended_ends_the_call_as_the_host_wrote_and_keeps_its_status(
        status: str, state: CallState, settlement: str) -> None:
    p = fold([CallStarted(at=T0, actor="w", kind="kie-standard"),
              TaskCreated(at=T0, actor="w", task_id="t"),
              HostEnded(at=T0, actor="r", status=status)])
    assert (p.state, p.status, p.settlement, p.error_message) == (
        state, status, settlement, None)


def test_adopted_keeps_the_hosts_attempt_counters() -> None:
    p = apply(EMPTY, Adopted(at=T0, actor="r", kind="kie-veo", task_id="v1",
                             reconcile_attempts=5, reconcile_last_error="host: 502"))
    assert (p.reconcile_attempts, p.reconcile_last_error) == (5, "host: 502")


def test_adopted_with_task_id_starts_polling() -> None:
    p = apply(EMPTY, Adopted(at=T0, actor="r", kind="kie-veo", task_id="v1",
                             call_started_at=T0 - timedelta(hours=1)))
    assert p.state is CallState.POLLING
    assert p.provider_task_id == "v1"
    assert p.provider_call_started_at == T0 - timedelta(hours=1)


def test_finalize_claim_takeover_needs_an_expired_lease() -> None:
    base = fold([CallStarted(at=T0, actor="w", kind="k"),
                 UpstreamSucceeded(at=T0, actor="w", result=UpstreamResult()),
                 FinalizeClaimed(at=T0, actor="w", owner="w",
                                 lease_until=T0 + timedelta(seconds=30))])
    with pytest.raises(InvalidTransition, match="lease held by w"):
        apply(base, FinalizeClaimed(at=T0 + timedelta(seconds=29), actor="r", owner="r",
                                    lease_until=T0 + timedelta(seconds=90)))
    taken = apply(base, FinalizeClaimed(at=T0 + timedelta(seconds=30), actor="r", owner="r",
                                        lease_until=T0 + timedelta(seconds=90)))
    assert taken.finalize_owner == "r"


def _reference_accepts(steps: list[tuple[str, int, int]]) -> bool:
    """An independent model: the design table plus the lease rule."""
    state, lease_until, now = "none", None, 0
    for name, gap, lease in steps:
        now += gap
        dest = EXPECTED[state].get(name)
        if dest is None:
            return False
        if name == "FinalizeClaimed":
            if state == "finalizing" and lease_until is not None and now < lease_until:
                return False
            lease_until = now + lease
        if name in ("FinalizeFailed", "Completed"):
            lease_until = None
        state = dest
    return True


step = st.tuples(st.sampled_from(NAMES), st.integers(0, 20), st.integers(0, 20))


@given(st.lists(step, max_size=12))
def test_fold_accepts_exactly_the_legal_sequences(steps: list[tuple[str, int, int]]) -> None:
    """Invariant: fold(events) succeeds iff every event may follow the state before it
    (DESIGN §3 table + lease takeover rule); when it succeeds, call_version equals the
    number of events, and a settlement is set iff the final state is terminal."""
    events, now = [], T0
    for name, gap, lease in steps:
        now += timedelta(seconds=gap)
        events.append(_make(name, now, lease))
    legal = _reference_accepts(steps)
    if not legal:
        with pytest.raises(InvalidTransition):
            fold(events)
        return
    p = fold(events)
    assert p.version == len(events)
    assert (p.settlement is not None) == p.terminal


@given(st.lists(step, min_size=1, max_size=12))
def test_terminal_states_absorb_every_further_event(steps: list[tuple[str, int, int]]) -> None:
    """Invariant: once a prefix folds to a terminal state, no event may follow it."""
    events, now = [], T0
    for name, gap, lease in steps:
        now += timedelta(seconds=gap)
        events.append(_make(name, now, lease))
    p = EMPTY
    for e in events:
        if p.terminal:
            with pytest.raises(InvalidTransition):
                apply(p, e)
            return
        try:
            p = apply(p, e)
        except InvalidTransition:
            return
