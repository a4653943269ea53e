"""Host garbage in callwarden's own columns and corrupt events, as a hypothesis property
(issue 15, item 6).

Each example starts from an empty database and sets up, through the engine's real write
path (and one host seed row by SQL), jobs in several states: a stale call whose task is
done upstream, a stale call whose task is stuck, a stale sync call, a fresh call, a
completed and a failed call, and a host seed row. Then, with plain SQL as a host would,
it writes generated garbage into one chosen job: into callwarden's own ``jobs`` columns
(those the migrations add to the host's baseline table, listed from
``information_schema``: wrong types in text and jsonb columns, other and nonsense states,
negative and huge counters, NULLs, impossible timestamps; whatever Postgres refuses a host
could not write either, and is skipped) and/or into its events (payload garbage, one field
of a payload, an unknown type, an unknown version, a deleted or moved seq).

What already has example tests (``test_verify_rebuild.py``, ``test_audit.py``,
``test_host_boundary.py``: one tampered column, one missing event, one bad payload, one
unreadable row beside one good one) is the single case; this is the property over all
of them at once.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, NamedTuple

import aiohttp
import msgspec
import psycopg
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.migrate import available
from callwarden.database.write import append, load, load_events, load_stored
from callwarden.events.codec import EventDecodeError
from callwarden.events.states import CallState, InvalidTransition
from callwarden.events.types import EVENT_TYPES
from callwarden.projections.columns import READ_COLUMNS, ProjectionUnreadable
from callwarden.projections.fold import OBSERVED_FIELDS, CallProjection, fold
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.reconciler.loop import Counts
from callwarden.replay.audit import AuditReport, audit_job
from callwarden.replay.verify import BatchResult, verify, verify_job
from callwarden.rules.upstream import upstream_event
from tests.integration.conftest import MakeReconciler
from tests.support.audit import new_job
from tests.support.calls import DEAD, NOW_SCRIPT, OLD, dead_worker_call, seed_row, upstream_task
from tests.support.paths import completed_path, failed_path

# -- callwarden's columns, from the migrations ------------------------------------------------

COLUMNS_OF = """
SELECT column_name, data_type FROM information_schema.columns
WHERE table_schema = %s AND table_name = 'jobs' ORDER BY column_name
"""


async def callwarden_columns(conn: Conn) -> dict[str, str]:
    """The ``jobs`` columns the migrations add to the host's baseline table (migration
    0001, applied to an empty schema in a transaction rolled back), with their types."""
    schema = (await (await conn.execute("SELECT current_schema() AS s")).fetchone() or {})["s"]
    migrated = {r["column_name"]: r["data_type"]
                for r in await (await conn.execute(COLUMNS_OF, (schema,))).fetchall()}
    (baseline,) = [m.sql for m in available() if m.version == 1]
    async with conn.transaction(force_rollback=True):
        await conn.execute("CREATE SCHEMA cw_baseline")
        await conn.execute("SET LOCAL search_path = cw_baseline")
        await conn.execute(baseline.encode())
        host = {r["column_name"]
                for r in await (await conn.execute(COLUMNS_OF, ("cw_baseline",))).fetchall()}
    assert host
    assert host < set(migrated)
    return {c: t for c, t in migrated.items() if c not in host}


@pytest.fixture
async def columns(conn: Conn) -> dict[str, str]:
    found = await callwarden_columns(conn)
    assert {"call_state", "call_version", "upstream_result", "call_output"} <= set(found)
    return found


# -- the jobs of one example ------------------------------------------------------------------

STALE = ("stale_done", "stale_stuck", "stale_sync", "stale_succeeded", "seed")
TARGETS = ("stale_done", "stale_stuck", "stale_sync", "stale_succeeded", "fresh", "completed",
           "failed")


async def setup_jobs(conn: Conn, http: aiohttp.ClientSession,
                     sim: RunningSimulator) -> dict[str, uuid.UUID]:
    await conn.execute("TRUNCATE jobs, callwarden.webhook_deliveries CASCADE")
    done = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    stuck = await upstream_task(http, sim, "kie-standard", {"end": "stuck"})
    result = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    succeeded = await dead_worker_call(conn, "kie-standard", result)
    recorded = upstream_event(await poll_task("kie-standard", result, http, sim.settings),
                              DEAD, utcnow() - OLD)
    assert recorded is not None
    await append(conn, succeeded, await load(conn, succeeded), recorded)
    return {
        "stale_succeeded": succeeded,
        "stale_done": await dead_worker_call(conn, "kie-standard", done),
        "stale_stuck": await dead_worker_call(conn, "kie-standard", stuck),
        "stale_sync": await dead_worker_call(conn, "anthropic-sync", None, sync=True),
        "fresh": await dead_worker_call(conn, "kie-standard", "t-fresh",
                                        age=timedelta(seconds=5)),
        "completed": await new_job(conn, completed_path()),
        "failed": await new_job(conn, failed_path()),
        "seed": await seed_row(conn, None, kind="anthropic-sync", age=timedelta(minutes=40)),
    }


# What one reconciler pass makes of each job nobody corrupted: (call_state, reservation).
EXPECTED = {"stale_done": ("completed", "committed"), "stale_sync": ("swept", "refunded"),
            "stale_succeeded": ("completed", "committed"),
            "seed": ("swept", "refunded"), "stale_stuck": ("polling", "reserved")}

ROWS = """
SELECT x.job, md5(string_agg(x.v, ' ' ORDER BY x.v)) AS digest FROM (
    SELECT id AS job, to_jsonb(t)::text AS v FROM jobs t
    UNION ALL SELECT job_id, to_jsonb(t)::text FROM callwarden.call_events t
    UNION ALL SELECT job_id, to_jsonb(t)::text FROM usage_logs t
    UNION ALL SELECT job_id, to_jsonb(t)::text FROM assets t
) x GROUP BY x.job
"""


async def digests(conn: Conn) -> dict[uuid.UUID, str]:
    return {r["job"]: r["digest"] for r in await (await conn.execute(ROWS)).fetchall()}


async def state_of(conn: Conn, job: uuid.UUID) -> tuple[str | None, str | None]:
    r = await (await conn.execute(
        "SELECT j.call_state, u.status FROM jobs j JOIN usage_logs u ON u.job_id = j.id "
        "WHERE j.id = %s", (job,))).fetchone()
    assert r is not None
    return r["call_state"], r["status"]


# -- the garbage -----------------------------------------------------------------------------

class ColumnGarbage(NamedTuple):
    """One value for one of callwarden's columns (``column``: its name, or an index into
    the list, projection columns first), rendered for the column's type: ``shape`` picks
    what a text column gets (text, JSON, a number, a state name), ``null`` writes NULL,
    ``copy`` names another job of the example whose value of the column is copied."""

    column: int | str
    copy: str = ""
    null: bool = False
    shape: int = 0
    text: str = ""
    doc: Any = None
    number: int = 0
    flag: bool = False
    moment: str | int = "infinity"  # a timestamptz literal, or seconds from now()


class EventGarbage(NamedTuple):
    """One corruption of the job's log: ``how`` (payload, field, type, version, delete,
    move) at ``seq`` (an index, taken modulo the log's length)."""

    how: str
    seq: int = 0
    doc: Any = None
    text: str = ""
    number: int = 0


STATES = [s.value for s in CallState]
# Shapes callwarden's own jsonb columns could hold, so garbage also decodes (and lies).
plausible = st.sampled_from([
    {}, {"media": []}, {"media": [], "text": "a lie"}, {"media_urls": ["https://x.example/y"]},
    {"cost": -5.0}, {"stored_keys": ["media/x/0.png"]}, {"raw": {}, "text": "x"},
    {"media": [{"key": "k", "url": "u", "content_type": "image/png", "size": 1}]}])
json_docs = plausible | st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["media", "text", "key", "url", "type", "at", "actor", "raw",
                        "result", "media_urls", "cost", "stored_keys", "size"])
        | st.text(max_size=6),
        inner, max_size=4), max_leaves=8)
