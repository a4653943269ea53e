"""The dashboard's queries are served by indexes at scale: 1,000,000 jobs, about 1,000,000
call_events and 1,000,000 usage_logs rows (bench/dashboard.sql, set-based), analysed and
vacuumed; then no plan of an overview or call-list query (every window, every filter, a
later page, a job page, a bulk action's preview and refund read-back, the jobs waiting for
a provider account's slot and their counts per account, with 1,000 of them) has a
sequential scan of jobs, call_events or usage_logs — for the parameters given (the custom
plan) and for any parameters (the generic plan a prepared statement may switch to)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import AsyncClientCursor
from psycopg.rows import dict_row

from callwarden.database.db import Conn
from callwarden.database.queries import QUERIES, load_queries
from callwarden.reconciler.config import ReconcileConfig
from callwarden.service.dashboard.calls import Filters, sql_params
from callwarden.service.dashboard.overview import OPEN_STATES, ORIGIN, TERMINAL, WINDOWS
from callwarden.service.dashboard.rollup import QUERIES as ROLLED

ROWS = int(os.environ.get("CALLWARDEN_DASHBOARD_ROWS", "1000000"))
LOAD = load_queries((Path(__file__).parents[2] / "bench" / "dashboard.sql")
                    .read_text(encoding="utf-8"))
TABLES = {"jobs", "call_events", "usage_logs", "assets"}


def seq_scans(plan: dict[str, Any]) -> Iterator[str]:
    """The tables of TABLES a plan (EXPLAIN's JSON) reads with a sequential scan."""
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in TABLES:
        yield str(plan["Relation Name"])
    for child in plan.get("Plans", []):
        yield from seq_scans(child)


def scans(plan: dict[str, Any]) -> Iterator[str]:
    """Every scan of a plan as ``"<node type> <relation or index>"``."""
    if "Scan" in str(plan.get("Node Type")):
        yield f"{plan['Node Type']} {plan.get('Index Name') or plan.get('Relation Name')}"
    for child in plan.get("Plans", []):
        yield from scans(child)


def generic(query: str) -> tuple[str, list[str]]:
    """``query`` with its named parameters as ``$n``, and the names in that order."""
    names: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        return f"${names.setdefault(m[1], len(names) + 1)}"
    return re.sub(r"%\((\w+)\)s", number, query), list(names)


async def plan(conn: Conn, name: str, params: dict[str, Any]) -> dict[str, Any]:
    cur = await conn.execute(f"EXPLAIN (FORMAT JSON) {QUERIES[name]}", params)
    row = await cur.fetchone()
    assert row is not None
    return dict(row["QUERY PLAN"][0]["Plan"])


async def generic_plan(conn: Conn, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan a prepared statement of ``name`` uses once it goes generic (the values
    bound by the client: EXECUTE's arguments take no server-side parameters)."""
    text, names = generic(QUERIES[name])
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        await conn.execute(f"PREPARE dash_plan AS {text}")
        args = ", ".join(f"%({n})s" for n in names)
        cur = AsyncClientCursor(conn, row_factory=dict_row)
        await cur.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE dash_plan{f'({args})' if names else ''}", params)
        row = await cur.fetchone()
    finally:
        await conn.execute("DEALLOCATE dash_plan")
        await conn.execute("RESET plan_cache_mode")
    assert row is not None
    return dict(row["QUERY PLAN"][0]["Plan"])


@pytest.fixture
async def million(conn: Conn) -> tuple[uuid.UUID, datetime]:
    for name in ("load_jobs", "load_call_events", "load_usage_logs"):
        await conn.execute(LOAD[name], {"rows": ROWS, "open": 200})
    await conn.execute(LOAD["load_assets"])
    # jobs waiting for a slot (callwarden.waiting is small: each row reaches its job by
    # the primary key)
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight) "
                       "VALUES ('kie-main', ARRAY['kie-standard'], 1)")
    await conn.execute("INSERT INTO callwarden.waiting (job_id, account, reason, retry_at) "
                       "SELECT id, 'kie-main', 'kie-main: 1 of 1 calls in flight', "
                       "now() + interval '2 s' FROM jobs ORDER BY id LIMIT 1000")
    await conn.execute("VACUUM ANALYZE jobs, callwarden.call_events, usage_logs, assets, "
                       "callwarden.waiting, callwarden.limits")
    counts = await (await conn.execute(
        "SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM "
        "callwarden.call_events) AS "
        "events, (SELECT count(*) FROM usage_logs) AS usage")).fetchone()
    assert counts is not None
    assert (counts["jobs"], counts["usage"]) == (ROWS, ROWS)
    assert ROWS - 100 <= counts["events"] <= ROWS  # every other job's two; 100 open: one
    row = await (await conn.execute(
        "SELECT id, provider_call_started_at AS at FROM jobs ORDER BY "
        "provider_call_started_at DESC, id DESC OFFSET 5000 LIMIT 1")).fetchone()
    assert row is not None
    return row["id"], row["at"]


def cases(job: uuid.UUID, at: datetime, now: datetime) -> list[tuple[str, dict[str, Any]]]:
    stale = ReconcileConfig().stale.sql_params(now)
    out: list[tuple[str, dict[str, Any]]] = [
        ("metrics_open_calls", {}), ("metrics_stale_calls", stale),
        ("dashboard_stale_calls", {**stale, "limit": 50}),
        ("dashboard_recent_outcomes", {"since": now - timedelta(days=1),
                                       "types": ["Exhausted"], "limit": 20}),
        ("dashboard_recent_outcomes", {"since": now - timedelta(days=1),
                                       "types": list(TERMINAL), "limit": 30}),
        ("dashboard_search", {"job_id": job, "task_id": str(job)}),
        ("dashboard_search", {"job_id": None, "task_id": "task-4242"}),
        ("dashboard_job_events", {"job_id": job}), ("dashboard_ledger", {"job_id": job}),
        # the job page's what went in and what came out: its row, its stored files
        ("dashboard_job_io", {"job_id": job}), ("dashboard_job_assets", {"job_id": job}),
        ("audit_job", {"job_id": job}), ("load_events", {"job_id": job}),
        # a bulk admin action: its preview's jobs (up to 500 ids), a run's refund read-back
        ("dashboard_bulk_jobs", {"ids": [job, *(uuid.uuid4() for _ in range(499))]}),
        ("dashboard_refunded_by", {"job_id": job, "seq": 2})]
    for w in WINDOWS.values():
        starts = w.starts(now)
        for label, since, until in ((f"{w.name}, closed buckets", starts[0], starts[-1]),
                                    (f"{w.name}, open bucket", starts[-1], None)):
            span = {"since": since, "until": until, "bucket": w.bucket, "origin": ORIGIN,
                    "window": label}
            out += [(name, dict(span)) for name in ROLLED]
    for f in (Filters(), Filters(kind="kie-veo"), Filters(state="failed"),
              Filters(actor="admin"), Filters(error="content_policy 100%"),
              Filters(start=at - timedelta(hours=2), end=at),
              Filters(kind="kie-standard", state="completed", cursor=(at, job))):
        out.append(("dashboard_list_calls", sql_params(f)))
    # the jobs waiting for a slot: the /waiting page and `jobs --state waiting` (a user, a
    # kind, an age range), the overview's card and /metrics
    waiting = {"user_id": None, "kind": None, "from": None, "to": None, "limit": 201}
    out += [("dashboard_waiting", waiting),
            ("dashboard_waiting", {**waiting, "user_id": "user-7", "kind": "kie-standard",
                                   "from": now - timedelta(days=1), "to": now}),
            ("metrics_waiting", {}), ("limits_show", {"now": now})]
    # `callwarden jobs`: several states (--state open), an age range, a user
    for f, extra in ((Filters(end=at), {"states": list(OPEN_STATES)}),
                     (Filters(start=at - timedelta(days=1), end=at),
                      {"states": ["failed", "swept"]}),
                     (Filters(), {"user_id": "user-7"})):
        out.append(("dashboard_list_calls", {**sql_params(f), **extra}))
    return out


@pytest.mark.slow
async def test_no_overview_or_list_query_scans_a_big_table(
        conn: Conn, million: tuple[uuid.UUID, datetime]) -> None:
    job, at = million
    now = datetime.now(at.tzinfo)
    found, used = {}, {}
    for name, params in cases(job, at, now):
        window = params.pop("window", None)  # not a parameter: names the case
        key = f"{name} {sorted(k for k, v in params.items() if v is not None)}" + (
            f" {window}" if window else "")
        custom, prepared = await plan(conn, name, params), await generic_plan(conn, name, params)
        found[key] = list(seq_scans(custom))
        found[f"{key} generic"] = list(seq_scans(prepared))
        used[key] = sorted(set(scans(custom)))
    print("\n".join(f"{k}: {', '.join(v)}" for k, v in used.items()))  # the report's table
    assert {k: v for k, v in found.items() if v} == {}
    # the aggregates over a window read their index alone (no heap, no scan of the rest)
    for name in ROLLED:
        assert all(any(s.startswith("Index Only Scan") for s in v)
                   for k, v in used.items() if k.startswith(name)), name


async def test_the_check_sees_a_sequential_scan(conn: Conn) -> None:
    """On a query no index serves (a count of every job), the walk reports the scan."""
    cur = await conn.execute("EXPLAIN (FORMAT JSON) SELECT count(*) FROM jobs "
                             "WHERE user_id = 'x'")
    row = await cur.fetchone()
    assert row is not None
    assert list(seq_scans(row["QUERY PLAN"][0]["Plan"])) == ["jobs"]
