"""The host API (migration 0014): every step a host takes on a call as an SQL function, driven
by plain SQL as a Node or psql host would, and mixed with callwarden's own Python actors on
the same calls. After every step the row's columns and settlement must equal the fold of
the log (``verify_job``), so the functions and the Python write path cannot drift apart;
the transition table they consult is compared with the declaration on every pair."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callwarden import OwnCalls
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool, connect
from callwarden.database.migrate import available, migrate
from callwarden.database.write import append, cancel, load
from callwarden.events.states import LEGAL, CallState
from callwarden.events.types import (
    EVENT_TYPES,
    CallStarted,
    Completed,
    FinalizeClaimed,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.providers.outcomes import Failed
from callwarden.replay.verify import verify_job
from callwarden.rules.redact import safe_error
from tests.support.leaks import LEAKS
from tests.support.leaks import S as SECRET

KIND = "kie-standard"
MEDIA = ('[{"key": "jobs/a/0.png", "url": "file:///srv/a/0.png", '
         '"content_type": "image/png", "size": 3}]')


async def one(conn: Conn, sql: str, *args: Any) -> dict[str, Any]:
    cur = await conn.execute(sql, args)
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def new_job(conn: Conn, credits: str | None = "10") -> uuid.UUID:
    row = await one(conn, "SELECT callwarden.create_job('u1', %s::numeric) AS id", credits)
    return uuid.UUID(str(row["id"]))


async def clean(conn: Conn, job: uuid.UUID) -> None:
    assert await verify_job(conn, job) == []


async def settled(conn: Conn, job: uuid.UUID) -> list[tuple[str, Decimal | None]]:
    cur = await conn.execute("SELECT status, credits_charged FROM usage_logs WHERE job_id = %s "
                             "ORDER BY id", (job,))
    return [(r["status"], r["credits_charged"]) for r in await cur.fetchall()]


async def test_the_transition_table_in_sql_is_the_declaration_on_every_pair(conn: Conn) -> None:
    states: list[CallState | None] = [None, *CallState]
    for state in states:
        for event in EVENT_TYPES:
            row = await one(conn, "SELECT callwarden.next_state(%s, %s) AS dest",
                            state.value if state is not None else None, event)
            expected = LEGAL.get((state, event))
            assert row["dest"] == (expected.value if expected else None), (state, event)


async def test_an_async_call_from_sql_end_to_end(conn: Conn) -> None:
    job = await new_job(conn)
    start = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", job, KIND)
    assert (start["action"], start["state"], start["version"]) == ("create", "created", 1)
    again = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:2')", job, KIND)
    assert again["action"] == "ambiguous"  # a second delivery is never told to create
    made = await one(conn, "SELECT * FROM callwarden.task_created(%s, 't-1', 'node:1')", job)
    assert (made["ok"], made["state"]) == (True, "polling")
    twice = await one(conn, "SELECT * FROM callwarden.task_created(%s, 't-1', 'node:1')", job)
    assert twice["ok"] is False
    resume = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:2')", job, KIND)
    assert (resume["action"], resume["task_id"]) == ("resume", "t-1")
    beat = await one(conn, "SELECT callwarden.heartbeat(%s, 'node:2', 50) AS alive", job)
    assert beat["alive"] is True
    done = await one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:2', %s::jsonb, NULL, 4)",
                     job, MEDIA)
    assert (done["ok"], done["state"], done["settlement"]) == (True, "completed", "settled")
    assert await settled(conn, job) == [("committed", Decimal(4))]
    late = await one(conn, "SELECT * FROM callwarden.failed(%s, 'node:1', 'late')", job)
    assert (late["ok"], late["state"]) == (False, "completed")
    assets = await one(conn, "SELECT count(*) AS n FROM assets WHERE job_id = %s", job)
    assert assets["n"] == 1
    stopped = await one(conn, "SELECT callwarden.heartbeat(%s, 'node:2') AS alive", job)
    assert stopped["alive"] is False
    await clean(conn, job)


async def test_bad_input_is_a_typed_error_and_writes_nothing(conn: Conn) -> None:
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-1', 'node:1')", (job,))
    with pytest.raises(psycopg.Error) as other_task:
        await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-2', 'node:1')", (job,))
    assert other_task.value.sqlstate == "CW001"
    with pytest.raises(psycopg.Error) as wrong_kind:
        await conn.execute("SELECT * FROM callwarden.start_call(%s, 'replicate', 'node:1')",
                           (job,))
    assert wrong_kind.value.sqlstate == "CW002"
    for media in ['{"not": "an array"}', '[{"key": "k"}]', '[{"key": "k", "url": "u", '
                  '"content_type": "image/png", "size": -1}]']:
        with pytest.raises(psycopg.Error) as bad:
            await conn.execute("SELECT * FROM callwarden.succeeded(%s, 'node:1', %s::jsonb)",
                               (job, media))
        assert bad.value.sqlstate == "22023"
    with pytest.raises(psycopg.Error) as missing:
        await conn.execute("SELECT * FROM callwarden.cancel(%s, 'user:1')", (uuid.uuid4(),))
    assert missing.value.sqlstate == "P0002"
    other = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (other, KIND))
    with pytest.raises(psycopg.errors.UniqueViolation):  # another job holds t-1
        await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-1', 'node:1')",
                           (other,))
    p = await load(conn, job)
    assert (p.state, p.version, p.provider_task_id) == (CallState.POLLING, 2, "t-1")
    await clean(conn, job)
    await clean(conn, other)


async def test_two_deliveries_racing_the_claim_make_one_create(db_url: str) -> None:
    conns = [await connect(db_url) for _ in range(4)]
    try:
        job = await new_job(conns[0])
        answers = await asyncio.gather(*(
            one(c, "SELECT * FROM callwarden.start_call(%s, %s, %s)", job, KIND, f"node:{i}")
            for i, c in enumerate(conns)))
        assert sorted(a["action"] for a in answers) == ["ambiguous"] * 3 + ["create"]
        await clean(conns[0], job)
    finally:
        for c in conns:
            await c.close()


async def test_a_call_started_in_sql_is_finished_by_python_and_the_other_way(
        conn: Conn, pool: Pool) -> None:
    calls = OwnCalls(pool)
    try:
        from_sql = await new_job(conn)
        await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                           (from_sql, KIND))
        await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-sql', 'node:1')",
                           (from_sql,))
        resumed = await calls.start(from_sql, KIND)  # Python's face of the same claim
        assert (resumed.action, resumed.resume_task_id) == ("resume", "t-sql")
        failed = await calls.record(from_sql, KIND, Failed(error="upstream said no"))
        assert failed.ok
        assert await settled(conn, from_sql) == [("refunded", Decimal(0))]
        await clean(conn, from_sql)

        from_python = await new_job(conn)
        call = await calls.start(from_python, KIND)
        assert call.action == "create"
        await call.task_created("t-py")
        sql_view = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                             from_python, KIND)
        assert (sql_view["action"], sql_view["task_id"]) == ("resume", "t-py")
        done = await one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:1', %s::jsonb)",
                         from_python, MEDIA)
        assert done["settlement"] == "settled"
        assert await settled(conn, from_python) == [("committed", Decimal(10))]
        await clean(conn, from_python)
    finally:
        await calls.aclose()


async def test_the_hosts_decision_wins_as_in_python(conn: Conn) -> None:
    """A host that wrote a terminal status first: HostEnded, as Python's transition
    records it (completed: the host's to commit; failed: refunded)."""
    for status, settlement, reservation in [("completed", None, "reserved"),
                                            ("failed", "settled", "refunded")]:
        job = await new_job(conn)
        await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
        await conn.execute("UPDATE jobs SET status = %s WHERE id = %s", (status, job))
        if status == "failed":  # a redelivery's start meets the host's decision first
            again = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:2')",
                              job, KIND)
            assert (again["action"], again["state"]) == ("done", "failed")
            assert [s for s, _ in await settled(conn, job)] == [reservation]
            await clean(conn, job)
            continue
        ended = await one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:1')", job)
        assert (ended["ok"], ended["state"], ended["settlement"]) == (False, status, settlement)
        row = await one(conn, "SELECT status, call_settlement FROM jobs WHERE id = %s", job)
        assert row["status"] == status  # the host's word stays
        assert [s for s, _ in await settled(conn, job)] == [reservation]
        await clean(conn, job)


