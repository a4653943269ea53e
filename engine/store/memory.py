"""The in-memory adapter of :mod:`callwarden.store.port`: pure Python, the same fences as the
SQL (``queries.sql``, ``reconcile.sql``, ``service.sql``, migrations 0007/0008), on a
clock the caller passes in (the deterministic simulation's). Its methods are ``async``
(the actors await them) but never do I/O, so a run is a pure function of its inputs.

What each statement's fences become here (``append_event``):

* ``call_version`` equals the version read (optimistic concurrency), and the event's
  ``seq`` = new version is not taken (a lost race writes nothing);
* the host's ``status`` is still pending/processing (``NULL`` counts as pending), or, for
  ``HostEnded``, exactly the status it observed;
* the count of the job's reservations no longer ``reserved`` is the one read (not for
  ``CallStarted``); a call is started only on a row with no task id;
* no two jobs hold one ``(provider_kind, provider_task_id)`` (``TaskAlreadyClaimed``);
* a settling event moves every ``reserved`` row of the job once (compare-and-set on
  ``reserved``), a commit charging ``min(cost, reserved)`` in total, split over the rows
  still reserved in id order (``LEAST(reserved_i, GREATEST(0, cost - before_i))``, where
  ``before_i`` starts at what rows the host committed itself charged), a refund 0.

Every change of a reservation's status is kept in :attr:`MemoryStore.audit` (the
simulation's "moved twice / from a non-reserved status" invariant reads it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec

from callwarden.errors import JobNotFound, TaskAlreadyClaimed
from callwarden.events.codec import EventDecodeError, decode
from callwarden.events.states import OPEN_STATUSES
from callwarden.events.types import Event, StoredMedia
from callwarden.projections.columns import ProjectionUnreadable, from_row
from callwarden.projections.fold import CallProjection, apply, fold
from callwarden.rules.stale import StaleRule
from callwarden.store.appending import (
    _SETTLES,
    AppendResult,
    Decide,
    Settled,
    _observers,
    append_params,
    without_nul,
)
from callwarden.store.port import Before, ClaimRequest, Clock, Row, transition_via

__all__ = ["Audit", "MemoryStore"]

_OPEN_CALLS = ("created", "polling", "upstream_succeeded", "finalizing")
_CLAIM_COLUMNS = (
    "id", "status", "call_state", "call_version", "provider_kind", "provider_task_id",
    "provider_call_started_at", "call_sync", "reconcile_attempts", "reconcile_last_error",
    "reconcile_next_at", "error_message", "finalize_owner", "finalize_lease_until",
    "upstream_result", "call_output", "provider_cost", "call_finished_at", "call_settlement",
    "heartbeat_at", "started_at", "created_at")
_PROJECTION_COLUMNS = _CLAIM_COLUMNS[:19]


class Audit(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a reservation row (``old``/``new`` status; ``None``: inserted or
    deleted); ``by``: ``"call"`` (the write path, with its ``seq``) or ``"host"``."""

    row_id: int
    job_id: uuid.UUID
    old: str | None
    new: str | None
    by: str
    seq: int | None = None


def _numeric(value: float | None) -> Decimal | None:
    """A float parameter as Postgres casts it to ``numeric`` (15 significant digits)."""
    return None if value is None else Decimal(f"{value:.15g}")


def _is_stale(rule: StaleRule, now: datetime, row: dict[str, Any]) -> bool:
    """``callwarden_is_stale`` (migration 0007), on the row's columns."""
    heartbeat: datetime | None = row["heartbeat_at"]
    started: datetime | None = row["provider_call_started_at"]
    if heartbeat is not None:
        return now - heartbeat >= timedelta(seconds=rule.heartbeat_timeout_s)
    if started is not None:
        kind = row["provider_kind"]
        threshold = (rule.thresholds.get(kind, rule.legacy_threshold_s) if kind is not None
                     else rule.legacy_threshold_s)
        return now - started >= timedelta(seconds=threshold)
    since: datetime | None = row["started_at"] if row["started_at"] is not None \
        else row["created_at"]
    return since is not None and now - since >= timedelta(seconds=rule.legacy_threshold_s)


