"""The reconciler's pure decision: the table in ``callwarden.reconciler.decide``, row by row, and
properties over every row hypothesis can build."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from callwarden.events.states import LEGAL, CallState
from callwarden.projections.fold import CallProjection
from callwarden.providers.kinds import KINDS
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.decide import (
    LEGACY_KIND,
    Action,
    Adopt,
    Candidate,
    Exhaust,
    Finalize,
    PollUpstream,
    RecordHostEnded,
    Skip,
    Sweep,
    decide,
    next_scan_delay,
    past_horizon,
)

NOW = datetime(2026, 5, 19, 12, 0, tzinfo=UTC)
CFG = ReconcileConfig()
S = CallState


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


_CALL = {"call_state": "state", "call_version": "version"}
_HOST = ("id", "heartbeat_at", "started_at", "created_at", "legacy_cutoff")


def cand(**kw: Any) -> Candidate:
    """A candidate from flat row columns (``call_state``, ``status``, ``heartbeat_at``...)."""
    call = {_CALL.get(k, k): v for k, v in kw.items() if k not in _HOST}
    host = {k: v for k, v in kw.items() if k in _HOST}
    return Candidate(**host, call=CallProjection(**call))


def row(**kw: Any) -> Candidate:
    base: dict[str, Any] = {
        "id": uuid.UUID(int=1), "status": "processing", "call_state": S.POLLING,
        "call_version": 2, "provider_kind": "kie-standard", "provider_task_id": "t1",
        "provider_call_started_at": ago(11 * 60), "created_at": ago(12 * 60)}
    return cand(**{**base, **kw})


# -- the table, row by row ----------------------------------------------------------------

def test_async_call_past_threshold_is_polled_once() -> None:
    assert decide(row(), NOW, CFG) == PollUpstream(kind="kie-standard", task_id="t1",
                                                   call_started_at=ago(11 * 60))


def test_call_younger_than_its_kind_threshold_is_left_alone() -> None:
    assert isinstance(decide(row(provider_call_started_at=ago(9 * 60)), NOW, CFG), Skip)
    lip = row(provider_kind="kie-lip-sync", provider_call_started_at=ago(60 * 60))
    assert isinstance(decide(lip, NOW, CFG), Skip)


def test_fresh_heartbeat_is_left_alone_even_past_threshold() -> None:
    action = decide(row(provider_call_started_at=ago(3600), heartbeat_at=ago(30)), NOW, CFG)
    assert action == Skip(reason="heartbeat fresh")


def test_silent_heartbeat_is_acted_on_before_the_threshold() -> None:
    young = row(provider_call_started_at=ago(120), heartbeat_at=ago(61))
    assert isinstance(decide(young, NOW, CFG), PollUpstream)


def test_next_attempt_in_the_future_is_left_alone() -> None:
    assert decide(row(reconcile_next_at=NOW + timedelta(seconds=1)), NOW, CFG) == Skip(
        reason="next attempt not due")
    assert isinstance(decide(row(reconcile_next_at=NOW), NOW, CFG), PollUpstream)


def test_attempt_cap_exhausts_with_the_last_error() -> None:
    action = decide(row(reconcile_attempts=18, reconcile_last_error="HTTP 500"), NOW, CFG)
    assert action == Exhaust(attempts=18, last_error="HTTP 500")
    assert isinstance(decide(row(reconcile_attempts=17), NOW, CFG), PollUpstream)


def test_sync_kinds_no_task_id_and_unknown_kinds_are_swept() -> None:
    for kind in ("kie-llm", "elevenlabs-sync", "anthropic-sync"):
        stale = row(call_state=S.CREATED, provider_kind=kind, provider_task_id=None,
                    call_sync=True)
        assert isinstance(decide(stale, NOW, CFG), Sweep)
    voice_clone = row(provider_kind="elevenlabs-async", call_sync=True,
                      provider_call_started_at=ago(16 * 60))
    assert isinstance(decide(voice_clone, NOW, CFG), Sweep)
    assert isinstance(decide(row(call_state=S.CREATED, provider_task_id=None), NOW, CFG),
                      Sweep)
    unknown = row(provider_kind="midjourney", provider_call_started_at=ago(3601))
    assert isinstance(decide(unknown, NOW, CFG), Sweep)
    assert isinstance(decide(row(provider_kind="midjourney"), NOW, CFG), Skip)


def test_upstream_succeeded_and_expired_finalization_are_finalized() -> None:
    assert decide(row(call_state=S.UPSTREAM_SUCCEEDED), NOW, CFG) == Finalize()
    expired = row(call_state=S.FINALIZING, finalize_lease_until=ago(1))
    assert decide(expired, NOW, CFG) == Finalize()
    held = row(call_state=S.FINALIZING, finalize_lease_until=NOW + timedelta(seconds=5))
    assert decide(held, NOW, CFG) == Skip(reason="finalization lease held")


def test_seed_columns_only_row_is_adopted_then_polled() -> None:
    seed = row(call_state=None, call_version=0)
    action = decide(seed, NOW, CFG)
    assert isinstance(action, Adopt)
    assert (action.kind, action.task_id, action.call_started_at) == (
        "kie-standard", "t1", ago(11 * 60))
    assert action.then == PollUpstream(kind="kie-standard", task_id="t1",
                                       call_started_at=ago(11 * 60))


def test_legacy_row_without_kind_is_adopted_then_swept_after_the_legacy_threshold() -> None:
    legacy = row(call_state=None, call_version=0, provider_kind=None, provider_task_id=None,
                 provider_call_started_at=None, started_at=ago(3601), created_at=ago(7200),
                 legacy_cutoff=ago(7000))
    action = decide(legacy, NOW, CFG)
    assert isinstance(action, Adopt)
    assert (action.kind, action.call_started_at) == (LEGACY_KIND, ago(3601))
    assert isinstance(action.then, Sweep)
    younger = msgspec_replace(legacy, started_at=ago(3599))
    assert isinstance(decide(younger, NOW, CFG), Skip)


def test_open_call_the_host_ended_is_recorded_as_the_host_decided() -> None:
    for status in ("cancelled", "completed", "failed", "archived"):
        assert decide(row(status=status, heartbeat_at=ago(1)), NOW, CFG) == RecordHostEnded(
            status=status)
    assert decide(row(status="cancelled", call_state=S.CANCELLED), NOW, CFG) == Skip(
        reason="terminal")


def test_a_result_that_cannot_be_stored_is_exhausted_at_the_cap() -> None:
    stuck = row(call_state=S.UPSTREAM_SUCCEEDED, reconcile_attempts=CFG.attempt_cap)
    assert isinstance(decide(stuck, NOW, CFG), Exhaust)
    assert isinstance(decide(row(call_state=S.UPSTREAM_SUCCEEDED), NOW, CFG), Finalize)


def test_nothing_holds_a_call_open_past_its_horizon() -> None:
    horizon = CFG.horizon_s("kie-standard")
    for held in ({"heartbeat_at": ago(1)}, {"reconcile_next_at": ago(-60)},
                 {"call_state": S.FINALIZING, "finalize_lease_until": ago(-60)}):
        young = row(provider_call_started_at=ago(horizon - 1), **held)
        assert isinstance(decide(young, NOW, CFG), Skip), held
        old = row(provider_call_started_at=ago(horizon), **held)
        assert isinstance(decide(old, NOW, CFG), Exhaust), held


def test_call_less_row_created_after_the_cutoff_is_the_hosts() -> None:
    queued = row(call_state=None, call_version=0, provider_kind=None, provider_task_id=None,
                 provider_call_started_at=None, started_at=None, created_at=ago(7200),
                 legacy_cutoff=ago(9000))
    assert decide(queued, NOW, CFG) == Skip(
        reason="no call, created after the legacy cutoff: the host's job")
    legacy = msgspec_replace(queued, created_at=ago(9500))
    assert isinstance(decide(legacy, NOW, CFG), Adopt)


def test_terminal_and_host_finished_rows_are_left_alone() -> None:
    assert decide(row(call_state=S.COMPLETED), NOW, CFG) == Skip(reason="terminal")
    assert isinstance(decide(row(call_state=None, status="completed"), NOW, CFG), Skip)


def test_scan_delay_is_jittered_within_twenty_percent() -> None:
    assert next_scan_delay(CFG, 0.0) == 24
    assert next_scan_delay(CFG, 0.5) == 30
    assert 35.9 < next_scan_delay(CFG, 0.9999) < 36


def test_decision_module_imports_no_io_library() -> None:
    code = ("import sys, callwarden.reconciler.decide\n"
            "print(sorted(m for m in ('psycopg', 'psycopg_pool', 'aiohttp', 'boto3') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def msgspec_replace(c: Candidate, **kw: Any) -> Candidate:
    """``c`` with flat columns replaced (call fields go to the stored projection)."""
    call = {_CALL.get(k, k): v for k, v in kw.items() if k not in _HOST}
    host = {k: v for k, v in kw.items() if k in _HOST}
    return msgspec.structs.replace(c, **host, call=msgspec.structs.replace(c.call, **call))


# -- properties ---------------------------------------------------------------------------

_times = st.one_of(st.none(), st.integers(-600, 3 * 3600).map(ago))
_kinds = st.one_of(st.none(), st.sampled_from([*KINDS, "midjourney"]))
candidates = st.builds(
    cand, id=st.just(uuid.UUID(int=7)),
    status=st.sampled_from(["pending", "processing", "completed", "failed", "cancelled"]),
    call_state=st.one_of(st.none(), st.sampled_from(list(CallState))),
    call_version=st.integers(0, 40), provider_kind=_kinds,
    provider_task_id=st.one_of(st.none(), st.just("task")),
    provider_call_started_at=_times, call_sync=st.booleans(),
    reconcile_attempts=st.integers(0, 25), reconcile_next_at=_times,
    finalize_lease_until=_times, heartbeat_at=_times, started_at=_times,
    created_at=_times)

_POLL_EVENTS = ("UpstreamSucceeded", "UpstreamFailed", "Swept", "ReconcileAttempted")


def _events(action: Action) -> tuple[str, ...]:
    """The event types an action may append (a poll appends one of several)."""
    return {Sweep: ("Swept",), Exhaust: ("Exhausted",), Finalize: ("FinalizeClaimed",),
            PollUpstream: _POLL_EVENTS, RecordHostEnded: ("HostEnded",),
            Skip: ()}[type(action)]


@given(candidates)
def test_every_decision_is_legal_in_the_state_machine(c: Candidate) -> None:
    """Invariant: whatever ``decide`` returns can be recorded from the row's state — a
    row with no events is adopted first (``Adopted`` from ∅), and what follows adoption is
    legal from the adopted state. The reconciler never asks for an illegal transition."""
    action = decide(c, NOW, CFG)
    state = c.call.state
    if isinstance(action, Adopt):
        assert state is None
        assert (None, "Adopted") in LEGAL
        state = S.POLLING if action.task_id else S.CREATED
        action = action.then
        assert not isinstance(action, Adopt)
    for name in _events(action):
        assert (state, name) in LEGAL, (state, name, action)


@given(candidates)
def test_a_live_or_not_yet_due_call_is_never_acted_on(c: Candidate) -> None:
    """Invariant: a call with events whose heartbeat is fresh, or whose next attempt is
    not due, is left alone — unless the host ended the job, or the call is past its
    horizon (then nothing holds it open)."""
    fresh = c.heartbeat_at is not None and NOW - c.heartbeat_at < timedelta(seconds=60)
    not_due = c.call.reconcile_next_at is not None and c.call.reconcile_next_at > NOW
    host_open = c.call.status in ("pending", "processing")
    if (c.call.state is not None and (fresh or not_due) and host_open
            and not past_horizon(c, NOW, CFG)):
        assert isinstance(decide(c, NOW, CFG), Skip)


@given(candidates)
def test_no_open_call_is_skipped_past_its_horizon(c: Candidate) -> None:
    """Invariant (horizon): an open call older than its threshold plus cap x re-poll
    interval is acted on whatever holds it (heartbeat, lease, due time)."""
    if c.call.state in (S.CREATED, S.POLLING, S.UPSTREAM_SUCCEEDED, S.FINALIZING) and \
            past_horizon(c, NOW, CFG):
        assert not isinstance(decide(c, NOW, CFG), Skip)


@given(candidates)
def test_an_abandoned_open_call_is_always_acted_on(c: Candidate) -> None:
    """Invariant (horizon): an open created/polling/upstream_succeeded call with no
    heartbeat, no pending next attempt, no live finalization lease and older than every
    threshold is never skipped — so no dead worker's call stays open forever."""
    c = msgspec_replace(c, heartbeat_at=None, reconcile_next_at=None,
                        finalize_lease_until=None, provider_call_started_at=ago(3 * 3600))
    if c.call.state in (S.CREATED, S.POLLING, S.UPSTREAM_SUCCEEDED, S.FINALIZING):
        assert not isinstance(decide(c, NOW, CFG), Skip)


@given(candidates, st.integers(0, 3600))
def test_acting_is_monotonic_in_time(c: Candidate, later: int) -> None:
    """Invariant: once a call is stale it stays stale — a call acted on at ``now`` is
    still acted on at any later time (waiting never hides work)."""
    if not isinstance(decide(c, NOW, CFG), Skip):
        assert not isinstance(decide(c, NOW + timedelta(seconds=later), CFG), Skip)
