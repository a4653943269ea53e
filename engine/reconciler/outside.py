"""Jobs ended outside callwarden: a host that writes plain SQL (the original design's
Phase 1 as written) ends jobs callwarden never recorded a call on, and may leave their
reservation ``reserved`` when its commit, a second statement, fails. Each pass the
reconciler records :class:`~callwarden.events.types.HostEnded` on such jobs once
``host_left_after_s`` has passed since the host last wrote the row, settling what is still
reserved by the policy (:func:`callwarden.reconciler.decide.host_left`: refunded for a job
it failed or cancelled; for one it completed, committed at the reservation or, with
``host_completed_reserved = "leave"``, left and reported). ``verify`` and ``audit`` then
see every job callwarden shares the database with, not only the ones it ran.

Only jobs created within ``outside_window_s``: older ones stay as the host left them
(docs/reconciler.md, "Jobs ended outside callwarden"). The append is fenced on the version
(0) and the status read, so two reconcilers record a job once, and a host that reopens the
job meanwhile wins.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from callwarden.database.port import ReconcilerDatabase, Row
from callwarden.events.types import HostEnded
from callwarden.projections.fold import CallProjection
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.decide import RecordHostEnded, host_left

__all__ = ["ended_outside", "outside_event"]

log = logging.getLogger("callwarden.reconciler")


def outside_event(row: Row, now: datetime, actor: str,
                  config: ReconcileConfig) -> HostEnded | None:
    """The ``HostEnded`` a job the host ended with no call gets at ``now`` (pure)."""
    touched = [t for t in (row.get("updated_at"), row.get("completed_at")) if t is not None]
    action = host_left(str(row["status"]), max(touched) if touched else None, now, config)
    if not isinstance(action, RecordHostEnded):
        return None
    return HostEnded(at=now, actor=actor, status=action.status,
                     commit_left=action.commit_left and bool(row.get("reserved")))


async def ended_outside(db: ReconcilerDatabase, now: datetime, actor: str,
                        config: ReconcileConfig) -> int:
    """Record one batch of jobs ended outside callwarden; how many were recorded."""
    if not config.outside_window_s:
        return 0
    rows = await db.ended_outside(now - timedelta(seconds=config.outside_window_s),
                                  now - timedelta(seconds=config.host_left_after_s),
                                  config.batch_size)
    recorded = 0
    for row in rows:
        event = outside_event(row, now, actor, config)
        if event is None:
            continue
        seen = CallProjection(status=str(row["status"]),
                              settled_reservations=int(row["settled_reservations"]))
        result = await db.append(row["id"], seen, event)
        if result.ok:
            recorded += 1
            log.info("job %s: ended by the host outside callwarden (%s); reservation %s",
                     row["id"], row["status"], result.settlement or "none")
    return recorded