texts = st.text(max_size=40).map(lambda s: s.replace("\x00", ""))
moments = st.sampled_from(["infinity", "-infinity", "epoch", "1-01-01", "9999-12-31 23:59",
                           "2000-02-29", "now", "tomorrow"]) | st.integers(-10**9, 10**9)
counters = st.integers(-5, 40) | st.integers(-(2**31), 2**31 - 1)

column_garbage = st.builds(
    ColumnGarbage, column=st.integers(0, len(READ_COLUMNS) - 1) | st.integers(0, 2**16),
    # (a value copied from another job is the garbage that decodes: the most lies)
    copy=st.sampled_from(["", "", "", "completed", "stale_succeeded", *TARGETS, "seed"]),
    null=st.integers(0, 5).map(lambda n: n == 0),
    shape=st.integers(0, 3), text=texts, doc=json_docs, number=counters, flag=st.booleans(),
    moment=moments)
event_garbage = st.builds(
    EventGarbage, how=st.sampled_from(["payload", "field", "type", "version", "delete",
                                       "move"]),
    seq=st.integers(0, 20), doc=json_docs,
    text=st.sampled_from(sorted(EVENT_TYPES)) | texts, number=st.integers(-3, 40))


class Corruption(NamedTuple):
    target: str
    columns: tuple[ColumnGarbage, ...]
    events: tuple[EventGarbage, ...]


