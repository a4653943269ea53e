"""What happened to one job, and how the fleet is doing: the I/O half of ``audit`` and
``stats``. The pure halves are :mod:`callwarden.projections.timeline` and
:mod:`callwarden.projections.stats`.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import msgspec
from psycopg.rows import DictRow

from callwarden.database.db import Conn
from callwarden.database.write import execute, load_events
from callwarden.errors import JobNotFound
from callwarden.events.codec import EventDecodeError
from callwarden.projections.columns import as_float
from callwarden.projections.stats import (
    HostLeft,
    KindStale,
    KindState,
    Latency,
    StatsReport,
    TerminalCount,
    recoveries,
    sweeps,
)
from callwarden.projections.timeline import IllegalHistory, TimelineRow, timeline
from callwarden.rules.stale import StaleRule

__all__ = ["AuditReport", "Reservation", "audit_job", "host_left", "jobs_without_call",
           "stats"]


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    credits_reserved: float
    credits_charged: float | None
    settled_at: datetime | None


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    status: str
    call_state: str | None
    call_version: int
    provider_kind: str | None
    timeline: list[TimelineRow]
    reservations: list[Reservation]


async def _reservations(conn: Conn, job_id: uuid.UUID) -> list[Reservation]:
    rows = await execute(conn, "audit_reservations", {"job_id": job_id})
    return [Reservation(status=r["status"], credits_reserved=float(r["credits_reserved"]),
                        credits_charged=as_float(r["credits_charged"]), settled_at=r["settled_at"])
            for r in rows]


async def audit_job(conn: Conn, job_id: uuid.UUID) -> AuditReport:
    """The job's timeline and reservation. :class:`JobNotFound` for an unknown id;
    ``EventDecodeError`` (naming job and seq) for a log that cannot be replayed."""
    rows = await execute(conn, "audit_job", {"job_id": job_id})
    if not rows:
        raise JobNotFound(job_id)
    events = await load_events(conn, job_id)
    try:
        lines = timeline(events)
    except IllegalHistory as exc:
        raise EventDecodeError(job_id, exc.seq, f"cannot replay: {exc.cause}") from exc
    row = rows[0]
    return AuditReport(
        job_id=str(job_id), status=row["status"], call_state=row["call_state"],
        call_version=row["call_version"], provider_kind=row["provider_kind"],
        timeline=lines, reservations=await _reservations(conn, job_id))


async def _kind_state(conn: Conn) -> list[KindState]:
    rows = await execute(conn, "audit_stats_kind_state", {})
    return [KindState(kind=r["kind"], state=r["state"], calls=r["calls"]) for r in rows]


async def _stale(conn: Conn, rule: StaleRule, now: datetime) -> list[KindStale]:
    rows = await execute(conn, "audit_stats_stale", rule.sql_params(now))
    return [KindStale(kind=r["kind"], threshold_s=rule.thresholds.get(r["kind"]),
                      stale=r["stale"]) for r in rows]


async def _terminal(conn: Conn, since: datetime) -> list[TerminalCount]:
    rows = await execute(conn, "audit_stats_terminal_events", {"since": since})
    return [TerminalCount(kind=r["kind"], type=r["type"], by_reconciler=r["by_reconciler"],
                          events=r["events"]) for r in rows]


def _latency(row: DictRow) -> Latency:
    p50, p95, p99 = row["pcts"] or (None, None, None)  # NULL: no call finished
    return Latency(kind=row["kind"] or "all", calls=row["calls"],
                   p50_s=p50, p95_s=p95, p99_s=p99)


async def stats(conn: Conn, *, now: datetime, window: timedelta,
                stale: StaleRule, legacy_cutoff: datetime | None = None,
                host_left_after_s: float = 300.0) -> StatsReport:
    """Calls by kind and state, stale counts per kind (by the reconciler's ``stale`` rule),
    and, over ``window`` before ``now``: recoveries, sweeps, time-to-terminal; and the
    host's jobs waiting without a call with credits reserved."""
    since = now - window
    terminal = await _terminal(conn, since)
    latency = await execute(conn, "audit_stats_time_to_terminal", {"since": since})
    return StatsReport(
        now=now, window_s=window.total_seconds(), by_kind_state=await _kind_state(conn),
        stale=await _stale(conn, stale, now), recoveries=recoveries(terminal),
        sweeps=sweeps(terminal), terminal_events=terminal,
        time_to_terminal=[_latency(r) for r in latency],
        jobs_without_call=await jobs_without_call(
            conn, now=now, legacy_threshold_s=stale.legacy_threshold_s,
            legacy_cutoff=legacy_cutoff),
        host_left=await host_left(conn, now=now, after_s=host_left_after_s))


async def host_left(conn: Conn, *, now: datetime, after_s: float) -> HostLeft:
    """Reservations still held on jobs the host ended more than ``after_s`` ago."""
    rows = await execute(conn, "audit_host_left",
                         {"before": now - timedelta(seconds=after_s)})
    return HostLeft(reservations=int(rows[0]["reservations"]),
                    credits=float(rows[0]["credits"]), after_s=after_s)


async def jobs_without_call(conn: Conn, *, now: datetime, legacy_threshold_s: float,
                            legacy_cutoff: datetime | None) -> int:
    """In-flight jobs with reserved credits and no call, older than the legacy threshold
    but created after the legacy cutoff (the host's: never swept, reported)."""
    rows = await execute(conn, "audit_stats_jobs_without_call", {
        "older_than": now - timedelta(seconds=legacy_threshold_s),
        "legacy_cutoff": legacy_cutoff})
    return int(rows[0]["n"])
