"""The reference worker's queue on the ``jobs`` table: at-least-once delivery.

A claim leases a batch of unacked jobs to one owner (a process incarnation) for the
visibility timeout, with ``FOR UPDATE SKIP LOCKED`` so concurrent claimers never share a
job. A live worker extends the lease while a call runs; a dead worker's jobs become
claimable again once their lease expires (``queue_deliveries`` counts deliveries). The ack,
fenced on the owner, ends the job's life in the queue: whatever is left of its call (a
``created`` call after an ambiguous create, a still-running task) belongs to the reconciler.

A job's request is ``jobs.input_data``::

    {"provider_kind": "kie-standard", "request": {...}, "operation": null}

:func:`parse_job` (pure) reads it; a job it refuses is cancelled (refunded) and acked in
one transaction by :func:`reject` — never lost, never redelivered forever. The same
:func:`reject` gives up a job delivered too often; either way it cancels only a job on
which no call ever started (a started call is the reconciler's).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from callwarden.database.boundary import transaction
from callwarden.database.citus import statement_for
from callwarden.database.db import Conn
from callwarden.database.write import AppendResult, cancel_unstarted, execute
from callwarden.providers.kinds import KINDS

__all__ = ["Claimed", "JobSpec", "ack", "claim", "defer", "extend", "input_data", "parse_job",
           "reject"]

_dec = msgspec.json.Decoder()


class Claimed(msgspec.Struct, frozen=True, kw_only=True):
    """One delivery of a job: its id, raw ``input_data`` and delivery count (1 = first)."""

    job_id: uuid.UUID
    input_data: str
    deliveries: int


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker runs for a job: ``CallRunner.run(job_id, kind, request, operation=)``."""

    kind: str
    request: dict[str, Any]
    operation: str | None = None


def input_data(kind: str, request: Mapping[str, Any],
               operation: str | None = None) -> dict[str, Any]:
    """The ``jobs.input_data`` the worker understands (what ``enqueue`` writes)."""
    out: dict[str, Any] = {"provider_kind": kind, "request": dict(request)}
    if operation is not None:
        out["operation"] = operation
    return out


def parse_job(raw: str) -> JobSpec | str:
    """The job's spec, or the reason it cannot be run (a string)."""
    try:
        data = _dec.decode(raw)
    except msgspec.DecodeError as exc:
        return f"input_data is not JSON: {exc}"
    if not isinstance(data, dict):
        return "input_data is not an object"
    kind = data.get("provider_kind")
    if not isinstance(kind, str) or not kind:
        return "input_data has no provider_kind"
    if kind not in KINDS:
        return f"unknown provider_kind {kind!r}"
    request, operation = data.get("request"), data.get("operation")
    if not isinstance(request, dict):
        return "input_data.request is not an object"
    if operation is not None and not isinstance(operation, str):
        return "input_data.operation is not a string"
    return JobSpec(kind=kind, request=request, operation=operation)


async def claim(conn: Conn, *, owner: str, batch: int, visibility_s: float) -> list[Claimed]:
    """Lease up to ``batch`` claimable jobs to ``owner`` (one statement)."""
    if batch <= 0:
        return []
    rows = await execute(conn, await statement_for(conn, "queue_claim"), {
        "owner": owner, "batch": batch, "visibility_s": visibility_s})
    return [Claimed(job_id=r["id"], input_data=r["input_data"], deliveries=r["deliveries"])
            for r in rows]


async def extend(conn: Conn, job_id: uuid.UUID, *, owner: str, visibility_s: float) -> bool:
    """Push the lease ``visibility_s`` from now; false if ``owner`` no longer holds it."""
    rows = await execute(conn, "queue_extend", {
        "job_id": job_id, "owner": owner, "visibility_s": visibility_s})
    return bool(rows)


async def ack(conn: Conn, job_id: uuid.UUID, *, owner: str) -> bool:
    """Take the job out of the queue; false if ``owner`` no longer holds it."""
    return bool(await execute(conn, "queue_ack", {"job_id": job_id, "owner": owner}))


async def defer(conn: Conn, job_id: uuid.UUID, *, owner: str, retry_after_s: float) -> bool:
    """Put a waiting job back, claimable after ``retry_after_s``, this delivery uncounted;
    false if ``owner`` no longer holds it."""
    return bool(await execute(conn, "queue_defer", {
        "job_id": job_id, "owner": owner, "retry_after_s": retry_after_s}))


async def reject(conn: Conn, job_id: uuid.UUID, *, owner: str,
                 now: datetime) -> tuple[AppendResult, bool]:
    """Ack the job, and cancel it (refunding its reservation) if no call ever started on
    it, in one transaction. A call that started, also one whose ``CallStarted`` another
    delivery records while this runs, is not cancelled (``ok=False`` with the call as it
    is): the reconciler finishes it (:func:`~callwarden.database.write.cancel_unstarted`)."""
    async with transaction(conn):
        result = await cancel_unstarted(conn, job_id, by=owner, now=now)
        acked = await ack(conn, job_id, owner=owner)
    return result, acked