STEPS = ["start", "start_sync", "task", "task_other", "beat", "succeeded", "succeeded_cost",
         "failed", "not_found", "cancel_sql", "cancel_python", "host_completed",
         "host_failed", "host_settles"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=8),
       credits=st.sampled_from([None, "10", "0.5"]))
async def test_any_order_of_host_steps_keeps_the_log_and_the_credits_true(
        conn: Conn, steps: list[str], credits: str | None) -> None:
    """Invariant: whatever order a host (SQL functions, its own plain SQL) and callwarden's
    Python actors take steps in on one job, the row equals the fold of its log after every
    step, and the job's reservation is settled at most once: never committed and
    refunded, never charged more than it reserved."""
    job = await new_job(conn, credits)
    for step in steps:
        refused = await _step(conn, job, step)
        assert refused in (None, "CW001", "CW002")  # the typed refusals only
        await clean(conn, job)
    rows = await settled(conn, job)
    assert len(rows) == (0 if credits is None else 1)
    for status, charged in rows:
        assert status in ("reserved", "committed", "refunded")
        if charged is not None:
            assert charged <= Decimal(credits or 0)


async def _step(conn: Conn, job: uuid.UUID, step: str) -> str | None:
    """Take ``step``; the SQLSTATE it was refused with, if it was."""
    sql = {
        "start": "SELECT * FROM callwarden.start_call(%s, 'kie-standard', 'node:1')",
        "start_sync": "SELECT * FROM callwarden.start_call(%s, 'kie-standard', 'node:1', true)",
        "task": "SELECT * FROM callwarden.task_created(%s, 'task-a', 'node:1')",
        "task_other": "SELECT * FROM callwarden.task_created(%s, 'task-b', 'node:2')",
        "beat": "SELECT callwarden.heartbeat(%s, 'node:1')",
        "succeeded": "SELECT * FROM callwarden.succeeded(%s, 'node:1')",
        "succeeded_cost": "SELECT * FROM callwarden.succeeded(%s, 'node:1', '[]', 'hi', 0.25)",
        "failed": "SELECT * FROM callwarden.failed(%s, 'node:1', 'no')",
        "not_found": "SELECT * FROM callwarden.not_found(%s, 'node:1')",
        "cancel_sql": "SELECT * FROM callwarden.cancel(%s, 'user:1')",
        # the host's own writes, fenced as docs/node.md says a host must (never over an
        # ended job: verify reports a terminal row rewritten)
        "host_completed": "UPDATE jobs SET status = 'completed' WHERE id = %s "
                          "AND status IN ('pending', 'processing')",
        "host_failed": "UPDATE jobs SET status = 'failed' WHERE id = %s "
                       "AND status IN ('pending', 'processing')",
        "host_settles": "UPDATE usage_logs SET status = 'committed', "
                        "credits_charged = credits_reserved "
                        "WHERE job_id = %s AND status = 'reserved'",
    }.get(step)
    try:
        if sql is not None:
            await conn.execute(sql, (job,))
        else:  # cancel_python: callwarden's own actor on the same call
            await cancel(conn, job, by="admin", now=utcnow())
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


