"""Reading jobs' histories in batches: one consistent snapshot, one JSON decode per job.

The shared read path of ``verify`` and ``rebuild``. A batch is read inside ONE
``REPEATABLE READ READ ONLY`` transaction (rows, events and reservations from the same
snapshot; plain reads, so writers never wait), keyset-paginated on ``jobs.id`` so memory
is bounded by the batch whatever the size of the log.

Each job's log arrives as one JSON array built in SQL and is decoded with a single
``msgspec`` call when every event is of its current version and ``seq`` has no gap (the
fast path, checked against the ``type/version`` signature the query also returns).
Anything else — an old version to upcast, a gap, a corrupt payload, an unknown type —
goes through :func:`callwarden.database.write.load_events` in the same snapshot, which upcasts or
raises :class:`EventDecodeError` naming the job and seq.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from psycopg.rows import DictRow

from callwarden.database.db import Conn
from callwarden.database.snapshot import snapshot
from callwarden.database.write import execute, load_events
from callwarden.events.codec import EventDecodeError
from callwarden.events.types import EVENT_TYPES, VERSIONS, Event
from callwarden.projections.columns import from_row
from callwarden.projections.fold import CallProjection
from callwarden.rules.fold import fold_checked

__all__ = [
    "FIRST_ID", "History", "JobError", "decode_fast", "next_ids", "read_histories",
    "signatures", "snapshot",
]

FIRST_ID = uuid.UUID(int=0)
_list_decoder = msgspec.json.Decoder(list[Event])


class JobError(msgspec.Struct, frozen=True, kw_only=True):
    """A job whose log (or row) cannot be replayed; ``seq`` names the event when known."""

    job_id: str
    seq: int | None
    reason: str


class History(msgspec.Struct, kw_only=True):
    """One job as read in a snapshot: its stored projection and the fold of its log."""

    job_id: uuid.UUID
    stored: CallProjection | None = None
    statuses: list[str] = msgspec.field(default_factory=list)
    settled_by: list[int | None] = msgspec.field(default_factory=list)
    folded: CallProjection | None = None
    events: int = 0
    error: JobError | None = None


async def next_ids(conn: Conn, after: uuid.UUID, batch: int,
                   since: datetime | None = None) -> list[uuid.UUID]:
    """The next ``batch`` job ids after ``after`` (jobs with a call, or with an event
    recorded at or after ``since``)."""
    if since is None:
        rows = await execute(conn, "audit_verify_ids", {"after": after, "batch": batch})
    else:
        rows = await execute(conn, "audit_verify_ids_since",
                             {"after": after, "batch": batch, "since": since})
    return [r["id"] for r in rows]


def signatures() -> dict[type, str]:
    # Built per batch, not at import: VERSIONS is the registry an upgrade (or a test) sets.
    return {cls: f"{name}/{VERSIONS[name]}" for name, cls in EVENT_TYPES.items()}


def decode_fast(row: DictRow | dict[str, Any], sigs: dict[type, str]) -> list[Event] | None:
    """The job's events when its whole log is current and gap-free; ``None`` when the
    slow path must decide (old version, gap, bad payload, unknown type)."""
    if not row["n"]:
        return []
    if row["last_seq"] != row["n"]:
        return None
    try:
        events = _list_decoder.decode(row["payloads"])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if " ".join([sigs[type(e)] for e in events]) != row["sig"]:
        return None
    return events


async def _events(conn: Conn, row: DictRow, sigs: dict[type, str]) -> list[Event]:
    events = decode_fast(row, sigs)
    return events if events is not None else await load_events(conn, row["id"])


def _stored(row: DictRow) -> CallProjection:
    try:
        return from_row(row)
    except (ValueError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise EventDecodeError(row["id"], 0, f"projection row unreadable: {exc}") from exc


async def _history(conn: Conn, row: DictRow, sigs: dict[type, str]) -> History:
    h = History(job_id=row["id"], statuses=list(row["statuses"]),
                settled_by=list(row["settled_by"]))
    try:
        h.stored = _stored(row)
        events = await _events(conn, row, sigs)
        h.events = len(events)
        h.folded = fold_checked(h.job_id, events)
    except EventDecodeError as exc:
        h.error = JobError(job_id=str(h.job_id), seq=exc.seq or None, reason=exc.reason)
    return h


async def read_histories(conn: Conn, ids: Sequence[uuid.UUID]) -> list[History]:
    """The jobs ``ids`` read and folded; call inside :func:`snapshot` for consistency."""
    rows = await execute(conn, "audit_histories", {"ids": list(ids)})
    sigs = signatures()
    return [await _history(conn, row, sigs) for row in rows]
