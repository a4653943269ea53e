"""Reading one job's history back: the same path ``verify`` takes for every job
(:mod:`engine.verify_batch`: one snapshot, the batched read, the same comparison), for
one job id."""

from __future__ import annotations

import uuid

from engine.history import read_histories, snapshot
from engine.store import Conn
from engine.verify_batch import check
from projections.verify import Mismatch

__all__ = ["verify_job"]


async def verify_job(conn: Conn, job_id: uuid.UUID) -> list[Mismatch]:
    """Mismatches between the job's projection columns / reservation and its log (a log
    or row that cannot be replayed is one mismatch naming why); ``[]`` when they agree."""
    async with snapshot(conn):
        histories = await read_histories(conn, [job_id])
    if not histories:
        return []
    h = histories[0]
    if h.error is not None:
        return [Mismatch(job_id=str(job_id), column="log", projected=h.error.reason,
                         folded="a replayable history")]
    return check(h)
