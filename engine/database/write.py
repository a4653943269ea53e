"""The write path: one transition = one statement = one transaction (DESIGN §5).

``append`` folds the event onto the projection the caller read (pure), then sends one
statement that updates the ``jobs`` projection fenced on what was read (``call_version``,
the host's ``status``, the reservations already settled), appends the event at
``seq = version + 1`` and, for a settling transition, moves the job's reservations from
``reserved`` with a compare-and-set. A lost race writes nothing and returns ``ok=False``
with the projection that won; ``transition`` re-decides on it, never re-sending the same
event blindly.

The host's decision wins (DESIGN §10): when the row's ``status`` says host code ended the
job (:func:`callwarden.rules.host.host_ended`), ``transition`` records :class:`HostEnded` instead of
the actor's event — the call ends as the host decided, settling only what the host left
reserved — and answers ``ok=False, host_ended=True``: an outcome, not a conflict.

Reading: :func:`load` returns the projection the row caches; a row whose callwarden
columns do not decode (host code wrote over them) is read from its log instead, the truth
the columns only cache. :func:`load_stored` is the strict read ``verify`` needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import partial
from typing import Any

import msgspec
import psycopg
from psycopg.rows import DictRow

from callwarden.database.appending import (
    AppendResult,
    Decide,
    Waiting,
    _observers,
    _settled,
    append_params,
    as_run,
    check_run,
    observe,
    recordable,
    recorded,
    without_nul,
)
from callwarden.database.boundary import is_lost_append_race, translate, translated
from callwarden.database.citus import on_citus
from callwarden.database.db import Conn
from callwarden.database.port import transition_via
from callwarden.database.queries import QUERIES
from callwarden.database.scripts import statements
from callwarden.errors import (
    DatabaseError,
    JobNotFound,
    TaskAlreadyClaimed,
    WriteConflict,
)
from callwarden.events.codec import Encoded, EventDecodeError, decode
from callwarden.events.types import Adopted, Cancelled, Event, StoredMedia, TaskCreated
from callwarden.projections.columns import ProjectionUnreadable, from_row
from callwarden.projections.fold import CallProjection, apply_all, fold

__all__ = [
    "AppendResult", "Decide", "append", "append_params", "as_run", "cancel",
    "cancel_unstarted", "execute", "execute_batch", "execute_script", "from_log", "load",
    "load_events", "load_stored", "observe", "recordable", "recorded", "trace_appends",
    "transition", "without_nul",
]

#: ``(job_id, current, event)`` -> a context around one append, yielding the function the
#: append calls with its result (``callwarden.observe.tracing`` opens a span here).
TraceAppend = Callable[[uuid.UUID, CallProjection, Sequence[Event]],
                       AbstractContextManager[Callable[[AppendResult], None]]]
_trace: TraceAppend | None = None


def trace_appends(hook: TraceAppend | None) -> None:
    """Wrap every append of this process in ``hook`` (``None``: none; the default)."""
    global _trace
    _trace = hook


async def _run(conn: Conn, name: str, params: dict[str, Any]) -> list[DictRow]:
    try:
        cur = await conn.execute(QUERIES[name], params)
        # rows to fetch (``rownumber``: not ``description``, which builds every column's
        # description only to be compared with None)
        return await cur.fetchall() if cur.rownumber is not None else []
    except psycopg.Error as exc:
        if is_lost_append_race(exc):
            return []  # someone appended this seq first: a lost race
        raise translate(exc) from exc


async def _run_many(conn: Conn, name: str, rows: Sequence[dict[str, Any]]) -> None:
    """``name`` once per row, sent at once (psycopg pipelines ``executemany``)."""
    if rows:
        async with conn.cursor() as cur:
            await cur.executemany(QUERIES[name], rows)


async def execute(conn: Conn, name: str, params: dict[str, Any]) -> list[DictRow]:
    """Run the named query; driver errors come out as :mod:`callwarden.errors` types. A
    deadlock or serialization failure is a :class:`WriteConflict` inside the caller's
    transaction (it was rolled back: decide again in a new one), else a plain
    :class:`DatabaseError` (the one statement did nothing)."""
    try:
        return await _run(conn, name, params)
    except WriteConflict as exc:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise
        raise DatabaseError(f"database error: {exc}") from exc


async def execute_batch(conn: Conn, name: str, rows: Sequence[dict[str, Any]]
                        ) -> list[DictRow]:
    """Run the named query once per parameter set (pipelined); every row it returned."""
    out: list[DictRow] = []
    with translated():
        async with conn.cursor() as cur:
            await cur.executemany(QUERIES[name], rows, returning=True)
            while True:
                out.extend(await cur.fetchall())
                if not cur.nextset():
                    break
    return out


async def execute_script(conn: Conn, name: str) -> None:
    """Run a named query of several statements (no parameters): sent as one script, or
    on Citus one statement at a time (in one transaction: Citus refuses a string of
    several commands for some DDL on a distributed table)."""
    with translated():
        if not await on_citus(conn):
            await conn.execute(QUERIES[name])
            return
        async with conn.transaction():
            for statement in statements(QUERIES[name]):
                await conn.execute(statement.encode())


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


async def _row(conn: Conn, job_id: uuid.UUID) -> DictRow:
    rows = await execute(conn, "load_projection", {"job_id": job_id})
    if not rows:
        raise JobNotFound(job_id)
    return rows[0]


async def load_stored(conn: Conn, job_id: uuid.UUID) -> CallProjection:
    """The projection exactly as the row stores it (:class:`ProjectionUnreadable` if a
    callwarden column does not decode)."""
    return from_row(await _row(conn, job_id))


async def load(conn: Conn, job_id: uuid.UUID) -> CallProjection:
    """The call's projection; :class:`JobNotFound` if there is no such job. Read from the
    row, or from the log when the row's callwarden columns do not decode
    (``EventDecodeError`` if the log does not either)."""
    row = await _row(conn, job_id)
    try:
        return from_row(row)
    except ProjectionUnreadable:
        return await from_log(conn, job_id, row)


async def from_log(conn: Conn, job_id: uuid.UUID, row: DictRow) -> CallProjection:
    """The fold of the job's log, with the host-visible facts the row shows (status,
    settled reservations) and the row's ``call_version`` (the write fence)."""
    folded = fold(await load_events(conn, job_id))
    if folded.version != row["call_version"]:
        raise EventDecodeError(job_id, folded.version + 1,
                               f"row at version {row['call_version']} but the log has "
                               f"{folded.version} events")
    return msgspec.structs.replace(
        folded, status=row["status"] if not folded.terminal else folded.status,
        settled_reservations=int(row["settled_reservations"] or 0))


