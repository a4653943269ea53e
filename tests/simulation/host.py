"""The simulation's clock, and the host's side of the database.

:class:`SimClock` is the one simulated time of a schedule: the store's clock, every
actor's clock, and (through :meth:`SimClock.attach`) the provider simulator's, advanced
together; it never reads real time.

:class:`Host` is what host code does to the shared tables (plain SQL, as a host application
writes it), plus the reads the invariants need:
the job row, its reservations, the reservation audit (every status change of a
``usage_logs`` row: INSERT, UPDATE and DELETE; on Postgres a trigger records it).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from psycopg import sql

from callwarden.database.db import Pool
from callwarden.database.postgres import PostgresDatabase
from callwarden.providers.simulator.model import Clock as SimulatorClock

__all__ = ["EPOCH", "Host", "PostgresHost", "Reservation", "SimClock", "adapters"]

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class SimClock:
    """Simulated time: ``EPOCH`` plus the seconds advanced so far."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.t = start
        self.elapsed = 0.0
        self._sim: SimulatorClock | None = None

    def __call__(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        return self.elapsed

    def unix(self) -> float:
        return self.t.timestamp()

    def attach(self, sim: SimulatorClock) -> None:
        """Drive the provider simulator's clock too (factor 0: it moves only with us)."""
        sim.factor = 0.0
        sim._start = self.t.timestamp()  # (the simulator has no setter)
        sim._offset = 0.0
        self._sim = sim

    def advance(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)
        self.elapsed += seconds
        if self._sim is not None:
            self._sim.advance(seconds)


Reservation = tuple[int, str, Decimal, Decimal | None, int | None]
"""(id, status, credits_reserved, credits_charged, settled_by_seq)"""


class Host(Protocol):
    """Host code's writes and the invariants' reads."""

    async def set_status(self, job_id: uuid.UUID, status: str) -> None: ...

    async def settle(self, job_id: uuid.UUID, to: str) -> int: ...

    async def write(self, job_id: uuid.UUID, **columns: Any) -> None: ...

    async def row(self, job_id: uuid.UUID) -> dict[str, Any]: ...

    async def reservations(self, job_id: uuid.UUID) -> list[Reservation]: ...

    async def audit(self) -> list[tuple[int, str | None, str | None]]:
        """(row id, old status, new status) of every change, in order."""
        ...


_ROW = ("status", "call_state", "call_version", "heartbeat_at", "reconcile_owner",
        "reconcile_lease_until", "provider_task_id", "call_settlement", "provider_cost")


_AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS sim_usage_audit (
    n bigserial PRIMARY KEY, row_id bigint NOT NULL, old text, new text);
CREATE OR REPLACE FUNCTION sim_usage_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sim_usage_audit (row_id, old, new) VALUES (NEW.id, NULL, NEW.status);
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.status IS DISTINCT FROM OLD.status THEN
            INSERT INTO sim_usage_audit (row_id, old, new) VALUES (NEW.id, OLD.status, NEW.status);
        END IF;
        RETURN NEW;
    END IF;
    INSERT INTO sim_usage_audit (row_id, old, new) VALUES (OLD.id, OLD.status, NULL);
    RETURN OLD;
END $$;
DROP TRIGGER IF EXISTS sim_usage_audit_trg ON usage_logs;
CREATE TRIGGER sim_usage_audit_trg AFTER INSERT OR UPDATE OR DELETE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION sim_usage_audit_fn();
"""


class PostgresHost:
    """Host code on Postgres: plain SQL, as a host application writes it."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def install_audit(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(_AUDIT_DDL)

    async def reset(self) -> None:
        """Empty every table a schedule writes (one database serves a process's seeds)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "TRUNCATE jobs, callwarden.call_events, usage_logs, assets, workflow_executions,"
                " callwarden.webhook_deliveries, sim_usage_audit RESTART IDENTITY CASCADE")

    async def set_status(self, job_id: uuid.UUID, status: str) -> None:
        await self.write(job_id, status=status)

    async def settle(self, job_id: uuid.UUID, to: str) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE usage_logs SET status = %(to)s, settled_at = now(), credits_charged ="
                " CASE WHEN %(to)s = 'committed' THEN credits_reserved ELSE 0 END"
                " WHERE job_id = %(job)s AND status = 'reserved'", {"to": to, "job": job_id})
            return cur.rowcount

    async def write(self, job_id: uuid.UUID, **columns: Any) -> None:
        sets = sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k))
                                  for k in columns)
        async with self.pool.connection() as conn:
            await conn.execute(sql.SQL("UPDATE jobs SET {} WHERE id = {}").format(
                sets, sql.Placeholder("job_id")), {**columns, "job_id": job_id})

    async def row(self, job_id: uuid.UUID) -> dict[str, Any]:
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in _ROW)
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.SQL("SELECT {} FROM jobs WHERE id = %s").format(cols),
                                     (job_id,))
            found = await cur.fetchone()
        assert found is not None
        return dict(found)

    async def reservations(self, job_id: uuid.UUID) -> list[Reservation]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, status, credits_reserved, credits_charged, settled_by_seq"
                " FROM usage_logs WHERE job_id = %s ORDER BY id", (job_id,))
            return [(r["id"], r["status"], r["credits_reserved"], r["credits_charged"],
                     r["settled_by_seq"]) for r in await cur.fetchall()]

    async def audit(self) -> list[tuple[int, str | None, str | None]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT row_id, old, new FROM sim_usage_audit ORDER BY n")
            return [(r["row_id"], r["old"], r["new"]) for r in await cur.fetchall()]


def adapters(*, clock: SimClock, pool: Pool) -> tuple[PostgresDatabase, PostgresHost]:
    """The database (stamping heartbeats with ``clock``) and the host on ``pool``."""
    return PostgresDatabase(pool, clock=clock), PostgresHost(pool)