# -- what a review of the functions found (each failed before its fix) ---------------------

async def test_a_host_with_uuid_user_ids_migrates_and_creates_jobs(empty_db_url: str) -> None:
    """docs/embedding.md: ``user_id`` may be text or uuid (0014 failed to install)."""
    async with await connect(empty_db_url) as conn:
        baseline = available()[0].sql  # jobs.user_id uuid; usage_logs' and assets' text
        await conn.execute(baseline.replace("user_id               text NOT NULL",
                                            "user_id               uuid NOT NULL").encode())
        await migrate(conn)
        user = str(uuid.uuid4())
        job = await one(conn, "SELECT callwarden.create_job(%s, 5) AS id", user)
        types = await one(conn, "SELECT pg_typeof(j.user_id)::text AS j, "
                                "pg_typeof(u.user_id)::text AS u FROM jobs j "
                                "JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
                          job["id"])
        assert types == {"j": "uuid", "u": "text"}


async def test_host_columns_named_like_the_functions_words_change_nothing(conn: Conn) -> None:
    """A host column called kind, output, error, actor or at never stands in for the
    function's own parameter (each qualified with the function's name). Locals are
    v_-prefixed, and #variable_conflict error makes a host column of such a name a loud
    error, never a silent substitution."""
    await conn.execute("ALTER TABLE jobs ADD COLUMN kind text DEFAULT 'video', "
                       "ADD COLUMN output jsonb DEFAULT '{\"host\": 1}', "
                       "ADD COLUMN error text DEFAULT 'host error', "
                       "ADD COLUMN actor text DEFAULT 'host', ADD COLUMN at timestamptz, "
                       "ADD COLUMN dest text DEFAULT 'x', ADD COLUMN media jsonb")
    ok, failed = await new_job(conn), await new_job(conn)
    for job in (ok, failed):
        await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
        await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-' || %s, 'node:1')",
                           (job, str(job)))
    await conn.execute("SELECT * FROM callwarden.succeeded(%s, 'node:1', %s::jsonb, 'hi')",
                       (ok, MEDIA))
    await conn.execute("SELECT * FROM callwarden.failed(%s, 'node:1', 'upstream said no')",
                       (failed,))
    row = await one(conn, "SELECT provider_kind, call_output->>'text' AS text FROM jobs "
                          "WHERE id = %s", ok)
    assert row == {"provider_kind": KIND, "text": "hi"}
    assert (await one(conn, "SELECT error_message FROM jobs WHERE id = %s",
                      failed))["error_message"] == "upstream said no"
    await clean(conn, ok)
    await clean(conn, failed)


