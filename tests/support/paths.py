"""Event histories shared by the fold, machine, timeline and audit tests: the state
table the machine must have (:data:`EXPECTED`), the named paths of a call
(:data:`PATHS`: completed, failed, ...), and the host writes of the race machines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from callwarden.events.states import (
    TERMINAL,
)
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
from callwarden.machine import EMPTY

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


C, P, U, F = "created", "polling", "upstream_succeeded", "finalizing"

# state -> {event type: resulting state}; every pair not listed is illegal.
EXPECTED: dict[str, dict[str, str]] = {
    # HostEnded's table destination is "failed"; the fold refines it from the payload
    # (completed / cancelled when the host wrote those).
    EMPTY: {"CallStarted": C, "Adopted": C, "Cancelled": "cancelled", "HostEnded": "failed"},
    C: {"TaskCreated": P, "UpstreamSucceeded": U, "UpstreamFailed": "failed",
        "Swept": "swept", "Exhausted": "exhausted", "Cancelled": "cancelled",
        "HostEnded": "failed", "ReconcileAttempted": C},
    P: {"UpstreamSucceeded": U, "UpstreamFailed": "failed", "Swept": "swept",
        "Exhausted": "exhausted", "Cancelled": "cancelled", "HostEnded": "failed",
        "ReconcileAttempted": P},
    U: {"FinalizeClaimed": F, "UpstreamFailed": "failed", "Exhausted": "exhausted",
        "Cancelled": "cancelled", "HostEnded": "failed", "ReconcileAttempted": U},
    F: {"FinalizeClaimed": F, "FinalizeFailed": U, "Completed": "completed",
        "UpstreamFailed": "failed", "Exhausted": "exhausted", "Cancelled": "cancelled",
        "HostEnded": "failed", "ReconcileAttempted": F},
    **{t.value: {} for t in sorted(TERMINAL, key=lambda t: t.value)},
    # the one loop on a terminal state: the policy's settlement of what a host left
    # reserved on a job it completed (the fold allows it only from settlement "host")
    "completed": {"LeftoverSettled": "completed"},
}


# What the host does with plain SQL: the seed's own statements (a job in flight is
# completed, failed or cancelled; a reservation settled with a compare-and-set on
# 'reserved'), never through callwarden.
_IN_FLIGHT = " AND status IN ('pending', 'processing')"


HOST_WRITES: dict[str, list[str]] = {
    "complete_and_commit": [
        "UPDATE jobs SET status = 'completed' WHERE id = %(job)s" + _IN_FLIGHT,
        "UPDATE usage_logs SET status = 'committed', credits_charged = credits_reserved, "
        "settled_at = now() WHERE job_id = %(job)s AND status = 'reserved'"],
    "fail_and_refund": [
        "UPDATE jobs SET status = 'failed', error_message = 'host: failed' "
        "WHERE id = %(job)s" + _IN_FLIGHT,
        "UPDATE usage_logs SET status = 'refunded', credits_charged = 0, settled_at = now() "
        "WHERE job_id = %(job)s AND status = 'reserved'"],
    "cancel": ["UPDATE jobs SET status = 'cancelled' WHERE id = %(job)s" + _IN_FLIGHT],
    "refund_only": [
        "UPDATE usage_logs SET status = 'refunded', credits_charged = 0, settled_at = now() "
        "WHERE job_id = %(job)s AND status = 'reserved'"],
    "second_reservation": [
        "INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
        "SELECT id, user_id, 'reserved', 3 FROM jobs WHERE id = %(job)s "
        "AND status IN ('pending', 'processing')"],
    "seed_columns": [
        "UPDATE jobs SET provider_kind = COALESCE(provider_kind, 'kie-standard'), "
        "provider_call_started_at = COALESCE(provider_call_started_at, now()), "
        "reconcile_attempts = reconcile_attempts + 1, reconcile_last_error = 'host: retry' "
        "WHERE id = %(job)s AND call_state IS NULL"],
    "processing": ["UPDATE jobs SET status = 'processing' WHERE id = %(job)s "
                   "AND status = 'pending'"],
}


HOST_TERMINAL = {"complete_and_commit": "completed", "fail_and_refund": "failed",
                 "cancel": "cancelled"}
