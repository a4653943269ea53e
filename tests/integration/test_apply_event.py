"""One definition: the fold (Python) and ``callwarden.apply_event`` (SQL, rendered from the
same rules, projections/writes.py) agree on every (state, event).

The SQL side folds in the database, writing nothing: a recursive query applies the events
one by one to a real ``jobs`` row value. Each test compares the projection the two make,
column by column, or that both refuse (InvalidTransition in Python, CW003 in SQL)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from callwarden.database.appending import without_nul
from callwarden.database.db import Conn
from callwarden.events.codec import encode
from callwarden.events.states import LEGACY_KIND, CallState, InvalidTransition
from callwarden.events.types import (
    EVENT_TYPES,
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    HostEnded,
    LeftoverSettled,
    ReconcileAttempted,
    StoredMedia,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.columns import from_row
from callwarden.projections.fold import CallProjection, apply
from tests.histories import History, histories
from tests.support.paths import at

# The fold in a recursive query over the distributed jobs table: Citus plans it on the
# workers and answers 42883 there. (The host functions, which call apply_event in
# PL/pgSQL on the coordinator, run on Citus in .ci/run.)
pytestmark = pytest.mark.plain_postgres

K = "kie-standard"
A = "worker:a"

_FOLD_IN_SQL = """
WITH RECURSIVE evs AS (
    SELECT x.n, x.e FROM jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS x(e, n)
), steps AS (
    SELECT 0::bigint AS n, j FROM jobs j WHERE j.id = %(job)s
    UNION ALL
    SELECT s.n + 1, callwarden.apply_event(s.j, evs.e) FROM steps s JOIN evs ON evs.n = s.n + 1
)
SELECT (s.j).* FROM steps s ORDER BY s.n"""


def _payloads(events: list[Event]) -> str:
    return "[" + ",".join(encode(e)[2].decode() for e in events) + "]"


async def _sql_fold(conn: Conn, job: uuid.UUID, events: list[Event]
                    ) -> list[CallProjection] | str:
    """The projection after each event as apply_event makes it, or the SQLSTATE it
    refused with."""
    try:
        cur = await conn.execute(_FOLD_IN_SQL, {"events": _payloads(events), "job": job})
    except psycopg.Error as exc:
        return str(exc.sqlstate)
    return [_projection(r) for r in await cur.fetchall()][1:]


def _projection(row: dict[str, Any]) -> CallProjection:
    """``from_row`` reads the JSON columns as text, as the engine's statements select them."""
    return from_row({**row, **{c: None if row[c] is None else json.dumps(row[c])
                               for c in ("call_output", "upstream_result")}})


def _py_fold(base: CallProjection, events: list[Event]) -> list[CallProjection] | str:
    out, p = [], base
    try:
        for e in events:
            p = apply(p, e)
            out.append(p)
    except InvalidTransition:
        return "CW003"
    return out


@pytest.fixture
async def job(conn: Conn) -> Any:
    cur = await conn.execute("SELECT callwarden.create_job('u1', 10) AS id")
    row = await cur.fetchone()
    assert row is not None
    yield row["id"]
    await conn.execute("DELETE FROM usage_logs WHERE job_id = %s", (row["id"],))
    await conn.execute("DELETE FROM jobs WHERE id = %s", (row["id"],))


async def _base(conn: Conn, job: uuid.UUID) -> CallProjection:
    cur = await conn.execute("SELECT * FROM jobs WHERE id = %s", (job,))
    row = await cur.fetchone()
    assert row is not None
    return _projection(row)


_MEDIA = (StoredMedia(key="k/0", url="/m/k/0", content_type="image/png", size=3),)
_RESULT = UpstreamResult(media_urls=("u",), text="t", cost=1.5, raw={"a": [1, {"b": None}]},
                         usage={"in": 3.0, "model": "m"}, stop_reason="end_turn")


def _s(n: float) -> Any:
    return at(n)