async def test_a_cancel_during_finalization_matches_the_fold(conn: Conn) -> None:
    """Python's worker holds the finalization lease; a SQL cancel keeps the lease columns
    the fold keeps (only Completed clears them)."""
    job = await new_job(conn)
    calls_sql = [("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND)),
                 ("SELECT * FROM callwarden.task_created(%s, 't-fin', 'node:1')", (job,))]
    for sql, args in calls_sql:
        await conn.execute(sql, args)
    now = utcnow()
    p = await load(conn, job)
    p = (await append(conn, job, p, UpstreamSucceeded(
        at=now, actor="worker:py", result=UpstreamResult(media_urls=("u",))))).projection
    await append(conn, job, p, FinalizeClaimed(at=now, actor="worker:py", owner="worker:py",
                                               lease_until=now + timedelta(seconds=60)))
    done = await one(conn, "SELECT * FROM callwarden.cancel(%s, 'user:1')", job)
    assert (done["ok"], done["state"]) == (True, "cancelled")
    await clean(conn, job)


@pytest.mark.parametrize("name", sorted(LEAKS))
async def test_an_error_text_is_recorded_without_its_credentials(conn: Conn,
                                                                 name: str) -> None:
    """callwarden.failed records the error as callwarden.safe_error makes it: rendered
    from the one list of substitutions safe_error applies (rules/redact.py)."""
    text = LEAKS[name].replace("$S", SECRET)
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("SELECT * FROM callwarden.failed(%s, 'node:1', %s)", (job, text))
    row = await one(conn, "SELECT j.error_message, e.payload->>'error' AS logged FROM jobs j "
                          "JOIN callwarden.call_events e ON e.job_id = j.id AND e.seq = 2 "
                          "WHERE j.id = %s", job)
    assert SECRET not in row["error_message"]
    assert row["logged"] == row["error_message"]
    await clean(conn, job)


@pytest.mark.parametrize("text", [
    "upstream failed: model overloaded (status 529), retry later",
    "x" * 5000, "GET https://api.example.com/v1/run?key=k1 -> 502",
    "401: Authorization: Bearer sk-ant-abcdefgh1234",
    "caf%C3%A9 %E2%80%83 %zz 100%", "%2541 is read once", "%FF%41 is not UTF-8",
    "a%00b", "token\u2003abcdefgh12345678", "Bearer%E2%80%83abc", "password\u00a0= pw1"])
async def test_the_sql_redaction_keeps_what_python_keeps(conn: Conn, text: str) -> None:
    """The same text out of both, but for a NUL (the SQL makes it U+FFFD at once, Python's
    write path when it records it). (Where a pattern's alternatives match differently,
    PostgreSQL's longest match drops more than Python's first: the LEAKS test above holds
    both to dropping every secret.)"""
    got = await one(conn, "SELECT callwarden.safe_error(%s) AS out", text)
    assert got["out"] == safe_error(text).replace("\x00", "\ufffd")


@pytest.mark.parametrize(("cost", "result"), [
    ("Infinity", None), ("1e400", None), ("NaN", None), ("-1", None),
    (None, '{"cost": 1e400}'), (None, '{"usage": {"tokens": 1e400}}'),
    (None, '{"media_urls": [1]}'), (None, '{"raw": {"y": [1%s.5]}}' % ("0" * 310))])
async def test_a_cost_or_usage_python_could_not_read_is_refused(
        conn: Conn, cost: str | None, result: str | None) -> None:
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    with pytest.raises(psycopg.Error) as bad:
        await conn.execute("SELECT * FROM callwarden.succeeded(%s, 'node:1', '[]', NULL, "
                           "%s::numeric, %s::jsonb)", (job, cost, result))
    assert bad.value.sqlstate == "22023"
    assert (await load(conn, job)).state is CallState.CREATED  # nothing written
    await clean(conn, job)


async def test_the_hosts_own_provider_cost_stays(conn: Conn) -> None:
    """The original design's host writes provider_cost when it completes a job itself;
    recording its decision (HostEnded) keeps it, and verify accepts it."""
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("UPDATE jobs SET status = 'completed', provider_cost = 0.42 "
                       "WHERE id = %s", (job,))
    ended = await one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:1')", job)
    assert (ended["ok"], ended["state"]) == (False, "completed")
    assert (await one(conn, "SELECT provider_cost FROM jobs WHERE id = %s",
                      job))["provider_cost"] == Decimal("0.42")
    await clean(conn, job)


@pytest.mark.plain_postgres  # Citus refuses triggers on distributed tables: a host there has none
async def test_the_hosts_own_triggers_resolve_their_names_as_under_python(conn: Conn) -> None:
    """A host trigger written without schema names (as most are) fires on the functions'
    writes and finds its tables: their search_path is the host's schema (then pg_temp),
    not the empty one that would leave it 'relation does not exist'."""
    await conn.execute("""
        CREATE TABLE job_audit (job_id uuid, call_state text);
        CREATE FUNCTION job_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO job_audit VALUES (NEW.id, NEW.call_state);
            RETURN NEW;
        END $$;
        CREATE TRIGGER job_audit AFTER UPDATE ON jobs FOR EACH ROW
            EXECUTE FUNCTION job_audit();""")
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("SELECT * FROM callwarden.cancel(%s, 'user:1')", (job,))
    cur = await conn.execute("SELECT call_state FROM job_audit WHERE job_id = %s", (job,))
    assert [r["call_state"] for r in await cur.fetchall()] == ["created", "cancelled"]


# -- what the second review found (0016; each failed before it) -------------------------

OUTCOMES = {
    "succeeded": "SELECT * FROM callwarden.succeeded(%s, %s, '[]', 'hi')",
    "failed": "SELECT * FROM callwarden.failed(%s, %s, 'no')",
    "not_found": "SELECT * FROM callwarden.not_found(%s, %s)",
    "cancel": "SELECT * FROM callwarden.cancel(%s, %s)",
}
CHANGED = {  # the same actor, another outcome than it recorded: not a repeat
    "succeeded": "SELECT * FROM callwarden.succeeded(%s, %s, '[]', 'bye')",
    "failed": "SELECT * FROM callwarden.failed(%s, %s, 'another error')",
}


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
async def test_an_outcome_asked_again_after_a_lost_reply_is_the_callers_own(
        conn: Conn, outcome: str) -> None:
    """A client retries an outcome whose reply was lost: the repeat by the same actor with
    the same arguments answers ok (with the first answer's settlement word) and writes
    nothing; the same outcome from another actor, or another outcome from the same one,
    is still "the call had ended" (ok false)."""
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("SELECT * FROM callwarden.task_created(%s, %s, 'node:1')",
                       (job, f"t-{job}"))
    first = await one(conn, OUTCOMES[outcome], job, "node:1")
    again = await one(conn, OUTCOMES[outcome], job, "node:1")
    other = await one(conn, OUTCOMES[outcome], job, "node:2")
    assert first["ok"]
    assert first["settlement"] == "settled"
    assert again == first
    assert (other["ok"], other["state"]) == (False, first["state"])
    if outcome in CHANGED:
        assert (await one(conn, CHANGED[outcome], job, "node:1"))["ok"] is False
    assert len(await settled(conn, job)) == 1
    assert (await load(conn, job)).version == (5 if outcome == "succeeded" else 3)
    await clean(conn, job)


async def test_a_heartbeat_after_the_host_ended_the_job_answers_false(conn: Conn) -> None:
    """The user cancelled through the host's own SQL: the holder's next heartbeat says
    stop (docs/node.md), and the outcome it may still report records the host's word."""
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    await conn.execute("SELECT * FROM callwarden.task_created(%s, %s, 'node:1')",
                       (job, f"t-{job}"))
    beat = "SELECT callwarden.heartbeat(%s, 'node:1') AS alive"
    assert (await one(conn, beat, job))["alive"] is True
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s "
                       "AND status IN ('pending', 'processing')", (job,))
    assert (await one(conn, beat, job))["alive"] is False
    late = await one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:1')", job)
    assert (late["ok"], late["state"], late["settlement"]) == (False, "cancelled", "settled")
    assert await settled(conn, job) == [("refunded", Decimal(0))]
    await clean(conn, job)


