"""The stale rows are written twice in SQL: ``callwarden_stale_jobs`` (migration 0008, the
function a host may call) and the ``stale_jobs`` fragment that ``/metrics``, the dashboard
and ``stats`` splice in (a subquery, because Citus refuses a parameterized call of a SQL
function over a distributed table). This proves the two select the same rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from callwarden.database.queries import QUERIES
from callwarden.providers.kinds import KINDS
from callwarden.rules.stale import StaleRule

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
STATES = [None, "created", "polling", "upstream_succeeded", "finalizing", "completed",
          "failed", "swept"]
STATUSES = ["pending", "processing", "completed", "failed"]
FUNCTION = """SELECT id FROM callwarden.callwarden_stale_jobs(%(stale_thresholds)s::jsonb,
    %(stale_legacy_s)s::float8, %(stale_heartbeat_s)s::float8, %(now)s::timestamptz)"""

ages = st.none() | st.integers(0, 20_000).map(lambda s: NOW - timedelta(seconds=s))
rows = st.tuples(st.sampled_from(STATES), st.sampled_from(STATUSES),
                 st.none() | st.sampled_from([*sorted(KINDS)[:4], "a-kind-from-the-future"]),
                 ages, ages, ages)
rules = st.builds(StaleRule, thresholds=st.dictionaries(st.sampled_from(sorted(KINDS)[:4]),
                                                        st.integers(1, 10_000)),
                  legacy_threshold_s=st.integers(1, 10_000),
                  heartbeat_timeout_s=st.integers(1, 10_000))


@settings(max_examples=max(40, settings().max_examples))
@given(rule=rules, jobs=st.lists(rows, min_size=1, max_size=10))
def test_the_fragment_and_the_function_select_the_same_stale_rows(
        db_url: str, rule: StaleRule,
        jobs: list[tuple[str | None, str, str | None, datetime | None, datetime | None,
                         datetime | None]]) -> None:
    """For any rows (any call state or none, any host status, a known, unknown or absent
    kind, call start, host start and heartbeat present or not at any age) and any rule,
    the ids ``metrics_stale_calls``' fragment selects are exactly the function's, and the
    three queries that splice it count them alike."""
    params = {**rule.sql_params(NOW), "limit": 100}
    with psycopg.connect(db_url) as conn:
        conn.execute("DELETE FROM jobs")
        for state, status, kind, call, host, beat in jobs:
            conn.execute(
                "INSERT INTO jobs (id, user_id, status, call_state, provider_kind, "
                "provider_call_started_at, started_at, heartbeat_at, created_at) "
                "VALUES (%s, 'u', %s, %s, %s, %s, %s, %s, %s)",
                (uuid.uuid4(), status, state, kind, call, host, beat,
                 NOW - timedelta(seconds=30_000)))
        expected = sorted(r[0] for r in conn.execute(FUNCTION, params).fetchall())
        listed = sorted(r[0] for r in conn.execute(QUERIES["dashboard_stale_calls"],
                                                   params).fetchall())
        counted = sum(r[1] for r in conn.execute(QUERIES["metrics_stale_calls"],
                                                 params).fetchall())
        stats = sum(r[1] for r in conn.execute(QUERIES["audit_stats_stale"],
                                               params).fetchall())
        conn.rollback()
    assert listed == expected
    assert counted == stats == len(expected)
