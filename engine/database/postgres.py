"""The Postgres adapter of :mod:`callwarden.database.port`: a thin layer over the write path
(:mod:`callwarden.database.write`) and the named queries, one pooled connection per operation,
exactly as the actors used them before the port existed (the SQL stays in the ``.sql``
files).

``clock``: when given (the deterministic simulation replaying a schedule on Postgres),
the heartbeat is stamped with it instead of the database's ``now()``, so a simulated
clock's heartbeats are compared on that clock; every other statement is unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import TypeVar

from psycopg_pool import AsyncConnectionPool

from callwarden.database import write
from callwarden.database.boundary import connection
from callwarden.database.citus import on_citus
from callwarden.database.clock import Clock
from callwarden.database.clock import sync_clock as _sync_clock
from callwarden.database.db import Conn, Pool
from callwarden.database.port import Before, ClaimRequest, Row, SlowedDown, transition_via
from callwarden.database.snapshot import snapshot
from callwarden.database.write import AppendResult, Decide
from callwarden.database.write import execute as _execute
from callwarden.events.types import Event, StoredMedia
from callwarden.projections.fold import CallProjection

__all__ = ["PostgresDatabase", "as_database"]

D = TypeVar("D")


class PostgresDatabase:
    """:class:`~callwarden.database.port.Database` on ``pool``, and the host's side that
    drivers and tests write jobs with (``create_job``, ``add_reservation``)."""

    def __init__(self, pool: Pool, *, clock: Clock | None = None) -> None:
        self.pool = pool
        self.clock = clock

    # -- Database -------------------------------------------------------------------------

    async def load(self, job_id: uuid.UUID) -> CallProjection:
        async with connection(self.pool) as conn:
            return await write.load(conn, job_id)

    async def load_stored(self, job_id: uuid.UUID) -> CallProjection:
        """The projection exactly as the row stores it (``write.load_stored``)."""
        async with connection(self.pool) as conn:
            return await write.load_stored(conn, job_id)

    async def load_events(self, job_id: uuid.UUID) -> list[Event]:
        async with connection(self.pool) as conn:
            return await write.load_events(conn, job_id)

    async def append(self, job_id: uuid.UUID, current: CallProjection,
                     event: Event | Sequence[Event], *,
                     assets: Sequence[StoredMedia] | None = None,
                     before: Before | None = None) -> AppendResult:
        async with connection(self.pool) as conn:  # one statement, with assets too
            if before is not None:
                await before()
            return await write.append(conn, job_id, current, event, assets=assets)

    async def transition(self, job_id: uuid.UUID, decide: Decide, *,
                         current: CallProjection | None = None,
                         max_conflicts: int = 8) -> AppendResult:
        async with connection(self.pool) as conn:
            return await transition_via(partial(write.load, conn), partial(write.append, conn),
                                        job_id, decide, current=current,
                                        max_conflicts=max_conflicts)

    async def heartbeat(self, job_id: uuid.UUID, owner: str, progress: int | None) -> bool:
        params = {"job_id": job_id, "owner": owner, "progress": progress}
        async with connection(self.pool) as conn:
            if self.clock is None:
                return bool(await _execute(conn, "heartbeat", params))
            return bool(await _execute(conn, "heartbeat_at", {**params, "now": self.clock()}))

    async def sync_clock(self, clock: Clock) -> None:
        await _sync_clock(clock, self.pool)

    async def slow_down(self, kind: str, retry_after_s: float | None) -> SlowedDown | None:
        async with connection(self.pool) as conn:
            rows = await _execute(conn, "slow_down", {"kind": kind,
                                                      "retry_after_s": retry_after_s})
        return SlowedDown(**rows[0]) if rows else None

    # -- the reconciler ------------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> list[Row]:
        async with connection(self.pool) as conn:
            if not await on_citus(conn):
                return list(await _execute(conn, "reconcile_claim", request.sql_params()))
            return await _claim_on_citus(conn, request)

    async def candidate_read(self, job_id: uuid.UUID) -> tuple[Row | None, list[Event]]:
        async with connection(self.pool) as conn, snapshot(conn):
            rows = await _execute(conn, "load_projection", {"job_id": job_id})
            events = await write.load_events(conn, job_id)
        return (rows[0] if rows else None), events

    async def renew(self, job_id: uuid.UUID, owner: str, lease_until: datetime) -> bool:
        async with connection(self.pool) as conn:
            rows = await _execute(conn, "reconcile_renew", {
                "job_id": job_id, "owner": owner, "lease_until": lease_until})
        return bool(rows)

    async def release(self, job_id: uuid.UUID, owner: str) -> None:
        async with connection(self.pool) as conn:
            await _execute(conn, "reconcile_release", {"job_id": job_id, "owner": owner})

    async def park(self, job_id: uuid.UUID, owner: str, until: datetime) -> None:
        async with connection(self.pool) as conn:
            await _execute(conn, "reconcile_park",
                           {"job_id": job_id, "owner": owner, "until": until})

    async def ended_outside(self, since: datetime, batch_size: int) -> list[Row]:
        async with connection(self.pool) as conn:
            return list(await _execute(conn, "reconcile_outside", {
                "since": since, "batch_size": batch_size}))

    async def leftovers(self, before: datetime, batch_size: int) -> list[uuid.UUID]:
        async with connection(self.pool) as conn:
            rows = await _execute(conn, "reconcile_leftovers",
                                  {"before": before, "batch_size": batch_size})
        return [row["id"] for row in rows]

    # -- the webhook receiver ------------------------------------------------------------

    async def find_job(self, kinds: Sequence[str], task_id: str) -> Row | None:
        params = {"kinds": list(kinds), "task_id": task_id}
        async with connection(self.pool) as conn:
            if await on_citus(conn):  # the task's holder first: two single-shard reads
                held = await _execute(conn, "webhook_task_holder_citus", params)
                if held:
                    rows = await _execute(conn, "webhook_held_job_citus",
                                          {**params, "job_id": held[0]["job_id"]})
                    return rows[0] if rows else None
            rows = await _execute(conn, "webhook_find_job", params)  # (a row not adopted yet)
        return rows[0] if rows else None

    async def job_by_id(self, job_id: uuid.UUID) -> Row | None:
        async with connection(self.pool) as conn:
            rows = await _execute(conn, "webhook_job_by_id", {"job_id": job_id})
        return rows[0] if rows else None

    async def record_delivery(self, provider: str, delivery_id: str,
                              job_id: uuid.UUID) -> bool:
        async with connection(self.pool) as conn:
            rows = await _execute(conn, "webhook_record_delivery", {
                "provider": provider, "delivery_id": delivery_id, "job_id": job_id})
        return bool(rows)

    async def forget_delivery(self, provider: str, delivery_id: str) -> None:
        async with connection(self.pool) as conn:
            await _execute(conn, "webhook_forget_delivery",
                           {"provider": provider, "delivery_id": delivery_id})

    async def ping(self) -> None:
        async with connection(self.pool, wait_s=1.0) as conn:
            await _execute(conn, "service_ping", {})

    # -- the host's side (drivers and tests; not part of the port) ------------------------

    async def create_job(self, job_id: uuid.UUID, *, user_id: str = "u1",
                         credits: Decimal | None = None, status: str = "pending",
                         job_type: str = "image") -> None:
        async with connection(self.pool) as conn:
            await _execute(conn, "create_job", {
                "job_id": job_id, "user_id": user_id, "job_type": job_type,
                "status": status, "input_data": "{}", "workflow_execution_id": None,
                "node_id": None, "credits": credits})

    async def add_reservation(self, job_id: uuid.UUID, credits: Decimal) -> None:
        async with connection(self.pool) as conn:
            await _execute(conn, "host_add_reservation",
                           {"job_id": job_id, "credits": credits})


def as_database(db: Pool | D) -> PostgresDatabase | D:
    """The one handle an actor takes: a :data:`~callwarden.database.db.Pool` (wrapped in a
    :class:`PostgresDatabase`), or anything that already speaks the port (a
    :class:`PostgresDatabase`, or a test's wrapper around one)."""
    if isinstance(db, AsyncConnectionPool):
        return PostgresDatabase(db)
    return db


async def _claim_on_citus(conn: Conn, request: ClaimRequest) -> list[Row]:
    """The reconciler's claim on Citus: candidates read without a lock, then claimed one
    by one (a single-shard ``UPDATE`` each, re-checked on the locked row) until the batch
    is full (engine/database/reconcile.sql)."""
    params = request.sql_params()
    batch = int(params["batch_size"])
    found = await _execute(conn, "reconcile_candidates_citus",
                           {**params, "candidates": CANDIDATES_PER_CLAIM * batch})
    claimed: list[Row] = []
    for candidate in found:
        if len(claimed) >= batch:
            break
        claimed.extend(await _execute(conn, "reconcile_claim_one_citus",
                                      {**params, "job_id": candidate["id"]}))
    return claimed


#: Candidates read per claimed call on Citus: others' claims race for the same rows.
CANDIDATES_PER_CLAIM = 4