class MemoryStore:
    """Every protocol of :mod:`callwarden.store.port`, in memory. ``clock``: the time every
    ``now()`` of the SQL would read (heartbeats, settlement stamps, ``created_at``);
    ``migrated_at``: when "migration 0002" ran (the default legacy cutoff; default: the
    clock's time at construction)."""

    def __init__(self, clock: Clock, *, migrated_at: datetime | None = None) -> None:
        self.clock = clock
        self.migrated_at = migrated_at if migrated_at is not None else clock()
        self.jobs: dict[uuid.UUID, dict[str, Any]] = {}
        self.events: dict[uuid.UUID, list[tuple[str, int, bytes, str]]] = {}
        self.usage: dict[int, dict[str, Any]] = {}
        self.assets: dict[tuple[uuid.UUID, str], StoredMedia] = {}
        self.deliveries: dict[tuple[str, str], tuple[uuid.UUID, datetime]] = {}
        self.audit: list[Audit] = []
        self._next_usage = 1

    # -- rows ----------------------------------------------------------------------------

    def _job(self, job_id: uuid.UUID) -> dict[str, Any]:
        row = self.jobs.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return row

    def _settled_count(self, job_id: uuid.UUID) -> int:
        return sum(1 for u in self.usage.values()
                   if u["job_id"] == job_id and u["status"] != "reserved")

    def _projection_row(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        row = self.jobs.get(job_id)
        if row is None:
            return None
        out = {c: row[c] for c in _PROJECTION_COLUMNS}
        out["settled_reservations"] = self._settled_count(job_id)
        return out

    def reservations(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        """The job's ``usage_logs`` rows in id order (copies)."""
        return [dict(u) for _, u in sorted(self.usage.items()) if u["job_id"] == job_id]

    def row(self, job_id: uuid.UUID) -> dict[str, Any]:
        """The job's whole ``jobs`` row (a copy)."""
        return dict(self._job(job_id))

    # -- HostStore -----------------------------------------------------------------------

    async def create_job(self, job_id: uuid.UUID, *, user_id: str = "u1",
                         credits: Decimal | None = None, status: str = "pending",
                         job_type: str = "image") -> None:
        if job_id in self.jobs:
            raise ValueError(f"job {job_id} exists")  # the primary key
        self.jobs[job_id] = {
            "id": job_id, "user_id": user_id, "job_type": job_type, "status": status,
            "call_state": None, "call_version": 0, "provider_kind": None,
            "provider_task_id": None, "provider_call_started_at": None, "call_sync": False,
            "reconcile_attempts": 0, "reconcile_last_error": None, "reconcile_next_at": None,
            "error_message": None, "finalize_owner": None, "finalize_lease_until": None,
            "upstream_result": None, "call_output": None, "output_data": None,
            "provider_cost": None, "call_finished_at": None, "call_settlement": None,
            "heartbeat_at": None, "heartbeat_owner": None, "reconcile_owner": None,
            "reconcile_lease_until": None, "started_at": None, "created_at": self.clock(),
            "completed_at": None, "progress": 0, "callback_token": None,
        }
        self.events[job_id] = []
        if credits is not None:
            await self.add_reservation(job_id, credits)

    async def add_reservation(self, job_id: uuid.UUID, credits: Decimal) -> None:
        row = self._job(job_id)
        rid = self._next_usage
        self._next_usage += 1
        self.usage[rid] = {"id": rid, "job_id": job_id, "user_id": row["user_id"],
                           "status": "reserved", "credits_reserved": Decimal(credits),
                           "credits_charged": None, "settled_at": None,
                           "settled_by_seq": None}
        self.audit.append(Audit(row_id=rid, job_id=job_id, old=None, new="reserved",
                                by="host"))

    def host_write(self, job_id: uuid.UUID, **columns: Any) -> None:
        """Host code's plain ``UPDATE jobs SET ...`` (any columns)."""
        self._job(job_id).update(columns)

    def host_settle(self, job_id: uuid.UUID, to: str) -> int:
        """Host code's ``UPDATE usage_logs SET status = to, credits_charged = (reserved on a
        commit, else 0) WHERE job_id = ... AND status = 'reserved'``: rows moved."""
        moved = 0
        for u in sorted(self.usage.values(), key=lambda u: u["id"]):
            if u["job_id"] == job_id and u["status"] == "reserved":
                u.update(status=to, settled_at=self.clock(), credits_charged=(
                    u["credits_reserved"] if to == "committed" else Decimal(0)))
                self.audit.append(Audit(row_id=u["id"], job_id=job_id, old="reserved",
                                        new=to, by="host"))
                moved += 1
        return moved

    # -- Store ---------------------------------------------------------------------------

    async def load_events(self, job_id: uuid.UUID) -> list[Event]:
        out = []
        for seq, (type_name, version, payload, _) in enumerate(
                self.events.get(job_id, []), start=1):
            out.append(decode(type_name, version, payload, job_id=job_id, seq=seq))
        return out

    def load_stored(self, job_id: uuid.UUID) -> CallProjection:
        """The projection exactly as the row stores it (``write.load_stored``)."""
        row = self._projection_row(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return from_row(row)

    async def load(self, job_id: uuid.UUID) -> CallProjection:
        row = self._projection_row(job_id)
        if row is None:
            raise JobNotFound(job_id)
        try:
            return from_row(row)
        except ProjectionUnreadable:
            folded = fold(await self.load_events(job_id))
            if folded.version != row["call_version"]:
                raise EventDecodeError(job_id, folded.version + 1,
                                       f"row at version {row['call_version']} but the log "
                                       f"has {folded.version} events") from None
            return msgspec.structs.replace(
                folded, status=row["status"] if not folded.terminal else folded.status,
                settled_reservations=int(row["settled_reservations"]))

    async def append(self, job_id: uuid.UUID, current: CallProjection, event: Event, *,
                     assets: Sequence[StoredMedia] | None = None,
                     before: Before | None = None) -> AppendResult:
        if before is not None:
            await before()
        event = without_nul(event)
        new = apply(current, event)
        params = append_params(job_id, current, new, event)
        appended, settled, reservations = self._append_event(params, event)
        if not appended:
            return AppendResult(ok=False, projection=await self.load(job_id))
        if assets is not None:
            for m in assets:
                self.assets.setdefault((job_id, m.key), m)  # ON CONFLICT DO NOTHING
        if settled:
            new = msgspec.structs.replace(
                new, settled_reservations=new.settled_reservations + settled)
        outcome: Settled | None = None
        if params["settle_to"] is not None:
            outcome = "settled" if settled else (
                "already_settled" if reservations else "no_reservation")
        result = AppendResult(ok=True, projection=new, event=event, settlement=outcome)
        for fn in _observers:
            fn(result)
        return result

    def _append_event(self, p: dict[str, Any], event: Event) -> tuple[bool, int, int]:
        """The ``append_event`` statement: (appended, settled rows, the job's rows)."""
        job_id: uuid.UUID = p["job_id"]
        row = self.jobs.get(job_id)
        reservations = sum(1 for u in self.usage.values() if u["job_id"] == job_id)
        if row is None:
            return False, 0, reservations
        status = row["status"]
        fenced = (
            row["call_version"] == p["expected_version"]
            and ((status if status is not None else "pending") in OPEN_STATUSES
                 if p["host_status"] is None else status == p["host_status"])
            and (p["expected_settled"] is None
                 or self._settled_count(job_id) == p["expected_settled"])
            and (not p["is_start"] or row["provider_task_id"] is None))
        if not fenced:
            return False, 0, reservations
        if len(self.events[job_id]) >= p["new_version"]:
            return False, 0, reservations  # the seq is taken: a lost race
        owns = p["owns_seed"]
        task = p["provider_task_id"] if owns else row["provider_task_id"]
        kind = p["provider_kind"] if owns else row["provider_kind"]
        if task is not None and any(
                j["provider_task_id"] == task and j["provider_kind"] == kind
                for jid, j in self.jobs.items() if jid != job_id):
            raise TaskAlreadyClaimed(f"upstream task already claimed by another job: "
                                     f"({kind}, {task})")
        now = self.clock()
        row.update(
            call_state=p["call_state"], call_version=p["new_version"],
            status=p["status"] if p["status"] is not None else row["status"],
            call_sync=p["call_sync"], reconcile_next_at=p["reconcile_next_at"],
            error_message=(p["error_message"] if p["error_message"] is not None
                           else row["error_message"]),
            finalize_owner=p["finalize_owner"],
            finalize_lease_until=p["finalize_lease_until"],
            upstream_result=p["upstream_result"], call_output=p["call_output"],
            provider_cost=_numeric(p["provider_cost"]),
            call_finished_at=p["call_finished_at"], call_settlement=p["call_settlement"])
        if owns:
            row.update(provider_kind=p["provider_kind"], provider_task_id=p["provider_task_id"],
                       provider_call_started_at=p["provider_call_started_at"],
                       reconcile_attempts=p["reconcile_attempts"],
                       reconcile_last_error=p["reconcile_last_error"])
        if p["call_output"] is not None:  # as the SQL: merged into a JSON object
            out = json.loads(p["call_output"])
            prior = row["output_data"]
            row["output_data"] = {**prior, **out} if isinstance(prior, dict) and isinstance(
                out, dict) else out
        if p["is_completion"]:
            row.update(completed_at=p["call_finished_at"], progress=100)
        self.events[job_id].append((p["type"], p["event_version"], p["payload"].encode(),
                                    p["actor"]))
        return True, self._settle(job_id, p, now), reservations

    def _settle(self, job_id: uuid.UUID, p: dict[str, Any], now: datetime) -> int:
        to: str | None = p["settle_to"]
        if to is None or to not in _SETTLES:
            return 0
        cost = _numeric(p["cost"])
        # What rows the host committed itself already charged counts towards the total.
        before = sum((u["credits_charged"] if u["credits_charged"] is not None
                      else u["credits_reserved"] for u in self.usage.values()
                      if u["job_id"] == job_id and u["status"] == "committed"), Decimal(0))
        moved = 0
        for u in sorted(self.usage.values(), key=lambda u: u["id"]):
            if u["job_id"] != job_id or u["status"] != "reserved":
                continue
            reserved: Decimal = u["credits_reserved"]
            charged = Decimal(0)
            if to == "committed":
                total = cost if cost is not None else reserved + before
                charged = min(reserved, max(Decimal(0), total - before))
            u.update(status=to, settled_at=now, settled_by_seq=p["new_version"],
                     credits_charged=charged)
            self.audit.append(Audit(row_id=u["id"], job_id=job_id, old="reserved", new=to,
                                    by="call", seq=p["new_version"]))
            before += reserved
            moved += 1
        return moved

    async def transition(self, job_id: uuid.UUID, decide: Decide, *,
                         current: CallProjection | None = None,
                         max_conflicts: int = 8) -> AppendResult:
        return await transition_via(self, job_id, decide, current=current,
                                    max_conflicts=max_conflicts)

    async def heartbeat(self, job_id: uuid.UUID, owner: str, progress: int | None) -> None:
        row = self.jobs.get(job_id)
        if row is None or row["call_state"] not in ("created", "polling"):
            return
        row.update(heartbeat_at=self.clock(), heartbeat_owner=owner,
                   progress=max(row["progress"], progress if progress is not None
                                else row["progress"]))

    async def sync_clock(self, clock: Clock) -> None:
        return None  # one clock: the caller's

    # -- ReconcilerStore -----------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> list[Row]:
        now, rule = request.now, request.stale
        legacy_cutoff = (request.legacy_cutoff if request.legacy_cutoff is not None
                         else self.migrated_at)

        def free(j: dict[str, Any]) -> bool:
            return j["reconcile_lease_until"] is None or j["reconcile_lease_until"] <= now

        def threshold(kind: str | None) -> float:
            if kind is None:
                return rule.legacy_threshold_s
            return rule.thresholds.get(kind, rule.legacy_threshold_s)

        def open_call(j: dict[str, Any]) -> bool:
            if j["call_state"] not in _OPEN_CALLS or not free(j):
                return False
            status = j["status"] if j["status"] is not None else "pending"
            if status not in OPEN_STATUSES:
                return True
            started = j["provider_call_started_at"]
            if started is None:
                return False
            if started <= now - timedelta(seconds=threshold(j["provider_kind"])
                                          + request.horizon_extra_s):
                return True
            if j["call_state"] == "finalizing":  # NOT (finalizing AND lease > now), 3-valued
                lease = j["finalize_lease_until"]
                if lease is None or lease > now:
                    return False
            return (started < request.cutoff
                    and (j["reconcile_next_at"] is None or j["reconcile_next_at"] <= now)
                    and _is_stale(rule, now, j))

        def seed_row(j: dict[str, Any]) -> bool:
            started = j["provider_call_started_at"]
            return (j["status"] in OPEN_STATUSES and j["call_state"] is None
                    and ((started is not None and started < request.cutoff)
                         or (started is None and j["created_at"] < legacy_cutoff))
                    and free(j) and _is_stale(rule, now, j))

        ordered = [self.jobs[k] for k in sorted(self.jobs)]
        calls = [j for j in ordered if open_call(j)][:request.batch_size]
        seeds = [j for j in ordered if seed_row(j)][:max(request.batch_size - len(calls), 0)]
        out: list[Row] = []
        for j in calls + seeds:
            j.update(reconcile_owner=request.owner,
                     reconcile_lease_until=request.lease_until)
            got = {c: j[c] for c in _CLAIM_COLUMNS}
            got.update(legacy_cutoff=legacy_cutoff,
                       settled_reservations=self._settled_count(j["id"]))
            out.append(got)
        return out

    async def candidate_read(self, job_id: uuid.UUID) -> tuple[Row | None, list[Event]]:
        return self._projection_row(job_id), await self.load_events(job_id)

    async def renew(self, job_id: uuid.UUID, owner: str, lease_until: datetime) -> bool:
        row = self.jobs.get(job_id)
        if row is None or row["reconcile_owner"] != owner:
            return False
        row["reconcile_lease_until"] = lease_until
        return True

    async def release(self, job_id: uuid.UUID, owner: str) -> None:
        row = self.jobs.get(job_id)
        if row is not None and row["reconcile_owner"] == owner:
            row.update(reconcile_owner=None, reconcile_lease_until=None)

    async def park(self, job_id: uuid.UUID, owner: str, until: datetime) -> None:
        row = self.jobs.get(job_id)
        if row is not None and row["reconcile_owner"] == owner:
            row.update(reconcile_owner=None, reconcile_lease_until=until)

    # -- WebhookStore --------------------------------------------------------------------

    async def find_job(self, kinds: Sequence[str], task_id: str) -> Row | None:
        for j in self.jobs.values():
            if j["provider_kind"] in kinds and j["provider_task_id"] == task_id:
                return {c: j[c] for c in ("id", "provider_kind", "provider_task_id",
                                          "call_state")}
        return None

    async def job_by_id(self, job_id: uuid.UUID) -> Row | None:
        j = self.jobs.get(job_id)
        if j is None:
            return None
        return {c: j[c] for c in ("id", "provider_kind", "provider_task_id",
                                  "provider_call_started_at", "call_state", "callback_token")}

    async def record_delivery(self, provider: str, delivery_id: str,
                              job_id: uuid.UUID) -> bool:
        key = (provider, delivery_id)
        if key in self.deliveries:
            return False
        self.deliveries[key] = (job_id, self.clock())
        return True

    async def forget_delivery(self, provider: str, delivery_id: str) -> None:
        self.deliveries.pop((provider, delivery_id), None)

    async def ping(self) -> None:
        return None
