"""Jobs ended outside callwarden, and the reservations their host left.

A host that writes plain SQL (the original design's Phase 1 as written) ends jobs
callwarden never recorded a call on, and completes jobs with two statements (the job's
status, then the credit commit), leaving the reservation ``reserved`` forever when the
second one fails. The reconciler, every ``host_left_after_s / 5`` seconds of passes:

1. records :class:`~callwarden.events.types.HostEnded` on each job the host ended with no
   call in the log, created within ``outside_window_s``: a job it failed or cancelled has
   what it left reserved refunded; one it completed is the host's to commit (settlement
   ``host``), as for an open call the host ended. ``verify`` and ``audit`` then see every
   job callwarden shares the database with, not only the ones it ran;
2. settles, by the policy, a reservation a completed job's host still left ``reserved``
   ``host_left_after_s`` after that was recorded (callwarden's own clock: no host trigger
   moves it, and the host's commit, its next statement, had all that time):
   :class:`~callwarden.events.types.LeftoverSettled` commits it at the reservation
   (``host_completed_reserved = "commit"``), or ``"leave"`` leaves it reported
   (``stats``, ``check``, ``callwarden_reservations_host_left``).

Every write is the write path's fenced append (the version and the host's status read), so
two reconcilers record a job once and a host that reopens a job meanwhile wins. A row whose
write fails is logged and the others go on.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from callwarden.database.port import Database
from callwarden.errors import CallwardenError
from callwarden.events.states import HOST_SETTLES, CallState
from callwarden.events.types import HostEnded, LeftoverSettled
from callwarden.projections.fold import CallProjection
from callwarden.reconciler.config import ReconcileConfig

__all__ = ["Outside", "leftover_event"]

log = logging.getLogger("callwarden.reconciler")


def leftover_event(p: CallProjection, now: datetime, actor: str,
                   config: ReconcileConfig) -> LeftoverSettled | None:
    """What the policy records on a call whose reservation the host left (pure): nothing
    unless the host completed it (settlement ``host``) at least ``host_left_after_s``
    before ``now`` and the policy commits."""
    if (p.state is not CallState.COMPLETED or p.settlement != HOST_SETTLES
            or p.call_finished_at is None or p.status is None
            or config.host_completed_reserved != "commit"):
        return None
    if now - p.call_finished_at < timedelta(seconds=config.host_left_after_s):
        return None
    return LeftoverSettled(at=now, actor=actor, status=p.status, settlement="committed")


class Outside:
    """The reconciler's two passes over what hosts ended (see the module); ``due`` says
    whether a pass at ``now`` runs them (the first, then every ``host_left_after_s / 5``
    seconds; never when both are off: ``outside_window_s = 0`` and the policy ``leave``)."""

    def __init__(self, db: Database, actor: str, config: ReconcileConfig) -> None:
        self.db, self.actor, self.config = db, actor, config
        self.every = timedelta(seconds=config.host_left_after_s / 5)
        self.last: datetime | None = None

    def due(self, now: datetime) -> bool:
        if not self.config.outside_window_s and self.config.host_completed_reserved != "commit":
            return False
        return self.last is None or now - self.last >= self.every

    async def run(self, now: datetime) -> tuple[int, int]:
        """Both passes at ``now``: (jobs recorded as ended outside, leftovers settled)."""
        self.last = now
        return await self.record_ended(now), await self.settle_leftovers(now)

    async def record_ended(self, now: datetime) -> int:
        if not self.config.outside_window_s:
            return 0
        rows = await self.db.ended_outside(
            now - timedelta(seconds=self.config.outside_window_s), self.config.batch_size)
        recorded = 0
        for row in rows:
            seen = CallProjection(status=str(row["status"]),
                                  settled_reservations=int(row["settled_reservations"]))
            event = HostEnded(at=now, actor=self.actor, status=str(row["status"]))
            recorded += await self._append(row["id"], seen, event, "ended by the host")
        return recorded

    async def settle_leftovers(self, now: datetime) -> int:
        before = now - timedelta(seconds=self.config.host_left_after_s)
        settled = 0
        for job in await self.db.leftovers(before, self.config.batch_size):
            p = await self.db.load(job)
            event = leftover_event(p, now, self.actor, self.config)
            if event is not None:
                settled += await self._append(job, p, event, "left reserved by the host")
        return settled

    async def _append(self, job: uuid.UUID, seen: CallProjection,
                      event: HostEnded | LeftoverSettled, what: str) -> int:
        try:
            result = await self.db.append(job, seen, event)
        except CallwardenError as exc:  # one row's failure (a host trigger...) is its own
            log.warning("job %s: %s, not recorded (%s)", job, what, exc)
            return 0
        if result.ok:
            log.info("job %s: %s (%s); reservation %s", job, what, event.status,
                     result.settlement or "none")
        return int(result.ok)

