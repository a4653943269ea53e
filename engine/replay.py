"""Reading a job's history back: decode its events, fold them, compare with the row.

The I/O half of replay/verify; the pure halves are :mod:`projections.fold` and
:mod:`projections.verify`.
"""

from __future__ import annotations

import uuid

from engine.store import Conn, execute, load
from events.codec import EventDecodeError, decode
from events.types import Event
from projections.fold import fold
from projections.verify import Mismatch, compare, compare_settlement

__all__ = ["load_events", "verify_job"]


async def load_events(conn: Conn, job_id: uuid.UUID) -> list[Event]:
    """The job's events in order; ``EventDecodeError`` names the first bad one, and a gap
    in ``seq`` is reported the same way."""
    rows = await execute(conn, "load_events", {"job_id": job_id})
    events = []
    for expected_seq, row in enumerate(rows, start=1):
        if row["seq"] != expected_seq:
            raise EventDecodeError(job_id, expected_seq, f"missing event (next is {row['seq']})")
        events.append(decode(row["type"], row["version"], row["payload"],
                             job_id=job_id, seq=row["seq"]))
    return events


async def verify_job(conn: Conn, job_id: uuid.UUID) -> list[Mismatch]:
    """Mismatches between the job's projection columns / reservation and its log."""
    folded = fold(await load_events(conn, job_id))
    stored = await load(conn, job_id)
    rows = await execute(conn, "reservation_for_job", {"job_id": job_id})
    return (compare(job_id, stored, folded)
            + compare_settlement(job_id, [r["status"] for r in rows], folded))