@st.composite
def corruptions(draw: st.DrawFn) -> Corruption:
    """Columns, events, or both: never nothing."""
    what = draw(st.sampled_from(["columns", "events", "both"]))
    return Corruption(
        target=draw(st.sampled_from(TARGETS)),
        columns=tuple(draw(st.lists(column_garbage, min_size=1, max_size=3)))
        if what != "events" else (),
        events=tuple(draw(st.lists(event_garbage, min_size=1, max_size=2)))
        if what != "columns" else ())


def render(g: ColumnGarbage, data_type: str) -> tuple[sql.Composable, Any]:
    """The SQL value expression and its parameter for ``g`` in a column of ``data_type``."""
    if g.null:
        return sql.SQL("NULL"), None
    if data_type == "text":
        value = [g.text, msgspec.json.encode(g.doc).decode(), str(g.number),
                 STATES[g.number % len(STATES)] if g.flag else g.text + "ing"][g.shape]
        return sql.SQL("%s::text"), value
    if data_type == "jsonb":
        return sql.SQL("%s::jsonb"), msgspec.json.encode(g.doc).decode()
    if data_type in ("integer", "smallint", "bigint", "numeric"):
        return sql.SQL("%s::" + data_type), g.number
    if data_type == "boolean":
        return sql.SQL("%s::boolean"), g.flag
    if data_type.startswith("timestamp"):
        if isinstance(g.moment, int):
            return sql.SQL("now() + make_interval(secs => %s)"), g.moment
        return sql.SQL("%s::timestamptz"), g.moment
    return sql.SQL("%s"), g.text  # a type this list does not know: let Postgres decide


class Applied(NamedTuple):
    columns: list[str]  # the columns a host could write garbage into (Postgres accepted)
    seqs: list[int]  # the seqs of the log touched


async def write_column(conn: Conn, job: uuid.UUID, column: str, data_type: str,
                       g: ColumnGarbage, jobs: dict[str, uuid.UUID]) -> bool:
    value, param = render(g, data_type)
    if g.copy:  # what another job holds there
        value, param = sql.SQL("(SELECT {} FROM jobs WHERE id = %s)").format(
            sql.Identifier(column)), jobs[g.copy]
    stmt = sql.SQL("UPDATE jobs SET {} = {} WHERE id = %s").format(
        sql.Identifier(column), value)
    params = (job,) if param is None else (param, job)
    try:
        await conn.execute(stmt, params)
    except psycopg.Error:  # the host could not have written it either
        return False
    return True


