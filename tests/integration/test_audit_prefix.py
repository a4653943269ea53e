"""``audit`` by the start of a job's id, and read at 80 columns or piped (issue 41, item
1): a unique prefix of 4 or more hex digits names the job; a prefix several jobs share is
refused listing them (exit 2), one no job has says so (exit 1); the lookup is a range on
the primary key; piped at 80 columns every event keeps its actor, event, state, task and
detail whole — who settled the credits too."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.queries import QUERIES
from callwarden.replay.lookup import jobs_with_prefix, prefix_range
from tests.support.audit import cli, drive, new_job, run_sync
from tests.support.paths import R, W, completed_path, exhausted_path

A = uuid.UUID("abcd1234-0000-4000-8000-000000000001")
B = uuid.UUID("abcd5678-0000-4000-8000-000000000002")
LAST = uuid.UUID("ffffffff-ffff-4fff-bfff-ffffffffffff")
TASK = "task-0123456789abcdef0123456789abcdef"


async def _jobs(conn: Conn) -> None:
    for job in (A, B, LAST):
        await create_job(conn, job_id=job)
    await drive(conn, A, completed_path(task=TASK))


@pytest.fixture
def two(db_url: str) -> None:
    run_sync(db_url, _jobs)


def test_a_unique_prefix_names_the_job(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], two: None) -> None:
    for prefix in ("abcd1", "ABCD1234", "abcd1234-0000-4"):
        assert cli(db_url, monkeypatch, "audit", prefix, "--json") == 0, prefix
        assert f'"job_id":"{A}"' in capsys.readouterr().out
    assert cli(db_url, monkeypatch, "audit", "ffff") == 0
    assert f"job {LAST} has no call events" in capsys.readouterr().out


def test_a_shared_prefix_is_refused_listing_the_jobs(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        two: None) -> None:
    assert cli(db_url, monkeypatch, "audit", "abcd") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "abcd is the start of 2 job ids; give more digits" in captured.err
    assert f"{A}  kie-standard  status completed  call completed" in captured.err
    assert f"{B}  -  status pending  call -" in captured.err


def test_at_most_five_candidates_are_listed(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    async def seven(conn: Conn) -> None:
        for i in range(7):
            await create_job(conn, job_id=uuid.UUID(f"beef000{i}-0000-4000-8000-000000000000"))

    run_sync(db_url, seven)
    assert cli(db_url, monkeypatch, "audit", "beef") == 2
    err = capsys.readouterr().err
    assert "beef is the start of 5 (and more) job ids" in err
    assert err.count("status pending") == 5


def test_a_prefix_no_job_has_says_so(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], two: None) -> None:
    assert cli(db_url, monkeypatch, "audit", "abce") == 1
    assert "no job abce" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["abc", "abcz", "abcd1234-0000-4000-8000-0000000000011"])
def test_too_short_or_not_hex_is_refused_before_connecting(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from callwarden.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["audit", bad])
    assert exit_.value.code == 2
    assert "first 4 or more hex digits" in capsys.readouterr().err


def _scans(plan: dict[str, Any]) -> list[str]:
    here = [f"{plan['Node Type']} {plan.get('Index Name') or plan.get('Relation Name')}"] \
        if "Scan" in plan["Node Type"] else []
    return here + [s for child in plan.get("Plans", []) for s in _scans(child)]


async def _plan(conn: Conn, query: str, params: dict[str, Any]) -> list[str]:
    row = await (await conn.execute(f"EXPLAIN (FORMAT JSON) {query}", params)).fetchone()
    assert row is not None
    return _scans(row["QUERY PLAN"][0]["Plan"])


async def test_the_prefix_lookup_is_a_range_on_the_primary_key(conn: Conn) -> None:
    for job in (A, B, LAST):
        await create_job(conn, job_id=job)
    assert [c.id for c in await jobs_with_prefix(conn, "abcd")] == [A, B]
    assert [c.id for c in await jobs_with_prefix(conn, "ffffffff")] == [LAST]
    # the host's table, grown (a table of a few rows is read whole whatever the query)
    await conn.execute("INSERT INTO jobs (id, user_id) SELECT gen_random_uuid(), 'u' "
                       "FROM generate_series(1, 20000)")
    await conn.execute("ANALYZE jobs")
    lower, upper = prefix_range("abcd")
    scans = await _plan(conn, QUERIES["audit_job_prefix"],
                        {"lower": lower, "upper": upper, "limit": 6})
    assert scans == ["Index Scan jobs_pkey"], scans
    # the check can fail: a text match on the id reads the whole table
    like = await _plan(conn, "SELECT id FROM jobs WHERE id::text LIKE %(p)s", {"p": "abcd%"})
    assert like == ["Seq Scan jobs"], like


def test_audit_at_80_columns_piped_keeps_every_event_whole(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    done = run_sync(db_url, lambda c: new_job(c, completed_path(task=TASK, cost=4.0)))
    refunded = run_sync(db_url, lambda c: new_job(c, exhausted_path(task=TASK)))
    monkeypatch.setenv("COLUMNS", "80")
    assert cli(db_url, monkeypatch, "audit", str(done)) == 0
    out = capsys.readouterr().out
    assert f"committed, priced 4 (at most the reservation) by {W}" in out, out
    assert TASK in out, out
    lines = out.splitlines()
    for event, state in (("CallStarted", "created"), ("TaskCreated", "polling"),
                         ("UpstreamSucceeded", "upstream_succeeded"),
                         ("FinalizeClaimed", "finalizing"), ("Completed", "completed")):
        assert any(W in ln and f"{event} → {state}" in ln for ln in lines), (event, out)
    assert f"task {TASK}" in out
    assert "1 media stored" in out
    assert "reservation: committed (10 reserved, charged 4;" in out
    assert "┃" not in out
    assert "│" not in out
    assert cli(db_url, monkeypatch, "audit", str(refunded)) == 0
    out = capsys.readouterr().out
    assert f"refunded by {R} · timeout · after 2 attempts" in out
    assert "tries 2" in out
