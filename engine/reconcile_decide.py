"""What the reconciler does with one claimed call: a pure function of the row and ``now``.

River's ``makeRetryDecision`` in our terms. ``decide(row, now, config)`` reads no clock and
touches no I/O; the reconciler carries the action out through the engine's fenced write
path. The decision table (first match wins):

====================================================  ========================================
row                                                   action
====================================================  ========================================
no events, not stale (legacy age / kind threshold)    Skip
no events, stale                                      Adopt (record ``Adopted``), then the
                                                      decision for the adopted call
terminal                                              Skip
open, but the host set ``status = 'cancelled'``       Cancel (record it: refund)
``reconcile_next_at`` in the future                   Skip
heartbeat fresh (within ``heartbeat_timeout_s``)      Skip
finalizing with a live finalization lease             Skip
heartbeat absent and younger than its threshold       Skip
upstream_succeeded, or finalizing (lease expired)     Finalize
``reconcile_attempts >= attempt_cap``                 Exhaust
unknown kind, sync call, or no task id                Sweep
async kind with a task id                             PollUpstream (one poll)
====================================================  ========================================

"Stale" is measured from ``provider_call_started_at`` against the kind's threshold, or —
when the worker heartbeats — from the last heartbeat against ``heartbeat_timeout_s`` (so a
dead worker's call is acted on before its kind's threshold). A row with no
``provider_call_started_at`` is aged from ``started_at``/``created_at`` against
``legacy_threshold_s``, as is a row whose kind no handler knows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from engine.reconcile_config import ReconcileConfig
from events.states import NON_TERMINAL, CallState
from events.types import Adopted
from projections.columns import from_row
from projections.fold import CallProjection, apply
from providers.kinds import KINDS

__all__ = [
    "LEGACY_KIND",
    "Action",
    "Adopt",
    "Cancel",
    "Candidate",
    "Exhaust",
    "Finalize",
    "PollUpstream",
    "Skip",
    "Sweep",
    "decide",
    "is_stale",
    "next_scan_delay",
]

LEGACY_KIND = "legacy"  # the kind recorded when adopting a row that names none


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed ``jobs`` row: the call as stored (``call``, the same projection every
    writer folds onto; its ``status`` is the host's column), the heartbeat, and the host's
    own timestamps (to age rows with no events)."""

    id: uuid.UUID
    call: CallProjection
    heartbeat_at: datetime | None = None
    started_at: datetime | None = None
    created_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Candidate:
        """From a row with the ``load_projection`` columns plus heartbeat and timestamps."""
        return cls(id=row["id"], call=from_row(row), heartbeat_at=row.get("heartbeat_at"),
                   started_at=row.get("started_at"), created_at=row.get("created_at"))


