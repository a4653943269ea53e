"""The write path: one transition = one statement = one transaction (DESIGN §5).

``append`` folds the event onto the projection the caller read (pure), then sends one
statement that updates the ``jobs`` projection fenced on the version read, appends the
event at ``seq = version + 1`` and, for a settling transition, moves the job's reservation
from ``reserved`` with a compare-and-set. A lost race writes nothing and returns
``ok=False`` with the projection that won; ``transition`` re-decides on it, never
re-sending the same event blindly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow

from engine.errors import (
    ConflictExhausted,
    DatabaseError,
    DatabaseUnavailable,
    JobNotFound,
    TaskAlreadyClaimed,
)
from engine.queries import QUERIES
from events.codec import encode
from events.types import CallStarted, Cancelled, Event
from projections.columns import from_row, to_columns
from projections.fold import CallProjection, apply

__all__ = [
    "AppendResult", "Conn", "Decide", "append", "cancel", "execute", "load", "observe",
    "transition",
]

Conn = AsyncConnection[DictRow]
Decide = Callable[[CallProjection], Event | None]
Settled = Literal["settled", "no_reservation", "already_settled"]


class AppendResult(msgspec.Struct, frozen=True, kw_only=True):
    """``ok``: the event was appended. ``projection``: the call after the attempt (the
    winner's state when ``ok`` is false). ``settlement``: for a settling transition,
    whether this write moved the reservation, found none, or found it already settled."""

    ok: bool
    projection: CallProjection
    event: Event | None = None
    settlement: Settled | None = None


_observers: list[Callable[[AppendResult], None]] = []


def observe(fn: Callable[[AppendResult], None]) -> None:
    """Call ``fn`` with every successful append of this process (metrics hook it here)."""
    if fn not in _observers:
        _observers.append(fn)


def _translate(exc: psycopg.Error) -> Exception:
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"database unavailable: {exc}")
    if isinstance(exc, psycopg.errors.UniqueViolation) and "provider_task" in str(exc):
        return TaskAlreadyClaimed(f"upstream task already claimed by another job: {exc}")
    return DatabaseError(f"database error: {exc}")


async def execute(conn: Conn, name: str, params: dict[str, Any]) -> list[DictRow]:
    try:
        cur = await conn.execute(QUERIES[name], params)
        return await cur.fetchall() if cur.description is not None else []
    except psycopg.errors.UniqueViolation as exc:
        if "call_events_pkey" in str(exc):
            return []  # someone appended this seq first: a lost race
        raise _translate(exc) from exc
    except psycopg.Error as exc:
        raise _translate(exc) from exc


async def load(conn: Conn, job_id: uuid.UUID) -> CallProjection:
    """The projection stored on the job's row; :class:`JobNotFound` if there is none."""
    rows = await execute(conn, "load_projection", {"job_id": job_id})
    if not rows:
        raise JobNotFound(job_id)
    return from_row(rows[0])


def _params(job_id: uuid.UUID, current: CallProjection, new: CallProjection,
            event: Event) -> dict[str, Any]:
    type_name, version, payload = encode(event)
    settling = new.terminal and not current.terminal
    params = to_columns(new)
    params.update(
        job_id=job_id, expected_version=current.version, type=type_name,
        event_version=version, payload=payload.decode(), actor=event.actor,
        is_cancel=isinstance(event, Cancelled), is_start=isinstance(event, CallStarted),
        settle_to=new.settlement if settling else None,
        cost=new.provider_cost,
    )
    return params


def _settled(settle_to: str | None, row: DictRow) -> Settled | None:
    if settle_to is None:
        return None
    if row["settled"]:
        return "settled"
    return "already_settled" if row["reservations"] else "no_reservation"


async def append(
    conn: Conn, job_id: uuid.UUID, current: CallProjection, event: Event
) -> AppendResult:
    """Append ``event`` to a call whose projection the caller read as ``current``.

    Raises ``InvalidTransition`` (nothing written) if the event may not follow
    ``current``; returns ``ok=False`` with the fresh projection if someone else wrote
    first."""
    new = apply(current, event)
    params = _params(job_id, current, new, event)
    rows = await execute(conn, "append_event", params)
    if not rows or not rows[0]["appended"]:
        return AppendResult(ok=False, projection=await load(conn, job_id))
    result = AppendResult(ok=True, projection=new, event=event,
                          settlement=_settled(params["settle_to"], rows[0]))
    for fn in _observers:
        fn(result)
    return result


async def transition(
    conn: Conn, job_id: uuid.UUID, decide: Decide, *, max_conflicts: int = 8,
    current: CallProjection | None = None,
) -> AppendResult:
    """Read, decide, append; on a lost race re-decide on the winner's projection.

    ``decide`` returns the event to append or ``None`` when nothing should happen (then
    the result is ``ok=False`` with the projection as read)."""
    projection = current if current is not None else await load(conn, job_id)
    for _ in range(max_conflicts):
        event = decide(projection)
        if event is None:
            return AppendResult(ok=False, projection=projection)
        result = await append(conn, job_id, projection, event)
        if result.ok:
            return result
        projection = result.projection
    raise ConflictExhausted(f"job {job_id}: lost {max_conflicts} races in a row")


async def cancel(conn: Conn, job_id: uuid.UUID, *, by: str, now: Any) -> AppendResult:
    """Cancel the job's call (refunding its reservation) unless it is already terminal;
    ``ok=False`` with the terminal projection otherwise."""

    def decide(p: CallProjection) -> Event | None:
        return None if p.terminal else Cancelled(at=now, actor=by, by=by)

    return await transition(conn, job_id, decide)
