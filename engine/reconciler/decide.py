"""What the reconciler does with one claimed call: a pure function of the row and ``now``.

River's ``makeRetryDecision`` in our terms. ``decide(row, now, config)`` reads no clock and
touches no I/O; the reconciler carries the action out through the engine's fenced write
path. The decision table (first match wins):

====================================================  ========================================
row                                                   action
====================================================  ========================================
no events, not stale (legacy age / kind threshold),   Skip
or call-less and created after the legacy cutoff
no events, stale                                      Adopt (record ``Adopted``), then the
                                                      decision for the adopted call
terminal                                              Skip
open, but the host ended the job (``status`` not      RecordHostEnded (the call ends as the
pending/processing)                                   host decided)
``reconcile_next_at`` in the future, heartbeat        Skip — or Exhaust once past its
fresh (within ``heartbeat_timeout_s``), or            horizon (threshold + cap x re-poll):
finalizing with a live finalization lease             nothing holds a call open past it
heartbeat absent and younger than its threshold       Skip
``reconcile_attempts >= attempt_cap``                 Exhaust
upstream_succeeded, or finalizing (lease expired)     Finalize
unknown kind, sync call, or no task id                Sweep
async kind with a task id                             PollUpstream (one poll)
====================================================  ========================================

"Stale" is measured from ``provider_call_started_at`` against the kind's threshold, or —
when the worker heartbeats — from the last heartbeat against ``heartbeat_timeout_s`` (so a
dead worker's call is acted on before its kind's threshold). A row with no
``provider_call_started_at`` is aged from ``started_at``/``created_at`` against
``legacy_threshold_s``, as is a row whose kind no handler knows — and such a call-less row
is a *legacy* row only when it was created before the legacy cutoff (by default, when the
call columns were installed): a newer one belongs to the host (a pipeline wrapper job, a
job still queued) and is never swept.

Finalization counts towards the cap: each failed attempt records ``ReconcileAttempted``, so
a result that can never be stored ends ``exhausted`` (and refunded) like any other call.
Past its horizon a call gets one last poll or finalization (``final``): anything but a
result ends it exhausted — no path keeps a call open past its horizon.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from callwarden.events.states import LEGACY_KIND, NON_TERMINAL, CallState
from callwarden.events.types import Adopted
from callwarden.projections.columns import from_row
from callwarden.projections.fold import CallProjection, apply
from callwarden.providers.kinds import KINDS
from callwarden.reconciler.config import ReconcileConfig
from callwarden.rules.host import host_status_ended

__all__ = [
    "LEGACY_KIND",
    "Action",
    "Adopt",
    "Candidate",
    "Exhaust",
    "Finalize",
    "PollUpstream",
    "RecordHostEnded",
    "Skip",
    "Sweep",
    "adopted_event",
    "decide",
    "is_legacy",
    "is_stale",
    "next_scan_delay",
    "past_horizon",
]



class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed ``jobs`` row: the call as stored (``call``, the same projection every
    writer folds onto; its ``status`` is the host's column), the heartbeat, the host's own
    timestamps (to age rows with no events) and the legacy cutoff (``None``: none is
    known, so no call-less row counts as legacy)."""

    id: uuid.UUID
    call: CallProjection
    heartbeat_at: datetime | None = None
    started_at: datetime | None = None
    created_at: datetime | None = None
    legacy_cutoff: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], call: CallProjection | None = None) -> Candidate:
        """From a row with the ``load_projection`` columns plus heartbeat and timestamps
        (``call``: the projection when the caller already has it, e.g. from the log)."""
        return cls(id=row["id"], call=call if call is not None else from_row(row),
                   heartbeat_at=row.get("heartbeat_at"), started_at=row.get("started_at"),
                   created_at=row.get("created_at"), legacy_cutoff=row.get("legacy_cutoff"))