class Skip(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str


class Sweep(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str = "reconcile_no_recovery"
    why: str = ""


class PollUpstream(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One poll of ``task_id``; ``call_started_at`` tells the client how long the task has
    existed (KIE's "recordInfo is null" grace window is counted from creation)."""

    kind: str
    task_id: str
    call_started_at: datetime | None = None


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The host cancelled the job on its row: record ``Cancelled(by="host")``."""


class Finalize(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class Exhaust(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    attempts: int
    last_error: str | None = None


class Adopt(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Record ``Adopted`` with the observed columns, then do ``then``."""

    kind: str
    task_id: str | None
    call_started_at: datetime
    observed_status: str
    sync: bool
    then: Sweep | PollUpstream | Exhaust | Skip


Action = Skip | Sweep | PollUpstream | Finalize | Exhaust | Cancel | Adopt


def _known(kind: str | None) -> bool:
    return kind is not None and kind in KINDS


def _age_threshold(row: Candidate, config: ReconcileConfig) -> tuple[datetime | None, float]:
    """(when the call started, its threshold in seconds)."""
    if row.call.provider_call_started_at is None:
        return row.started_at or row.created_at, config.legacy_threshold_s
    if _known(row.call.provider_kind):
        assert row.call.provider_kind is not None
        return row.call.provider_call_started_at, config.threshold_for(row.call.provider_kind)
    return row.call.provider_call_started_at, config.legacy_threshold_s


def _heartbeat_fresh(row: Candidate, now: datetime, config: ReconcileConfig) -> bool:
    hb = row.heartbeat_at
    return hb is not None and now - hb < timedelta(seconds=config.heartbeat_timeout_s)


def is_stale(row: Candidate, now: datetime, config: ReconcileConfig) -> bool:
    """Whether the call looks abandoned: its heartbeat went silent, or (never having
    heartbeated) it is older than its threshold."""
    if row.heartbeat_at is not None:
        return not _heartbeat_fresh(row, now, config)
    started, threshold = _age_threshold(row, config)
    return started is not None and now - started >= timedelta(seconds=threshold)


def decide(row: Candidate, now: datetime, config: ReconcileConfig) -> Action:
    """The action for ``row`` at ``now`` (see the module's decision table)."""
    if row.call.state is None:
        return _decide_unadopted(row, now, config)
    if row.call.state not in NON_TERMINAL:
        return Skip(reason="terminal")
    if row.call.status == "cancelled":
        return Cancel()
    if row.call.reconcile_next_at is not None and now < row.call.reconcile_next_at:
        return Skip(reason="next attempt not due")
    if _heartbeat_fresh(row, now, config):
        return Skip(reason="heartbeat fresh")
    if row.call.state is CallState.FINALIZING and _lease_live(row, now):
        return Skip(reason="finalization lease held")
    if not is_stale(row, now, config):
        return Skip(reason="not stale yet")
    if row.call.state in (CallState.UPSTREAM_SUCCEEDED, CallState.FINALIZING):
        return Finalize()
    if row.call.reconcile_attempts >= config.attempt_cap:
        return Exhaust(attempts=row.call.reconcile_attempts,
                       last_error=row.call.reconcile_last_error)
    return _recover(row)


def _lease_live(row: Candidate, now: datetime) -> bool:
    return row.call.finalize_lease_until is not None and now < row.call.finalize_lease_until


def _recover(row: Candidate) -> Sweep | PollUpstream:
    """A created/polling call: poll it if it can be polled, else sweep it."""
    kind = row.call.provider_kind
    if kind is None or kind not in KINDS:
        return Sweep(why=f"unknown provider_kind {kind!r}")
    if row.call.call_sync or not KINDS[kind].is_async:
        return Sweep(why="sync call: nothing to poll")
    if row.call.provider_task_id is None:
        return Sweep(why="no task id past threshold")
    return PollUpstream(kind=kind, task_id=row.call.provider_task_id,
                        call_started_at=row.call.provider_call_started_at)


def _decide_unadopted(row: Candidate, now: datetime, config: ReconcileConfig) -> Action:
    if row.call.status not in ("pending", "processing"):
        return Skip(reason=f"host status {row.call.status}")
    started, _ = _age_threshold(row, config)
    if started is None or not is_stale(row, now, config):
        return Skip(reason="not stale yet")
    kind = row.call.provider_kind or LEGACY_KIND
    sync = _known(kind) and not KINDS[kind].is_async
    adopt = Adopt(kind=kind, task_id=row.call.provider_task_id, call_started_at=started,
                  observed_status=row.call.status or "pending", sync=sync, then=Skip(reason=""))
    event = Adopted(at=now, actor="reconciler", kind=kind, task_id=adopt.task_id,
                    call_started_at=started, observed_status=adopt.observed_status, sync=sync)
    # Decide on the call as it will be once Adopted is recorded: the same fold.
    adopted = msgspec.structs.replace(row, call=apply(row.call, event), heartbeat_at=None)
    then = decide(adopted, now, config)
    assert isinstance(then, Sweep | PollUpstream | Exhaust | Skip)
    return msgspec.structs.replace(adopt, then=then)


def next_scan_delay(config: ReconcileConfig, u: float) -> float:
    """The pause before the next pass: the scan interval jittered by ±``scan_jitter``
    (``u`` uniform in [0, 1)), so replicas started together drift apart."""
    return config.scan_interval_s * (1 + config.scan_jitter * (2 * u - 1))
