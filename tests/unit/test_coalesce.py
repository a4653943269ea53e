"""The receiver's per-job coalescing, as pure rules: single flight, the interval, and
what a signal about a call stuck in ``upstream_succeeded`` may do."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from callwarden.events.states import CallState
from callwarden.projections.fold import CallProjection
from callwarden.service.coalesce import Throttle, finalize_step

JOB, OTHER = uuid.UUID(int=1), uuid.UUID(int=2)
NOW = datetime(2026, 12, 3, tzinfo=UTC)


def test_one_piece_of_work_per_job_and_none_sooner_than_the_interval() -> None:
    t = Throttle(10.0)
    assert t.begin(JOB, 100.0)
    assert not t.begin(JOB, 100.0)  # in flight
    assert t.begin(OTHER, 100.0)  # another job is not held up
    t.end(JOB)
    assert not t.begin(JOB, 109.9)  # within the interval
    assert t.wait_s(JOB, 105.0) == 5.0
    assert t.begin(JOB, 109.9, anyway=True)  # a trailing poll may start at once
    t.end(JOB)
    assert t.begin(JOB, 120.0)  # the interval counts from the last start


def test_a_start_that_failed_on_our_side_does_not_count() -> None:
    t = Throttle(10.0)
    assert t.begin(JOB, 0.0)
    t.end(JOB)
    t.forget(JOB)
    assert t.begin(JOB, 1.0)


def test_the_throttle_forgets_jobs_whose_interval_is_over() -> None:
    t = Throttle(1.0)
    for i in range(1000):
        assert t.begin(uuid.UUID(int=i), float(i))
        t.end(uuid.UUID(int=i))
    assert len(t._started) <= 2


def test_a_stuck_call_is_finalized_when_due_and_exhausted_at_the_cap() -> None:
    p = CallProjection(state=CallState.UPSTREAM_SUCCEEDED)
    assert finalize_step(p, NOW, 18) == "finalize"
    held = CallProjection(state=CallState.UPSTREAM_SUCCEEDED, reconcile_attempts=3,
                          reconcile_next_at=NOW + timedelta(seconds=1))
    assert finalize_step(held, NOW, 18) == "held"
    assert finalize_step(held, NOW + timedelta(seconds=1), 18) == "finalize"
    capped = CallProjection(state=CallState.UPSTREAM_SUCCEEDED, reconcile_attempts=18,
                            reconcile_next_at=NOW + timedelta(seconds=1))
    assert finalize_step(capped, NOW, 18) == "exhaust"