# The functions 0016 and 0017 add to the host API.
_ADDED = "('repeated', 'apply_event', 'write_events', 'transition')"


@pytest.mark.plain_postgres  # roles and SET ROLE: the Citus stage runs as one superuser
async def test_a_runtime_granted_before_0016_may_repeat_its_outcome_after_it(
        conn: Conn) -> None:
    """A role an earlier ``callwarden grant`` made a runtime (EXECUTE on 0014's functions,
    none on the functions 0016 and 0017 add, which the outcomes now call) keeps the host
    API when they run: each grants its new functions to every role that holds it."""
    role = f"cw_rt_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role}".encode())
    try:
        await conn.execute("SELECT callwarden.grant_runtime_tables(%s::regrole)", (role,))
        await conn.execute(f"""DO $$ DECLARE f regprocedure; BEGIN
            FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                     WHERE p.pronamespace = 'callwarden'::regnamespace
                       AND p.proname NOT IN {_ADDED} LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {role}', f);
            END LOOP;
        END $$""".encode())
        for again in [m for m in available() if m.version >= 16]:
            await conn.execute(again.sql.encode())  # as migrate runs them on that database
        job = await new_job(conn)
        await conn.execute(f"SET ROLE {role}".encode())
        await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
        first = await one(conn, "SELECT * FROM callwarden.failed(%s, 'node:1', 'no')", job)
        again_ = await one(conn, "SELECT * FROM callwarden.failed(%s, 'node:1', 'no')", job)
        assert again_ == first
        assert first["ok"] is True
    finally:
        await conn.execute("RESET ROLE")
        await conn.execute(f"DROP OWNED BY {role}".encode())
        await conn.execute(f"DROP ROLE {role}".encode())