async def corrupt_event(conn: Conn, job: uuid.UUID, g: EventGarbage) -> int | None:
    """Apply ``g``; the seq it touched (``None``: Postgres refused, or no event)."""
    rows = await (await conn.execute(
        "SELECT seq, payload FROM callwarden.call_events WHERE job_id = %s ORDER BY seq",
        (job,))).fetchall()
    if not rows:
        return None
    row = rows[g.seq % len(rows)]
    seq: int = row["seq"]
    last: int = rows[-1]["seq"]
    statements: dict[str, tuple[str, tuple[Any, ...]]] = {
        "payload": ("UPDATE callwarden.call_events SET payload = %s::jsonb "
                    "WHERE job_id = %s AND seq = %s",
                    (msgspec.json.encode(g.doc).decode(), job, seq)),
        "type": ("UPDATE callwarden.call_events SET type = %s WHERE job_id = %s AND seq = %s",
                 (g.text, job, seq)),
        "version": ("UPDATE callwarden.call_events SET version = %s WHERE job_id = %s AND seq = %s",
                    (g.number, job, seq)),
        "delete": ("DELETE FROM callwarden.call_events WHERE job_id = %s AND seq = %s", (job, seq)),
        "move": ("UPDATE callwarden.call_events SET seq = %s WHERE job_id = %s AND seq = %s",
                 (last + 1 + abs(g.number), job, seq)),
    }
    if g.how == "field":
        keys = sorted(row["payload"]) if isinstance(row["payload"], dict) else []
        if not keys:
            return None
        key = keys[abs(g.number) % len(keys)]
        statements["field"] = (
            "UPDATE callwarden.call_events SET payload = jsonb_set(payload, ARRAY[%s], %s::jsonb) "
            "WHERE job_id = %s AND seq = %s", (key, msgspec.json.encode(g.doc).decode(),
                                               job, seq))
    stmt, params = statements[g.how]
    try:
        await conn.execute(stmt.encode(), params)
    except psycopg.Error:
        return None
    return seq


async def corrupt(conn: Conn, jobs: dict[str, uuid.UUID], columns: dict[str, str],
                  c: Corruption) -> Applied:
    job = jobs[c.target]
    # The projection's columns first (small indexes are drawn more often), then the rest.
    names = sorted(columns, key=lambda n: (n not in READ_COLUMNS, n))
    applied = Applied([], [])
    for g in c.columns:
        column = g.column if isinstance(g.column, str) else names[g.column % len(names)]
        assert column in columns, f"{column} is not one of callwarden's columns"
        if await write_column(conn, job, column, columns[column], g, jobs):
            applied.columns.append(column)
            event(f"column {column}" + (f" copied from {g.copy}" if g.copy else ""))
        else:
            event("column garbage refused by Postgres")
    for e in c.events:
        seq = await corrupt_event(conn, job, e)
        if seq is not None:
            applied.seqs.append(seq)
            event(f"event {e.how}")
    return applied


# -- what the engine's own readers say (for the oracle) ------------------------------------------

async def stored(conn: Conn, job: uuid.UUID) -> CallProjection | None:
    """The row as a projection; ``None`` when a callwarden column does not decode."""
    try:
        return await load_stored(conn, job)
    except ProjectionUnreadable:
        return None


async def log_fold(conn: Conn, job: uuid.UUID) -> CallProjection | None:
    """The fold of the job's log; ``None`` when the log cannot be read or replayed."""
    try:
        return fold(await load_events(conn, job))
    except (EventDecodeError, InvalidTransition):
        return None


def same(a: CallProjection, b: CallProjection) -> bool:
    strip = {f: None for f in OBSERVED_FIELDS}
    return msgspec.structs.replace(a, **strip) == msgspec.structs.replace(b, **strip)


# -- the property ------------------------------------------------------------------------------

