"""The staleness rule is written three times — ``StaleRule.is_stale`` in Python (the
reconciler's decision), the ``stale_rule`` fragment the engine's statements splice in (the
claim, ``/metrics``, the dashboard, ``stats``: engine/database/reconcile.sql) and the
function ``callwarden.callwarden_is_stale`` (migration 0011, for SQL callers) — and this
proves the three are one rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from callwarden.database.queries import _load_all
from callwarden.providers.kinds import KINDS
from callwarden.rules.stale import StaleRule

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SQL = """SELECT callwarden.callwarden_is_stale(
    %(call)s, %(host)s, %(created)s, %(heartbeat)s, %(kind)s, %(stale_thresholds)s::jsonb,
    %(stale_legacy_s)s::float8, %(stale_heartbeat_s)s::float8, %(now)s::timestamptz) AS s"""
FRAGMENT = ("SELECT " + _load_all()[1]["stale_rule"] + " AS s FROM (SELECT "
            "%(call)s::timestamptz AS provider_call_started_at, %(host)s::timestamptz AS "
            "started_at, %(created)s::timestamptz AS created_at, %(heartbeat)s::timestamptz "
            "AS heartbeat_at, %(kind)s::text AS provider_kind) j")

seconds = st.integers(1, 7_200_000).map(lambda ms: ms / 1000)  # thresholds: ms precision
rules = st.builds(StaleRule,
                  thresholds=st.dictionaries(st.sampled_from(sorted(KINDS)), seconds),
                  legacy_threshold_s=seconds, heartbeat_timeout_s=seconds)
kinds = st.none() | st.sampled_from([*sorted(KINDS), "a-kind-from-the-future"])


Row = tuple[str | None, datetime | None, datetime | None, datetime | None, datetime | None]


@st.composite
def moment(draw: st.DrawFn, boundaries: list[float]) -> datetime | None:
    """Absent, or some age before NOW: anywhere, or exactly one of ``boundaries`` nudged
    by at most a microsecond (so every threshold's edge gets hit)."""
    base = draw(st.none() | st.sampled_from(boundaries) | seconds)
    if base is None:
        return None
    nudge = timedelta(microseconds=draw(st.sampled_from([-1, 0, 1])))
    return NOW - timedelta(seconds=base) + nudge


@st.composite
def row(draw: st.DrawFn, rule: StaleRule) -> Row:
    kind = draw(kinds)
    edges = [rule.threshold_for(kind), rule.legacy_threshold_s, rule.heartbeat_timeout_s]
    return (kind, draw(moment(edges)), draw(moment(edges)), draw(moment(edges)),
            draw(st.none() | moment(edges)))


@st.composite
def cases(draw: st.DrawFn) -> tuple[StaleRule, list[Row]]:
    rule = draw(rules)
    return rule, draw(st.lists(row(rule), min_size=1, max_size=12))


# Cheap examples (one SELECT per row): five times the profile's, at least 200.
@settings(max_examples=max(200, 5 * settings().max_examples))
@given(case=cases())
def test_sql_and_python_stale_rules_agree(
        db_url: str, case: tuple[StaleRule, list[Row]]) -> None:
    """For every row (any kind, known, unknown or none; any of call start, host start,
    created and heartbeat present or absent, at any age, on or a microsecond either side
    of any threshold) and every configured rule, the ``stale_rule`` fragment and the
    function ``callwarden_is_stale`` in Postgres answer exactly what ``StaleRule.is_stale``
    answers."""
    rule, rows = case
    with psycopg.connect(db_url) as conn:
        for kind, call, host, created, heartbeat in rows:
            params = {**rule.sql_params(NOW), "call": call, "host": host,
                      "created": created, "heartbeat": heartbeat, "kind": kind}
            want = rule.is_stale(now=NOW, kind=kind, call_started_at=call,
                                 heartbeat_at=heartbeat, host_started_at=host,
                                 created_at=created)
            for sql in (SQL, FRAGMENT):
                got = conn.execute(sql.encode(), params).fetchone()
                assert got is not None
                assert got[0] is want, (sql[:40], kind, call, host, created, heartbeat)
