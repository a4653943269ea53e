"""``rebuild``: rewrite projection columns from the log, safely while writers run.

Each batch is read in one snapshot (:mod:`callwarden.replay.history`); a job whose columns differ
from its fold is rewritten with ``to_columns(fold)``, fenced on the ``call_version`` read
with its events: a writer that appended in between makes the write match nothing, and
the job is re-read and retried (a bounded number of times). The rewrite never lowers
``call_version`` (a projection ahead of its log is reported, not "repaired" backwards),
never touches ``usage_logs``, and keeps a host's terminal ``status`` on a call the log
has not ended yet.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from callwarden.database.db import Conn
from callwarden.database.write import execute_batch
from callwarden.errors import JobNotFound
from callwarden.events.states import OPEN_STATUSES
from callwarden.projections.columns import to_columns
from callwarden.projections.fold import CallProjection
from callwarden.projections.verify import compare
from callwarden.replay.history import (
    FIRST_ID,
    History,
    JobError,
    next_ids,
    read_histories,
    snapshot,
)

__all__ = ["RebuildReport", "Write", "apply_writes", "plan", "rebuild", "rebuild_job"]

MAX_RETRIES = 5


class RebuildReport(msgspec.Struct, kw_only=True):
    jobs: int = 0
    rebuilt: int = 0
    unchanged: int = 0
    retried: int = 0
    failed: int = 0
    failures: list[JobError] = msgspec.field(default_factory=list)


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """One fenced rewrite: the fold, and the ``call_version`` it was folded against."""

    job_id: uuid.UUID
    expected_version: int
    folded: CallProjection


def _host_cancel_only(stored: CallProjection, folded: CallProjection, column: str) -> bool:
    # The host's decision: a host may end the job (any status but pending/processing)
    # before the log says so.
    return (column == "status" and stored.status not in (None, *OPEN_STATUSES)
            and not folded.terminal)


def needs_write(stored: CallProjection, folded: CallProjection) -> bool:
    """Whether the stored columns differ from the fold (beyond a pending host cancel)."""
    return any(not _host_cancel_only(stored, folded, m.column)
               for m in compare("", stored, folded))


def plan(h: History, force: bool = False) -> Write | JobError | None:
    """What to do with one job read in a snapshot: write, refuse, or nothing."""
    if h.error is not None or h.stored is None or h.folded is None:
        return h.error
    if h.stored.version > h.folded.version:
        return JobError(job_id=str(h.job_id), seq=h.folded.version + 1,
                        reason=f"projection at version {h.stored.version} is ahead of its "
                               f"log ({h.folded.version} events); not lowering it")
    if not force and not needs_write(h.stored, h.folded):
        return None
    return Write(job_id=h.job_id, expected_version=h.stored.version, folded=h.folded)


def _params(w: Write) -> dict[str, Any]:
    params = to_columns(w.folded)
    params.update(job_id=w.job_id, expected_version=w.expected_version,
                  terminal=w.folded.terminal, owns_seed=w.folded.provider_kind is not None,
                  # completed by callwarden's own Completed (it alone sets output media)
                  is_completion=w.folded.output_media is not None)
    return params


async def apply_writes(conn: Conn, writes: Sequence[Write]) -> set[uuid.UUID]:
    """Send the fenced rewrites (pipelined); the ids whose fence held."""
    if not writes:
        return set()
    rows = await execute_batch(conn, "audit_rebuild_projection", [_params(w) for w in writes])
    return {r["id"] for r in rows}


async def _read_one(conn: Conn, job_id: uuid.UUID) -> History:
    async with snapshot(conn):
        found = await read_histories(conn, [job_id])
    if not found:
        raise JobNotFound(job_id)
    return found[0]


async def rebuild_job(conn: Conn, job_id: uuid.UUID, report: RebuildReport,
                      *, force: bool = False, attempts: int = MAX_RETRIES) -> None:
    """Re-read, re-plan and rewrite one job until its fence holds (at most ``attempts``)."""
    for _ in range(attempts):
        decision = plan(await _read_one(conn, job_id), force)
        if not isinstance(decision, Write):
            _count(report, decision)
            return
        if await apply_writes(conn, [decision]):
            report.rebuilt += 1
            return
        report.retried += 1
    _count(report, JobError(job_id=str(job_id), seq=None,
                            reason=f"lost the race to writers {attempts} times in a row"))


def _count(report: RebuildReport, outcome: JobError | None) -> None:
    if outcome is None:
        report.unchanged += 1
    else:
        report.failed += 1
        report.failures.append(outcome)


async def _rebuild_batch(conn: Conn, histories: list[History], report: RebuildReport,
                         force: bool) -> None:
    writes: list[Write] = []
    for h in histories:
        decision = plan(h, force)
        if isinstance(decision, Write):
            writes.append(decision)
        else:
            _count(report, decision)
    done = await apply_writes(conn, writes)
    report.rebuilt += len(done)
    for w in writes:
        if w.job_id not in done:  # a writer appended since the snapshot
            report.retried += 1
            await rebuild_job(conn, w.job_id, report, force=force)


async def rebuild(conn: Conn, *, job_id: uuid.UUID | None = None, batch: int = 500,
                  force: bool = False) -> RebuildReport:
    """Rebuild one job (``job_id``) or every job with a call, batch by batch."""
    report = RebuildReport()
    if job_id is not None:
        report.jobs = 1
        await rebuild_job(conn, job_id, report, force=force)
        return report
    after = FIRST_ID
    while True:
        async with snapshot(conn):
            ids = await next_ids(conn, after, batch)
            histories = await read_histories(conn, ids) if ids else []
        if not ids:
            return report
        report.jobs += len(ids)
        await _rebuild_batch(conn, histories, report, force)
        after = ids[-1]