#: How a call is left before the event under test: every state, and the refinements the
#: rules read (a held lease, a legacy adoption, a settlement left to the host).
PREFIXES: dict[str, list[Event]] = {
    "no call": [],
    "created": [CallStarted(at=_s(1), actor=A, kind=K)],
    "created, sync": [CallStarted(at=_s(1), actor=A, kind=K, sync=True)],
    "polling": [CallStarted(at=_s(1), actor=A, kind=K), TaskCreated(at=_s(2), actor=A,
                                                                     task_id="t1")],
    "adopted, a task": [Adopted(at=_s(1), actor=A, kind=K, task_id="t1",
                                call_started_at=_s(-50), reconcile_attempts=2,
                                reconcile_last_error="x")],
    "adopted, legacy": [Adopted(at=_s(1), actor=A, kind=LEGACY_KIND)],
    "retried": [CallStarted(at=_s(1), actor=A, kind=K),
                TaskCreated(at=_s(2), actor=A, task_id="t1"),
                ReconcileAttempted(at=_s(3), actor=A, outcome="running", error="slow",
                                   next_attempt_at=_s(60))],
    "upstream_succeeded": [CallStarted(at=_s(1), actor=A, kind=K),
                           TaskCreated(at=_s(2), actor=A, task_id="t1"),
                           UpstreamSucceeded(at=_s(3), actor=A, result=_RESULT)],
    "finalizing, lease held": [
        CallStarted(at=_s(1), actor=A, kind=K), TaskCreated(at=_s(2), actor=A, task_id="t1"),
        UpstreamSucceeded(at=_s(3), actor=A, result=_RESULT),
        FinalizeClaimed(at=_s(4), actor=A, owner="o1", lease_until=_s(3600))],
    "finalize failed": [
        CallStarted(at=_s(1), actor=A, kind=K), TaskCreated(at=_s(2), actor=A, task_id="t1"),
        UpstreamSucceeded(at=_s(3), actor=A, result=_RESULT),
        FinalizeClaimed(at=_s(4), actor=A, owner="o1", lease_until=_s(50)),
        FinalizeFailed(at=_s(5), actor=A, error="disk")],
    "completed": [
        CallStarted(at=_s(1), actor=A, kind=K), TaskCreated(at=_s(2), actor=A, task_id="t1"),
        UpstreamSucceeded(at=_s(3), actor=A, result=_RESULT),
        FinalizeClaimed(at=_s(4), actor=A, owner="o1", lease_until=_s(50)),
        Completed(at=_s(5), actor=A, media=_MEDIA, cost=0.5, text="hi")],
    "failed": [CallStarted(at=_s(1), actor=A, kind=K),
               UpstreamFailed(at=_s(2), actor=A, error="boom", code="E")],
    "swept": [CallStarted(at=_s(1), actor=A, kind=K), Swept(at=_s(2), actor=A)],
    "exhausted": [CallStarted(at=_s(1), actor=A, kind=K),
                  Exhausted(at=_s(2), actor=A, attempts=9)],
    "cancelled": [Cancelled(at=_s(1), actor=A, by="user")],
    "host completed": [CallStarted(at=_s(1), actor=A, kind=K),
                       HostEnded(at=_s(2), actor=A, status="completed")],
    "host failed": [CallStarted(at=_s(1), actor=A, kind=K),
                    HostEnded(at=_s(2), actor=A, status="errored")],
}

_T = 100  # the event under test comes after every prefix's events (seconds)

#: Each event type, with the payload variants its rule reads differently.
EVENTS: dict[str, Event] = {
    "CallStarted": CallStarted(at=_s(_T), actor=A, kind=K),
    "CallStarted, sync": CallStarted(at=_s(_T), actor=A, kind="anthropic-sync", sync=True),
    "Adopted": Adopted(at=_s(_T), actor=A, kind=K),
    "Adopted, a task": Adopted(at=_s(_T), actor=A, kind=K, task_id="t7",
                               call_started_at=_s(-9), reconcile_attempts=3,
                               reconcile_last_error="e"),
    "Adopted, an empty task": Adopted(at=_s(_T), actor=A, kind=K, task_id=""),
    "Adopted, legacy": Adopted(at=_s(_T), actor=A, kind=LEGACY_KIND, task_id="t8",
                               reconcile_attempts=4),
    "TaskCreated": TaskCreated(at=_s(_T), actor=A, task_id="t9"),
    "UpstreamSucceeded": UpstreamSucceeded(at=_s(_T), actor=A, result=_RESULT),
    "UpstreamSucceeded, bare": UpstreamSucceeded(at=_s(_T), actor=A, result=UpstreamResult()),
    "UpstreamFailed": UpstreamFailed(at=_s(_T), actor=A, error="no", code="X"),
    "FinalizeClaimed": FinalizeClaimed(at=_s(_T), actor=A, owner="o2", lease_until=_s(_T + 60)),
    "FinalizeClaimed, after the lease": FinalizeClaimed(at=_s(7200), actor=A, owner="o3",
                                                        lease_until=_s(7260)),
    "FinalizeFailed": FinalizeFailed(at=_s(_T), actor=A, error="store"),
    "Completed": Completed(at=_s(_T), actor=A, media=_MEDIA, cost=0.25, text="x",
                           stop_reason="end"),
    "Completed, bare": Completed(at=_s(_T), actor=A),
    "Swept": Swept(at=_s(_T), actor=A),
    "Swept, a reason": Swept(at=_s(_T), actor=A, reason="upstream_task_not_found"),
    "Exhausted": Exhausted(at=_s(_T), actor=A, attempts=1),
    "Exhausted, an error": Exhausted(at=_s(_T), actor=A, attempts=12, last_error="e2"),
    "Cancelled": Cancelled(at=_s(_T), actor=A, by="user"),
    "HostEnded, completed": HostEnded(at=_s(_T), actor=A, status="completed"),
    "HostEnded, cancelled": HostEnded(at=_s(_T), actor=A, status="cancelled"),
    "HostEnded, other": HostEnded(at=_s(_T), actor=A, status="failed"),
    "ReconcileAttempted": ReconcileAttempted(at=_s(_T), actor=A, outcome="running"),
    "ReconcileAttempted, an error": ReconcileAttempted(at=_s(_T), actor=A, outcome="error",
                                                       error="e3", next_attempt_at=_s(200)),
    "LeftoverSettled": LeftoverSettled(at=_s(_T), actor=A, status="completed"),
}


