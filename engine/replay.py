"""Reading a job's history back: decode its events, fold them, compare with the row.

The I/O half of replay/verify; the pure halves are :mod:`projections.fold` and
:mod:`projections.verify`.
"""

from __future__ import annotations

import uuid

from engine.store import Conn, execute, load_events, load_stored
from projections.columns import ProjectionUnreadable
from projections.fold import fold
from projections.verify import Mismatch, compare, compare_settlement

__all__ = ["load_events", "verify_job"]


async def verify_job(conn: Conn, job_id: uuid.UUID) -> list[Mismatch]:
    """Mismatches between the job's projection columns / reservation and its log."""
    folded = fold(await load_events(conn, job_id))
    try:
        stored = await load_stored(conn, job_id)
    except ProjectionUnreadable as exc:
        return [Mismatch(job_id=str(job_id), column=exc.column, projected="unreadable",
                         folded="readable")]
    rows = await execute(conn, "reservation_for_job", {"job_id": job_id})
    return (compare(job_id, stored, folded)
            + compare_settlement(job_id, [r["status"] for r in rows], folded,
                                 [r["settled_by_seq"] for r in rows]))