async def append(
    conn: Conn, job_id: uuid.UUID, current: CallProjection, event: Event | Sequence[Event],
    *, assets: Sequence[StoredMedia] | None = None,
) -> AppendResult:
    """Append ``event`` (or a run of events one actor decided at once, in one statement)
    to a call whose projection the caller read as ``current``. ``assets`` (a completion):
    the same statement inserts the asset rows and reopens the parent workflow when this
    node was its sole failure, only if the events were appended.

    Raises ``InvalidTransition`` (nothing written) if an event may not follow the one
    before it; returns ``ok=False`` with the fresh projection if someone else wrote
    first, or if the host's state changed since ``current`` was read."""
    events = as_run(event)
    if _trace is None:
        return await _append(conn, job_id, current, events, assets)
    with _trace(job_id, current, events) as done:
        result = await _append(conn, job_id, current, events, assets)
        done(result)
        return result


async def _append(
    conn: Conn, job_id: uuid.UUID, current: CallProjection, events: Sequence[Event],
    assets: Sequence[StoredMedia] | None,
) -> AppendResult:
    check_run(events)
    events, encoded = recorded(events)
    new = apply_all(current, events)
    params = append_params(job_id, current, new, events, encoded)
    statement = ("append_start" if params["is_start"]
                 else "append_event" if params["settle_to"] is not None else "append_move")
    if assets is not None:
        if not params["is_completion"]:
            raise ValueError("assets are appended only with a Completed "
                             "(append_completion's shape: see callwarden.database.queries)")
        statement = ("append_completion" if params["owns_seed"]
                     else "append_completion_host_seed")
        params.update(assets=_assets_json(assets))
    try:
        if await on_citus(conn):
            claims = _names_a_task(events, new) and new.provider_task_id is not None
            rows = await _append_citus(conn, job_id, new, events, encoded, params, claims,
                                       assets)
        else:
            rows = await _run(conn, statement, params)
    except WriteConflict as exc:
        if conn.info.transaction_status != _IDLE:
            raise WriteConflict(f"job {job_id}: {exc} (the caller's transaction is rolled "
                                "back, on Citus to before the append; decide again in a new "
                                "one)") from exc
        rows = []  # rolled back: as if someone else wrote first
    if rows and rows[0].get("wait_reason") is not None:
        return AppendResult(ok=False, projection=await load(conn, job_id), waiting=Waiting(
            reason=rows[0]["wait_reason"], retry_after_s=float(rows[0]["retry_after_s"])))
    if not rows or not rows[0]["appended"]:
        return AppendResult(ok=False, projection=await load(conn, job_id))
    if rows[0]["settled"]:
        new = msgspec.structs.replace(
            new, settled_reservations=new.settled_reservations + int(rows[0]["settled"]))
    result = AppendResult(ok=True, projection=new, event=events[-1], events=tuple(events),
                          settlement=_settled(params["settle_to"], rows[0]))
    for fn in _observers:
        fn(result)
    return result