async def test_a_cancel_before_any_call_leaves_the_hosts_seed_columns_as_python_does(
        conn: Conn) -> None:
    """A job the host seeded by plain SQL (a kind, a start time, attempts, its own error
    and cost) but never started through callwarden, cancelled through the host API: the
    call never owned the seed, so the row keeps the host's values, as the Python write
    path's own row update (rendered into write_events) keeps them; the reservation is
    refunded."""
    job = await new_job(conn)
    started = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    await conn.execute(
        "UPDATE jobs SET provider_kind = 'kie-standard', provider_call_started_at = %s, "
        "reconcile_attempts = 2, reconcile_last_error = 'host retry', "
        "error_message = 'host said', provider_cost = 1.25 WHERE id = %s", (started, job))
    done = await one(conn, "SELECT * FROM callwarden.cancel(%s, 'user:1')", job)
    assert (done["ok"], done["state"], done["settlement"]) == (True, "cancelled", "settled")
    row = await one(conn, "SELECT provider_kind, provider_call_started_at, reconcile_attempts, "
                          "reconcile_last_error, error_message, provider_cost, status "
                          "FROM jobs WHERE id = %s", job)
    assert row == {"provider_kind": "kie-standard", "provider_call_started_at": started,
                   "reconcile_attempts": 2,
                   "reconcile_last_error": "host retry", "error_message": "host said",
                   "provider_cost": Decimal("1.25"), "status": "cancelled"}
    assert await settled(conn, job) == [("refunded", Decimal(0))]
    await clean(conn, job)


async def _three_reservations(conn: Conn) -> uuid.UUID:
    job = await new_job(conn, "4")
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'u1', 'reserved', 6), (%s, 'u1', 'reserved', 5)",
                       (job, job))
    return job


async def _charged(conn: Conn, job: uuid.UUID) -> list[Decimal | None]:
    cur = await conn.execute("SELECT credits_charged FROM usage_logs WHERE job_id = %s "
                             "ORDER BY id", (job,))
    return [r["credits_charged"] for r in await cur.fetchall()]