def test_every_event_type_and_every_state_is_taken() -> None:
    assert {type(e).__name__ for e in EVENTS.values()} == set(EVENT_TYPES)
    reached = set()
    for prefix in PREFIXES.values():
        folded = _py_fold(CallProjection(status="pending"), prefix)
        assert not isinstance(folded, str)
        reached |= {folded[-1].state} if folded else set()
    assert reached == set(CallState)


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_apply_event_is_the_fold_on_every_state_and_event(
        conn: Conn, job: uuid.UUID, prefix: str) -> None:
    """For every prefix (every state) and every event variant: the SQL function and the
    fold make the same projection, or both refuse the event."""
    base = await _base(conn, job)
    agreed, refused = 0, 0
    for name, event in EVENTS.items():
        events = [*PREFIXES[prefix], event]
        py, sql = _py_fold(base, events), await _sql_fold(conn, job, events)
        assert sql == py, (prefix, name)
        refused += py == "CW003"
        agreed += py != "CW003"
    assert agreed > 0 or prefix.startswith(("completed", "failed", "swept", "exhausted",
                                            "cancelled", "host"))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(h=histories(max_len=14, illegal_rate=0.3))
async def test_apply_event_folds_every_history_as_python_does(
        conn: Conn, job: uuid.UUID, h: History) -> None:
    """Invariant: for any history walked from the transition table (with, sometimes, one
    illegal event), the projection ``callwarden.apply_event`` makes after each event
    equals the fold's, and an event the fold refuses the function refuses too. (The events
    as the log holds them: a NUL, which jsonb refuses, recorded as U+FFFD.)"""
    events = [without_nul(e) for e in h.events]
    py, sql = _py_fold(await _base(conn, job), events), await _sql_fold(conn, job, events)
    assert sql == py
    if h.illegal_at is None:
        assert isinstance(py, list)
        assert len(py) == len(events)


async def test_the_lease_and_the_settlement_refusals_name_what_was_refused(
        conn: Conn, job: uuid.UUID) -> None:
    held = [*PREFIXES["finalizing, lease held"], EVENTS["FinalizeClaimed"]]
    with pytest.raises(psycopg.Error, match="lease held by o1") as raised:
        await conn.execute(_FOLD_IN_SQL, {"events": _payloads(held), "job": job})
    assert raised.value.sqlstate == "CW003"
    early = [*PREFIXES["completed"], EVENTS["LeftoverSettled"]]
    with pytest.raises(psycopg.Error, match="only a reservation left to the host"):
        await conn.execute(_FOLD_IN_SQL, {"events": _payloads(early), "job": job})
    later = timedelta(seconds=1)  # the same takeover once the lease has run out: taken
    late = [*PREFIXES["finalizing, lease held"],
            FinalizeClaimed(at=_s(3600) + later, actor=A, owner="o2", lease_until=_s(7200))]
    folded = await _sql_fold(conn, job, late)
    assert not isinstance(folded, str)
    assert folded[-1].finalize_owner == "o2"