def reported(batches: list[BatchResult]) -> set[str]:
    return ({m.job_id for b in batches for m in b.mismatches}
            | {e.job_id for b in batches for e in b.errors})


async def audited(conn: Conn, job: uuid.UUID) -> AuditReport | EventDecodeError:
    """The audit of ``job``, or the typed error it refused with (anything else raises)."""
    try:
        return await audit_job(conn, job)
    except EventDecodeError as exc:
        return exc


async def check(conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
                make_reconciler: MakeReconciler, columns: dict[str, str],
                c: Corruption) -> None:
    jobs = await setup_jobs(conn, http, sim)
    bad = jobs[c.target]
    others = {name: job for name, job in jobs.items() if job != bad}
    before_row, before_log = await stored(conn, bad), await log_fold(conn, bad)
    assert before_row is not None
    assert before_log is not None
    applied = await corrupt(conn, jobs, columns, c)
    row, log = await stored(conn, bad), await log_fold(conn, bad)
    # A reader sees a lie when the row or the fold of the log reads differently now.
    lies = (row is None or log is None or not same(row, before_row)
            or not same(log, before_log))
    event("the job lies" if lies else "no lie a reader can see")
    untouched = await digests(conn)
    reservation = await usage_of(conn, bad)

    # verify: the bad job, and only it, is reported; a log error names a corrupted seq.
    _, batches = await verify(conn, batch=3)
    assert reported(batches) <= {str(bad)}, "verify reported a job nobody touched"
    if lies:
        assert reported(batches) == {str(bad)}, f"verify missed the garbage ({applied})"
    if log is None and row is not None:  # (an unreadable row is reported for itself)
        (error,) = [e for b in batches for e in b.errors]
        assert error.seq is not None
        assert error.seq >= min(applied.seqs), f"verify names seq {error.seq}"

    # audit: a timeline, or a typed error naming the job and a corrupted seq.
    report = await audited(conn, bad)
    if log is None:
        assert isinstance(report, EventDecodeError), "audit replayed a corrupt log"
        assert (report.job_id, f"job {bad} seq {report.seq}:") == (
            bad, str(report)[:len(f"job {bad} seq {report.seq}:")])
        assert report.seq >= min(applied.seqs)
    else:
        assert isinstance(report, AuditReport), f"audit refused a sound log: {report}"

    # one reconciler pass: no exception, the other stale jobs advance as they would.
    seqs_before, lease_before = await load_seqs(conn, bad), await lease_of(conn, bad)
    broken = log is None or await version_of(conn, bad) != log.version
    counts: Counts = await make_reconciler().reconcile_once()
    assert not counts.pass_failed
    after = await digests(conn)
    for name, job in others.items():
        if name in EXPECTED:
            assert await state_of(conn, job) == EXPECTED[name], name
        else:
            assert after[job] == untouched[job], f"{name} changed"
    # The bad job: left alone, or (a log it cannot replay, or a row not at its log's
    # version) parked and counted, or moved on by its log's truth exactly as an untouched
    # job is, its row then rewritten from the log.
    moved = [s for s in await load_seqs(conn, bad) if s not in seqs_before]
    event(f"{c.target}{' (broken log)' if broken else ''}: {len(moved)} new events")
    if not moved:
        assert await usage_of(conn, bad) == reservation, "a reservation moved, no event"
        lease = await lease_of(conn, bad)
        if broken and lease != lease_before:  # it was claimed: parked and counted
            assert lease is not None, "a broken call was released, not parked"
            assert counts.unreadable == 1
    else:
        assert not broken, f"the pass appended {moved} to a log it cannot replay"
        assert c.target in EXPECTED, f"the pass moved {c.target} on its garbage"
        assert await state_of(conn, bad) == EXPECTED[c.target], "moved on its garbage"
        assert await verify_job(conn, bad) == [], "the write did not repair the row"
    _, batches = await verify(conn)
    assert reported(batches) <= {str(bad)}, "after the pass, verify reports another job"