def _assets_json(assets: Sequence[StoredMedia]) -> str:
    """append_completion's ``assets`` parameter: one jsonb array of the asset rows."""
    return msgspec.json.encode(list(assets)).decode()  # {key, url, content_type, size}


def _names_a_task(events: Sequence[Event], new: CallProjection) -> bool:
    """The run makes this job the upstream task's: a ``TaskCreated``, or an ``Adopted``
    of a row whose task id the host wrote (its projection already shows that id, so the
    claim cannot be decided by a change of the column) unless the same run ends the call
    (an adopted row swept or exhausted polls nothing)."""
    return any(isinstance(e, TaskCreated) for e in events) or (
        not new.terminal and any(isinstance(e, Adopted) and e.task_id for e in events))


_IDLE = psycopg.pq.TransactionStatus.IDLE


class _NotAppended(Exception):
    """The append lost (rolls back the task claim made in its transaction)."""


async def _append_citus(conn: Conn, job_id: uuid.UUID, new: CallProjection,
                        events: Sequence[Event], encoded: Sequence[Encoded],
                        params: dict[str, Any], claims: bool,
                        assets: Sequence[StoredMedia] | None) -> list[DictRow]:
    """On Citus: the append as statements on the job's one shard group, in one transaction
    (``append_upd_citus`` and the statements after it in queries.sql), and, when the run
    makes the job an upstream task's, the task claimed for the job in ``callwarden_tasks``
    (another job holding it is ``TaskAlreadyClaimed``, as the unique index raises on plain
    Postgres). A lost append leaves nothing, its claim included. Answers the row the one
    statement of plain Postgres answers. Inside the caller's transaction it is a
    savepoint: an append that fails is rolled back to it and the caller's transaction
    stays open (on plain Postgres the failed statement aborts it)."""
    if not conn.autocommit and conn.info.transaction_status == _IDLE:
        await _run(conn, "clock_now", {})  # the caller's transaction, left open as on plain
    try:
        async with conn.transaction():  # (a savepoint inside the caller's transaction)
            if params["is_start"]:  # the admission first, as append_start's adm CTE
                refused = await _run(conn, "admit_citus", params)
                if refused and refused[0]["wait_reason"] is not None:
                    return [{"appended": 0, "settled": 0, "reservations": 0,
                             **refused[0]}]
            won = await _run(conn, "append_upd_start_citus" if params["is_start"]
                             else "append_upd_citus", params)
            if not won:
                raise _NotAppended
            if claims:  # after the fences, as the unique index on plain Postgres
                await _claim_task(conn, job_id, new)
            await _run_many(conn, "append_event_citus", [
                {"job_id": job_id, "seq": params["expected_version"] + n, "type": t,
                 "version": v, "payload": p.decode(), "actor": e.actor}
                for n, (e, (t, v, p)) in enumerate(zip(events, encoded, strict=True),
                                                   start=1)])
            settled = ([{"settled": 0, "reservations": 0}] if params["settle_to"] is None
                       else await _run(conn, "append_settle_citus", params))
            if assets is not None:
                job = won[0]
                await _run_many(conn, "append_asset_citus", [
                    {"job_id": job_id, "user_id": job["user_id"], "is_public": job["is_public"],
                     "key": m.key, "url": m.url, "content_type": m.content_type,
                     "size": m.size} for m in assets])
                if job["workflow_execution_id"] is not None and (
                        await _run(conn, "append_reopen_due_citus", dict(job)))[0]["due"]:
                    await _run(conn, "append_reopen_citus", dict(job))
            return [{**settled[0], "appended": len(events)}]
    except _NotAppended:
        return []
    except psycopg.Error as exc:  # an event's insert (in the pipeline), or the commit
        if is_lost_append_race(exc):
            return []
        raise translate(exc) from exc


