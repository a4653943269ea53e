"""The deterministic simulation (``tests/simulation/driver.py``; docs/testing.md,
"Deterministic simulation"): the real runner, finalizer, reconcilers and webhook receiver
interleaved by a seeded scheduler on a simulated clock, with seeded faults, crashes and
host writes, against a real Postgres database, checked after every step.

Schedules: ``CALLWARDEN_SIM_SCHEDULES`` (default 200; 10,000 under
``HYPOTHESIS_PROFILE=deep``), from seed ``CALLWARDEN_SIM_FIRST_SEED`` (default 0), over
``CALLWARDEN_SIM_JOBS`` processes (default 1; 2 under the deep profile)."""

from __future__ import annotations

import os

from tests.simulation.driver import INVARIANTS
from tests.simulation.run import Postgres, merge_labels, run_parallel, run_seeds

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SCHEDULES = int(os.environ.get("CALLWARDEN_SIM_SCHEDULES", 10_000 if DEEP else 200))
FIRST = int(os.environ.get("CALLWARDEN_SIM_FIRST_SEED", 0))
JOBS = int(os.environ.get("CALLWARDEN_SIM_JOBS", 2 if DEEP else 1))

#: What the default run must have produced at least once (else it proves too little).
COVERAGE = ("end_completed_committed", "end_failed_refunded", "end_swept_refunded",
            "end_exhausted_refunded", "end_cancelled_refunded", "end_completed_host",
            "commit_two_reservations", "crash", "redelivery", "host_complete_commit",
            "host_cancel", "reconciler_recovered", "reconciler_host_ended",
            "reconciler_lost_race", "lease_takeover", "webhook_applied", "webhook_duplicate",
            "fault_create_http_status", "fault_create_rate_limit", "fault_poll_reset")


async def test_every_schedule_holds_every_invariant(pg_admin_url: str) -> None:
    """For every seed's schedule, after every step and at the horizon: no reservation moved
    twice or from a non-reserved status; a commit charges min(cost, reserved) across the
    rows it settled and a refund 0; nothing is left reserved by a call callwarden settled;
    at most one upstream create per job; a host's ended status is never overwritten; the
    projection equals the fold of the log; after the horizon every call is terminal
    (``INVARIANTS``). The run also reaches every outcome in ``COVERAGE``."""
    if JOBS > 1:
        n, labels, bad = run_parallel(FIRST, SCHEDULES, jobs=JOBS)
        assert bad == []
        assert n == SCHEDULES
    else:
        pg = Postgres(pg_admin_url)
        try:
            outcomes = await run_seeds(range(FIRST, FIRST + SCHEDULES), postgres=pg)
        finally:
            pg.close()
        assert len(outcomes) == SCHEDULES
        labels = merge_labels(outcomes)
    assert set(INVARIANTS) >= {"reservation_once", "charged", "one_create", "terminal"}
    missing = [c for c in COVERAGE if not labels.get(c)] if SCHEDULES >= 200 else []
    assert missing == [], labels


async def test_a_seed_is_one_schedule(pg_admin_url: str) -> None:
    """A seed is one schedule: run twice, the step trace (every actor step, its database
    operation, crash, fault, host write and tick) is identical, so a failing seed replays
    exactly with ``python -m tests.simulation --seed N``."""
    seeds = range(FIRST, FIRST + 5)
    pg = Postgres(pg_admin_url)
    try:
        first = await run_seeds(seeds, postgres=pg)
        second = await run_seeds(seeds, postgres=pg)
    finally:
        pg.close()
    assert [o.digest for o in first] == [o.digest for o in second]
    assert len({o.digest for o in first}) == len(first)
