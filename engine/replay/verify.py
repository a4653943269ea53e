"""``verify`` over every job: do the projections and reservations tell the truth?

Batches come from :mod:`callwarden.replay.history` (one consistent, non-blocking snapshot each,
bounded memory); each job's fold is compared with its ``jobs`` columns
(:func:`callwarden.projections.verify.compare`) and its ``usage_logs`` statuses
(:func:`callwarden.projections.verify.compare_settlement`). A job whose log cannot be replayed is
reported with its job and seq, counted, and the run goes on with the others. Results
stream out per batch, so a caller can print them as they come. :func:`verify_job` checks
one job along the same path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import msgspec

from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.projections.verify import Mismatch, compare, compare_settlement
from callwarden.replay.history import (
    FIRST_ID,
    History,
    JobError,
    next_ids,
    read_histories,
    snapshot,
)

__all__ = ["BatchResult", "VerifySummary", "check", "count_jobs", "verify", "verify_batches",
           "verify_job"]


class BatchResult(msgspec.Struct, kw_only=True):
    jobs: int
    events: int
    mismatches: list[Mismatch]
    errors: list[JobError]
    mismatched_jobs: int
    seconds: float


class VerifySummary(msgspec.Struct, kw_only=True):
    jobs: int = 0
    events: int = 0
    mismatches: int = 0
    mismatched_jobs: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.errors == 0

    def add(self, b: BatchResult) -> None:
        self.jobs += b.jobs
        self.events += b.events
        self.mismatches += len(b.mismatches)
        self.mismatched_jobs += b.mismatched_jobs
        self.errors += len(b.errors)


def check(h: History) -> list[Mismatch]:
    """Where the job's stored columns and reservation differ from its fold."""
    if h.stored is None or h.folded is None:
        return []
    return (compare(h.job_id, h.stored, h.folded)
            + compare_settlement(h.job_id, h.statuses, h.folded, h.settled_by))


def _result(histories: list[History], started: float) -> BatchResult:
    mismatches: list[Mismatch] = []
    mismatched = 0
    for h in histories:
        found = check(h)
        mismatched += bool(found)
        mismatches.extend(found)
    return BatchResult(
        jobs=len(histories), events=sum(h.events for h in histories),
        mismatches=mismatches, errors=[h.error for h in histories if h.error is not None],
        mismatched_jobs=mismatched, seconds=time.perf_counter() - started)


async def _batch(conn: Conn, after: uuid.UUID, size: int,
                 since: datetime | None) -> tuple[list[uuid.UUID], BatchResult]:
    started = time.perf_counter()
    async with snapshot(conn):
        ids = await next_ids(conn, after, size, since)
        histories = await read_histories(conn, ids) if ids else []
    return ids, _result(histories, started)


async def verify_batches(conn: Conn, *, batch: int = 1000,
                         since: datetime | None = None) -> AsyncIterator[BatchResult]:
    """Each batch's result in job-id order, until every job has been checked."""
    after = FIRST_ID
    while True:
        ids, result = await _batch(conn, after, batch, since)
        if not ids:
            return
        yield result
        after = ids[-1]


async def verify(conn: Conn, *, batch: int = 1000,
                 since: datetime | None = None) -> tuple[VerifySummary, list[BatchResult]]:
    """Every batch at once (for tests and small databases); the CLI streams instead."""
    summary, results = VerifySummary(), []
    started = time.perf_counter()
    async for b in verify_batches(conn, batch=batch, since=since):
        summary.add(b)
        results.append(b)
    summary.seconds = time.perf_counter() - started
    return summary, results


async def count_jobs(conn: Conn, since: datetime | None = None) -> int:
    """About how many jobs ``verify`` will check (for a progress bar)."""
    if since is None:
        rows = await execute(conn, "audit_verify_total", {})
    else:
        rows = await execute(conn, "audit_verify_total_since", {"since": since})
    return int(rows[0]["n"]) if rows else 0


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