async def _claim_task(conn: Conn, job_id: uuid.UUID, new: CallProjection) -> None:
    task = {"kind": new.provider_kind, "task_id": new.provider_task_id, "job_id": job_id}
    await _run(conn, "task_claim_citus", task)
    holder = await _run(conn, "task_holder_citus", task)
    if not holder or holder[0]["job_id"] != job_id:
        raise TaskAlreadyClaimed(f"upstream task already claimed by another job: "
                                 f"{new.provider_kind} {new.provider_task_id}")


async def transition(
    conn: Conn, job_id: uuid.UUID, decide: Decide, *, max_conflicts: int = 8,
    current: CallProjection | None = None,
) -> AppendResult:
    """Read, decide, append; on a lost race re-decide on the winner's projection.

    ``decide`` returns the event to append or ``None`` when nothing should happen (then
    the result is ``ok=False`` with the projection as read). When the host has ended the
    job, :class:`HostEnded` is recorded instead (stamped like the actor's event; nothing
    when the job never had a call) and the result is ``ok=False, host_ended=True``."""
    return await transition_via(partial(load, conn), partial(append, conn), job_id, decide,
                                max_conflicts=max_conflicts, current=current)


async def cancel(conn: Conn, job_id: uuid.UUID, *, by: str, now: datetime) -> AppendResult:
    """Cancel the job's call (refunding its reservation) unless it is already terminal;
    ``ok=False`` with the terminal projection otherwise."""

    def decide(p: CallProjection) -> Event | None:
        return None if p.terminal else Cancelled(at=now, actor=by, by=by)

    return await transition(conn, job_id, decide)


async def cancel_unstarted(conn: Conn, job_id: uuid.UUID, *, by: str,
                           now: datetime) -> AppendResult:
    """Cancel the job (refunding its reservation) only if no call ever started on it: a
    queue giving a job up. ``ok=False`` with the call as it is otherwise, also when a
    delivery recorded ``CallStarted`` between this read and this write (the append is
    fenced on the version read, and the decision is made again on the winner's
    projection): a started call is its delivery's, then the reconciler's, never cancelled
    while its create may be in flight."""

    def decide(p: CallProjection) -> Event | None:
        return Cancelled(at=now, actor=by, by=by) if p.state is None else None

    return await transition(conn, job_id, decide)