@pytest.mark.plain_postgres  # (a jobs row in a subquery is pushed to a shard on Citus)
async def test_a_completion_written_through_transition_charges_the_events_cost(
        conn: Conn) -> None:
    """The SQL write path charges what the Completed event records, as the Python write
    path does (7 over reservations of 4, 6 and 5: 4, 3, 0), whoever passes the events:
    ``transition`` has no cost of its own to get wrong (a NULL one charged all 15)."""
    now = utcnow()
    result = UpstreamResult(media_urls=("u",))
    python_job, sql_job = await _three_reservations(conn), await _three_reservations(conn)
    p = await load(conn, python_job)
    for event in (CallStarted(at=now, actor="py", kind=KIND),
                  TaskCreated(at=now, actor="py", task_id=f"t-{python_job}"),
                  UpstreamSucceeded(at=now, actor="py", result=result),
                  FinalizeClaimed(at=now, actor="py", owner="py",
                                  lease_until=now + timedelta(minutes=1)),
                  Completed(at=now, actor="py", cost=7.0)):
        appended = await append(conn, python_job, p, event)
        assert appended.ok
        p = appended.projection
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                       (sql_job, KIND))
    await conn.execute("SELECT * FROM callwarden.task_created(%s, 't-sql', 'node:1')",
                       (sql_job,))
    events = ('[{"type": "UpstreamSucceeded", "at": "2026-12-06T12:00:00Z", "actor": "node:1",'
              ' "result": {"media_urls": ["u"]}}, {"type": "FinalizeClaimed", '
              '"at": "2026-12-06T12:00:00Z", "actor": "node:1", "owner": "node:1", '
              '"lease_until": "2026-12-06T12:01:00Z"}, {"type": "Completed", '
              '"at": "2026-12-06T12:00:00Z", "actor": "node:1", "media": [], "cost": 7}]')
    done = await one(conn, "SELECT * FROM callwarden.transition("
                           "(SELECT j FROM jobs j WHERE j.id = %s FOR UPDATE), %s::jsonb)",
                     sql_job, events)
    assert (done["state"], done["settlement"]) == ("completed", "settled")
    assert await _charged(conn, python_job) == await _charged(conn, sql_job) == [
        Decimal(4), Decimal(3), Decimal(0)]


@pytest.mark.parametrize("event", [
    '{"type": "Completed", "cost": 2}',
    '{"type": "UpstreamFailed", "error": "x", "code": 5}',
    '{"type": "UpstreamFailed", "error": {"nested": true}}',
    '{"type": "Exhausted", "attempts": "3"}',
    '{"type": "Swept"}',
    '{"type": "Swept", "reason": 3}',
])
async def test_fail_call_refuses_an_event_python_could_not_read_back(
        conn: Conn, event: str) -> None:
    """``fail_call`` (what ``failed`` and ``not_found`` call; granted with the host API)
    takes only their two events, and builds each itself: nothing is written for any other
    shape, so the log stays one Python reads."""
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    with pytest.raises(psycopg.Error) as refused:
        await conn.execute("SELECT * FROM callwarden.fail_call(%s, 'node:1', %s::jsonb, 'e')",
                           (job, event))
    assert refused.value.sqlstate == "22023"
    assert await settled(conn, job) == [("reserved", None)]
    await clean(conn, job)


async def test_fail_call_records_its_own_at_and_fields_not_the_callers(conn: Conn) -> None:
    job = await new_job(conn)
    await conn.execute("SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", (job, KIND))
    done = await one(conn, "SELECT * FROM callwarden.fail_call(%s, 'node:1', %s::jsonb, 'e')",
                     job, '{"type": "UpstreamFailed", "error": "boom", "at": "1999-01-01", '
                          '"extra": 1, "actor": "someone"}')
    assert (done["ok"], done["state"], done["settlement"]) == (True, "failed", "settled")
    row = await one(conn, "SELECT payload FROM callwarden.call_events WHERE job_id = %s "
                          "AND type = 'UpstreamFailed'", job)
    assert set(row["payload"]) == {"type", "at", "actor", "error", "code"}
    assert (row["payload"]["actor"], row["payload"]["error"]) == ("node:1", "boom")
    assert not row["payload"]["at"].startswith("1999")
    await clean(conn, job)
