"""The pure fold: specific paths, and properties over histories walked from the real
transition table (``tests/histories.py``: legal by construction, one illegal event injected
in about one history in ten, at a known index)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings

from callwarden.events.states import HOST_SETTLES, CallState, InvalidTransition, TerminalStateError
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
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.columns import from_row, to_columns
from callwarden.projections.fold import EMPTY, CallProjection, apply, fold
from tests.histories import ENDINGS, History, histories, label
from tests.support.paths import EXPECTED

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
        case "LeftoverSettled":
            return LeftoverSettled(at=at, actor="a", status="completed")
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


def _reference_accepts(events: Sequence[Event]) -> bool:
    """An independent model: the design table (tests/support/paths.py's EXPECTED, written apart from
    events/states.py), the two payload refinements (Adopted with a task id polls; HostEnded
    ends as the host's status says) and the finalization-lease rule."""
    state, lease_until = "none", None
    for e in events:
        name = type(e).__name__
        dest = EXPECTED[state].get(name)
        if dest is None:
            return False
        if isinstance(e, FinalizeClaimed):
            if state == "finalizing" and lease_until is not None and e.at < lease_until:
                return False
            lease_until = e.lease_until
        if name in ("FinalizeFailed", "Completed"):
            lease_until = None
        if isinstance(e, Adopted) and e.task_id:
            dest = "polling"
        if isinstance(e, HostEnded):
            dest = {"completed": "completed", "cancelled": "cancelled"}.get(e.status, "failed")
        state = dest
    return True


def _fold_or_error(events: Sequence[Event]) -> CallProjection | InvalidTransition:
    try:
        return fold(events)
    except InvalidTransition as exc:
        return exc


@given(histories(illegal_rate=0.3))
def test_fold_accepts_exactly_the_legal_sequences(h: History) -> None:
    """Invariant: fold(events) succeeds iff every event may follow the state before it
    (the independent reference model above: DESIGN §3 table + refinements + lease rule);
    when it succeeds, call_version equals the number of events, and a settlement is set
    iff the final state is terminal."""
    label(h)
    got = _fold_or_error(h.events)
    assert isinstance(got, CallProjection) == _reference_accepts(h.events)
    if isinstance(got, CallProjection):
        assert got.version == len(h.events)
        assert (got.settlement is not None) == got.terminal


@given(histories(illegal_rate=0))
def test_walks_fold_to_the_predicted_states(h: History) -> None:
    """Invariant: applying a legal history one event at a time passes through exactly the
    states the walk of the transition table predicts, and each prefix's fold equals the
    step-by-step projection (version = events so far)."""
    label(h)
    p = EMPTY
    for i, (e, state) in enumerate(zip(h.events, h.states, strict=True)):
        p = apply(p, e)
        assert p.state is state
        assert p.version == i + 1
        assert fold(h.events[:i + 1]) == p
    assert h.final_state is p.state


@given(histories(illegal_rate=1))
def test_an_injected_illegal_event_raises_and_nothing_after_it_is_applied(
        h: History) -> None:
    """Invariant: the one illegal event injected into a walk (an event its state does not
    take, any event after a terminal one, a takeover of a live lease) raises the typed
    error -- TerminalStateError after a terminal state, InvalidTransition otherwise --
    naming the state and the event, when applied to the fold of the events before it;
    and the whole history's fold raises the same error, so none of the legal events
    after it is ever applied."""
    label(h)
    assert h.illegal_at is not None
    assert h.error is not None
    p = fold(h.legal)
    assert p.state is h.final_state
    bad = h.events[h.illegal_at]
    with pytest.raises(h.error) as raised:
        apply(p, bad)
    assert raised.value.state is p.state
    assert raised.value.event_type == type(bad).__name__
    with pytest.raises(h.error):
        fold(h.events)


@given(histories(illegal_rate=0, endings=tuple(e for e in ENDINGS if e != "open")))
def test_terminal_states_absorb_every_further_event(h: History) -> None:
    """Invariant: once a walk is terminal, every event type (each of the history's own
    events, re-stamped later) raises TerminalStateError, and the settlement, the finish
    time and the terminal state it entered never change; the one exception is
    LeftoverSettled on a completion the host was left to commit (settlement "host"),
    which only settles what the host left (committed: state and finish time kept), and
    is refused (InvalidTransition) on any other terminal call."""
    label(h)
    p = fold(h.events)
    assert p.terminal
    later = h.events[-1].at + timedelta(seconds=1)
    for e in (*h.events, *(_make(n, later, 30) for n in NAMES)):
        e = msgspec.structs.replace(e, at=later)
        if isinstance(e, LeftoverSettled):
            if p.settlement != HOST_SETTLES:
                with pytest.raises(InvalidTransition):
                    apply(p, e)
                continue
            q = apply(p, e)
            assert (q.state, q.call_finished_at, q.settlement) == (
                p.state, p.call_finished_at, "committed")
            continue
        with pytest.raises(TerminalStateError):
            apply(p, e)


@given(histories(illegal_rate=0))
def test_settlement_follows_the_state_entered(h: History) -> None:
    """Invariant: a walk settles exactly when it enters a terminal state: committed for a
    completion, "host" for a host's completion (the host commits its own amount), refunded
    for every other ending; open calls carry no settlement, no finish time, and keep the
    host's status unless callwarden is past created."""
    label(h)
    p = fold(h.events)
    expected = {"open": None, "Completed": "committed", "HostEnded:completed": "host"}.get(
        h.ending, "refunded")
    assert p.settlement == expected
    assert (p.call_finished_at == h.events[-1].at) == p.terminal
    if p.state is CallState.CREATED:
        assert p.status is None


@given(histories(illegal_rate=0))
def test_every_reachable_projection_round_trips_through_its_columns(h: History) -> None:
    """Invariant: every projection a legal walk reaches (each prefix) is rebuilt exactly by
    from_row from the columns to_columns writes (the row the append statement leaves)."""
    label(h)
    p = EMPTY
    for e in h.events:
        p = apply(p, e)
        cols = to_columns(p)
        row = {**cols, "call_version": cols.pop("new_version")}
        assert from_row(row) == p


# Every state and every way of ending a call that the default profile must reach.
REQUIRED = ({f"state: {s.value}" for s in CallState}
            | {f"ending: {e}" for e in ENDINGS}
            | {f"illegal: {k}" for k in ("after terminal", "out of order", "from empty")})


def test_the_profile_reaches_every_state_and_every_terminal() -> None:
    """Coverage is measured, not hoped: derandomized runs of the history strategy, one per
    ending (ENDINGS: each terminal event and host status, and open; 12 examples each, or a
    tenth of the profile's count when larger; one history in two with an illegal event,
    and 12 more per ending with one in every history), visit every CallState, end in every
    way, inject each kind of illegal event, and include
    long histories (8+ events, 20+ under deep). Fails naming what was never reached.
    (Stratified by ending because Hypothesis' mutator clusters a 40-example run on a few
    endings: the label counts of the other properties show which.)"""
    seen: Counter[str] = Counter()
    longest = [0]
    for ending in ENDINGS:
        @settings(settings(), max_examples=max(12, settings().max_examples // 10),
                  derandomize=True, database=None)
        @given(histories(illegal_rate=0.5, endings=(ending,)))
        def walk(h: History) -> None:
            seen.update(f"state: {s.value}" for s in h.states)
            seen[f"ending: {h.ending}"] += 1
            if h.illegal_kind is not None:
                seen[f"illegal: {h.illegal_kind}"] += 1
            longest[0] = max(longest[0], len(h.legal))

        walk()
        # every history of this run has an illegal event: the three kinds no longer hang
        # on the true-random injection of the run above (one in two histories, the event
        # at the start in about one of ten of those: "from empty" was missed once in CI)
        @settings(settings(), max_examples=12, derandomize=True, database=None)
        @given(histories(illegal_rate=1.0, endings=(ending,)))
        def inject(h: History) -> None:
            assert h.illegal_kind is not None
            seen[f"illegal: {h.illegal_kind}"] += 1

        inject()
    assert set(seen) >= REQUIRED, f"never reached: {sorted(REQUIRED - set(seen))}"
    assert longest[0] >= (20 if settings().max_examples >= 2000 else 8), longest[0]