class Skip(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str


class Sweep(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str = "reconcile_no_recovery"
    why: str = ""


class PollUpstream(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One poll of ``task_id``; ``call_started_at`` tells the client how long the task has
    existed (KIE's "recordInfo is null" grace window is counted from creation). ``final``:
    the call is past its horizon — anything but an upstream result ends it, exhausted."""

    kind: str
    task_id: str
    call_started_at: datetime | None = None
    final: bool = False


class RecordHostEnded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The host ended the job on its row: record ``HostEnded`` with the status it wrote."""

    status: str


class Finalize(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Finalize the result in hand; ``final``: past the horizon, a failure to store it
    ends the call (exhausted) instead of being retried."""

    final: bool = False


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
    attempts: int = 0
    last_error: str | None = None
    then: Sweep | PollUpstream | Exhaust | Skip


def adopted_event(action: Adopt, now: datetime, actor: str) -> Adopted:
    """The ``Adopted`` event an :class:`Adopt` records (every observed seed column)."""
    return Adopted(at=now, actor=actor, kind=action.kind, task_id=action.task_id,
                   call_started_at=action.call_started_at,
                   observed_status=action.observed_status, sync=action.sync,
                   reconcile_attempts=action.attempts, reconcile_last_error=action.last_error)


Action = Skip | Sweep | PollUpstream | Finalize | Exhaust | RecordHostEnded | Adopt


def _known(kind: str | None) -> bool:
    return kind is not None and kind in KINDS


def _age_threshold(row: Candidate, config: ReconcileConfig) -> tuple[datetime | None, float]:
    """(when the call's age is counted from, its threshold in seconds): the stale rule's."""
    rule, call = config.stale, row.call
    kind = call.provider_kind if _known(call.provider_kind) else None
    since = rule.aged_from(call.provider_call_started_at, row.started_at, row.created_at)
    return since, rule.threshold_for(kind, has_call=call.provider_call_started_at is not None)


def is_stale(row: Candidate, now: datetime, config: ReconcileConfig) -> bool:
    """Whether the call looks abandoned (:class:`~callwarden.rules.stale.StaleRule`)."""
    kind = row.call.provider_kind if _known(row.call.provider_kind) else None
    return config.stale.is_stale(now=now, kind=kind,
                                 call_started_at=row.call.provider_call_started_at,
                                 heartbeat_at=row.heartbeat_at, host_started_at=row.started_at,
                                 created_at=row.created_at)


def past_horizon(row: Candidate, now: datetime, config: ReconcileConfig) -> bool:
    """The call has been open longer than its threshold plus every attempt the cap allows:
    nothing (a heartbeat, a lease, a due time) keeps it open any more."""
    started, threshold = _age_threshold(row, config)
    horizon = threshold + config.attempt_cap * config.repoll_interval_s
    return started is not None and now - started >= timedelta(seconds=horizon)


def _exhaust(row: Candidate) -> Exhaust:
    return Exhaust(attempts=row.call.reconcile_attempts,
                   last_error=row.call.reconcile_last_error)


def decide(row: Candidate, now: datetime, config: ReconcileConfig) -> Action:
    """The action for ``row`` at ``now`` (see the module's decision table)."""
    if row.call.state is None:
        return _decide_unadopted(row, now, config)
    if row.call.state not in NON_TERMINAL:
        return Skip(reason="terminal")
    if host_status_ended(row.call):
        assert row.call.status is not None
        return RecordHostEnded(status=row.call.status)
    held = _held(row, now, config)
    if held is not None:
        return _exhaust(row) if past_horizon(row, now, config) else Skip(reason=held)
    if not is_stale(row, now, config):
        return Skip(reason="not stale yet")
    if row.call.reconcile_attempts >= config.attempt_cap:
        return _exhaust(row)
    final = past_horizon(row, now, config)
    if row.call.state in (CallState.UPSTREAM_SUCCEEDED, CallState.FINALIZING):
        return Finalize(final=final)
    return _recover(row, final)


def _held(row: Candidate, now: datetime, config: ReconcileConfig) -> str | None:
    """Why the call is left alone for now (``None``: it is not held)."""
    if row.call.reconcile_next_at is not None and now < row.call.reconcile_next_at:
        return "next attempt not due"
    if row.heartbeat_at is not None and not is_stale(row, now, config):
        return "heartbeat fresh"
    if row.call.state is CallState.FINALIZING and _lease_live(row, now):
        return "finalization lease held"
    return None


def _lease_live(row: Candidate, now: datetime) -> bool:
    return row.call.finalize_lease_until is not None and now < row.call.finalize_lease_until


def _recover(row: Candidate, final: bool = False) -> Sweep | PollUpstream:
    """A created/polling call: poll it if it can be polled, else sweep it."""
    kind = row.call.provider_kind
    if kind is None or kind not in KINDS:
        return Sweep(why=f"unknown provider_kind {kind!r}")
    if row.call.call_sync or not KINDS[kind].is_async:
        return Sweep(why="sync call: nothing to poll")
    if row.call.provider_task_id is None:
        return Sweep(why="no task id past threshold")
    return PollUpstream(kind=kind, task_id=row.call.provider_task_id,
                        call_started_at=row.call.provider_call_started_at, final=final)


def is_legacy(row: Candidate) -> bool:
    """A call-less row created before the instrumentation (the legacy cutoff). With no
    cutoff known, no row is legacy (fail closed: the host's rows are never swept)."""
    created = row.created_at or row.started_at
    cutoff = row.legacy_cutoff
    return cutoff is not None and created is not None and created < cutoff


def _decide_unadopted(row: Candidate, now: datetime, config: ReconcileConfig) -> Action:
    if row.call.status not in ("pending", "processing"):
        return Skip(reason=f"host status {row.call.status}")
    if row.call.provider_call_started_at is None and not is_legacy(row):
        return Skip(reason="no call, created after the legacy cutoff: the host's job")
    started, _ = _age_threshold(row, config)
    if started is None or not is_stale(row, now, config):
        return Skip(reason="not stale yet")
    kind = row.call.provider_kind or LEGACY_KIND
    sync = _known(kind) and not KINDS[kind].is_async
    adopt = Adopt(kind=kind, task_id=row.call.provider_task_id, call_started_at=started,
                  observed_status=row.call.status or "pending", sync=sync,
                  attempts=row.call.reconcile_attempts,
                  last_error=row.call.reconcile_last_error, then=Skip(reason=""))
    event = adopted_event(adopt, now, "reconciler")
    # Decide on the call as it will be once Adopted is recorded: the same fold.
    adopted = msgspec.structs.replace(row, call=apply(row.call, event), heartbeat_at=None)
    then = decide(adopted, now, config)
    assert isinstance(then, Sweep | PollUpstream | Exhaust | Skip)
    return msgspec.structs.replace(adopt, then=then)


def next_scan_delay(config: ReconcileConfig, u: float) -> float:
    """The pause before the next pass: the scan interval jittered by ±``scan_jitter``
    (``u`` uniform in [0, 1)), so replicas started together drift apart."""
    return config.scan_interval_s * (1 + config.scan_jitter * (2 * u - 1))