async def lease_of(conn: Conn, job: uuid.UUID) -> Any:
    r = await (await conn.execute("SELECT reconcile_lease_until AS v FROM jobs WHERE id = %s",
                                  (job,))).fetchone()
    return (r or {}).get("v")


async def version_of(conn: Conn, job: uuid.UUID) -> int:
    r = await (await conn.execute("SELECT call_version AS v FROM jobs WHERE id = %s",
                                  (job,))).fetchone()
    assert r is not None
    return int(r["v"])


async def usage_of(conn: Conn, job: uuid.UUID) -> list[dict[str, Any]]:
    rows = await (await conn.execute(
        "SELECT id, status, credits_charged, settled_by_seq FROM usage_logs "
        "WHERE job_id = %s ORDER BY id", (job,))).fetchall()
    return [dict(r) for r in rows]


async def load_seqs(conn: Conn, job: uuid.UUID) -> list[int]:
    rows = await (await conn.execute("SELECT seq FROM callwarden.call_events WHERE job_id = %s",
                                     (job,))).fetchall()
    return [r["seq"] for r in rows]


# Found by this property (shrunk): a stale call whose first event's payload is JSON null,
# its row intact, was polled and completed by the reconciler, three events stacked on a log
# nobody can replay and its credits committed. The same bug, decided on the row's cached
# columns instead of the log: call_version 7 on a 2-event log made it append seqs 8-10; a
# host's attempt counter of 40 exhausted and refunded a call still running upstream; an
# upstream_result copied from another job made the finalizer download that job's media
# (refused: failed and refunded; a fetchable one would have been stored and committed).
@example(c=Corruption(target="stale_done", columns=(),
                      events=(EventGarbage(how="payload", seq=0, doc=None),)))
@example(c=Corruption(target="stale_done", events=(),
                      columns=(ColumnGarbage(column="call_version", number=7),)))
@example(c=Corruption(target="stale_stuck", events=(),
                      columns=(ColumnGarbage(column="reconcile_attempts", number=40),)))
@example(c=Corruption(target="stale_succeeded", events=(),
                      columns=(ColumnGarbage(column="upstream_result", copy="completed"),)))
# verify did not see a completed call's media copied onto a call still polling
# (output_media was exempt as a host field; it is read from callwarden's call_output).
@example(c=Corruption(target="stale_stuck", events=(),
                      columns=(ColumnGarbage(column="call_output", copy="completed"),)))
# An UpstreamSucceeded relabelled v1 with a result that is not an object: the upcaster's
# TypeError escaped load_events (verify, audit and the reconciler alike), untyped.
@example(c=Corruption(target="completed", columns=(), events=(
    EventGarbage(how="version", seq=2, number=1),
    EventGarbage(how="field", seq=2, doc=5, number=2))))
@settings(report_multiple_bugs=False)
@given(c=corruptions())
async def test_garbage_in_one_job_is_reported_on_it_and_harms_no_other(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler, columns: dict[str, str], c: Corruption) -> None:
    """Whatever a host writes into one job's callwarden columns, and however its events
    are corrupted, while every other job is left as the engine wrote it:

    - ``verify`` reports that job whenever its row or the fold of its log reads
      differently than before (a log it cannot replay: an error naming a seq at or after
      the first one corrupted), and reports no other job, before the pass and after;
    - ``audit`` of it is a timeline when its log replays, else an ``EventDecodeError``
      naming the job and such a seq, never an untyped exception;
    - one reconciler pass never raises and never fails the claim; every other stale job
      ends exactly as it would without the garbage, and every other job's rows and
      reservations are unchanged;
    - the bad job is left alone (its reservation with it), or parked and counted
      ``unreadable`` when its log cannot be replayed or its ``call_version`` is not its
      log's length, or moved on by its log's truth exactly as an untouched job of its
      kind is, its row then rewritten from the log (it verifies clean): never on the
      garbage."""
    await check(conn, http, sim, make_reconciler, columns, c)
