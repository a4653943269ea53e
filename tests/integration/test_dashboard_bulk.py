"""Bulk admin actions over real HTTP on a real database (issue 41, item 3): the preview
counts only the calls the action is legal for and the credits they hold reserved, and
writes nothing; the confirmed run is one transition through the log per job, refunds each
reservation exactly once, and skips (never forces) a call whose state changed since the
preview; the endpoint wants the admin token, refuses everything when admin is disabled,
and bounds a bulk action to 500 jobs. The host's rows (``jobs``, ``usage_logs``) are
inserted with plain SQL, as a host writes them; the calls' histories go through the write
path."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.database.db import Conn, open_pool
from callwarden.database.write import append, load, transition
from callwarden.events.types import (
    CallStarted,
    ReconcileAttempted,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.replay.verify import verify_job
from callwarden.service.app import ServiceConfig
from callwarden.service.dashboard import bulk
from tests.service import running_service

TOKEN = "bulk-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def base(db_url: str, tmp_path: Path) -> AsyncIterator[str]:
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path, ServiceConfig(admin_token=TOKEN)) as urls:
        yield urls.operator


async def host_job(conn: Conn, reserved: list[int], *, kind: str | None = "kie-standard",
                   age_s: float = 60.0, end: bool = False) -> uuid.UUID:
    """A job and its reservations as the host inserts them (plain SQL); with ``kind``, a
    call started and polling (through the write path); with ``end``, completed by the
    host's own hand (a terminal call)."""
    job = uuid.uuid4()
    await conn.execute("INSERT INTO jobs (id, user_id, status) VALUES (%s, 'user-1', "
                       "'pending')", (job,))
    for credits in reserved:
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)"
                           " VALUES (%s, 'user-1', 'reserved', %s)", (job, credits))
    if kind is not None:
        at = datetime.now(UTC) - timedelta(seconds=age_s)
        p = (await append(conn, job, await load(conn, job), CallStarted(
            at=at, actor="worker:w1", kind=kind))).projection
        await append(conn, job, p, TaskCreated(at=at + timedelta(seconds=1), actor="worker:w1",
                                               task_id=f"t-{job}"))
    if end:
        await conn.execute("UPDATE jobs SET status = 'failed' WHERE id = %s", (job,))
        ended = await transition(conn, job, lambda p: ReconcileAttempted(
            at=datetime.now(UTC), actor="reconciler:r1", outcome="still_running"))
        assert ended.host_ended  # the host's decision wins: HostEnded, the call failed
    return job


async def post(http: aiohttp.ClientSession, url: str, body: object,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with http.post(url, json=body, headers=AUTH if headers is None else headers) as r:
        return r.status, (await r.json() if r.content_type == "application/json"
                          else await r.text())


async def ledger(conn: Conn, job: uuid.UUID) -> list[tuple[str, int | None]]:
    rows = await (await conn.execute(
        "SELECT status, settled_by_seq FROM usage_logs WHERE job_id = %s ORDER BY id",
        (job,))).fetchall()
    return [(r["status"], r["settled_by_seq"]) for r in rows]


async def events(conn: Conn, job: uuid.UUID) -> list[tuple[int, str, str]]:
    rows = await (await conn.execute(
        "SELECT seq, type, actor FROM callwarden.call_events WHERE job_id = %s ORDER BY seq",
        (job,))).fetchall()
    return [(r["seq"], r["type"], r["actor"]) for r in rows]


async def test_the_preview_counts_legal_calls_and_reserved_credits_and_writes_nothing(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    """A selection of two open calls (3 + 2 and 4 credits reserved), a job whose call
    never started (1 credit), one the host ended and an id no job has: force-fail would
    move 3 calls and 10 credits, a requeue 2 calls and no credit (9 stay reserved), each
    naming what it leaves out; a filter counts only the calls it matches for which the
    action is legal. Nothing is written."""
    a = await host_job(conn, [3, 2])
    b = await host_job(conn, [4], kind="kie-veo")
    never = await host_job(conn, [1], kind=None)
    ended = await host_job(conn, [5], end=True)
    ghost = uuid.uuid4()
    before = {j: (await events(conn, j), await ledger(conn, j)) for j in (a, b, never, ended)}
    selection = {"job_ids": [str(j) for j in (a, b, never, ended, ghost, a)]}

    status, ff = await post(http, f"{base}/admin/bulk/force-fail", selection)
    assert status == 200, ff
    assert (ff["dry_run"], ff["calls"], ff["credits"], ff["limit"]) == (True, 3, 10.0, 500)
    assert {j["id"]: (j["call_state"], j["credits"]) for j in ff["jobs"]} == {
        str(a): ("polling", 5.0), str(b): ("polling", 4.0), str(never): (None, 1.0)}
    assert {s["id"]: s["reason"] for s in ff["not_eligible"]} == {
        str(ended): "not legal in its state (failed)", str(ghost): "no such job"}
    assert ff["summary"].startswith("3 calls, 10 credits: cancel them")

    status, rq = await post(http, f"{base}/admin/bulk/requeue-reconcile", selection)
    assert status == 200, rq
    assert (rq["calls"], rq["credits"], rq["credits_reserved"]) == (2, 0.0, 9.0)
    assert {j["id"] for j in rq["jobs"]} == {str(a), str(b)}
    assert {s["id"]: s["reason"] for s in rq["not_eligible"]}[str(never)] \
        == "no call to requeue (it never started)"
    assert rq["summary"].startswith("2 calls, 0 credits:")
    assert "the 9 credits reserved stay reserved" in rq["summary"]

    for flt, expect in (({"kind": "kie-veo"}, [b]), ({}, [b, a]),
                        ({"state": "failed"}, []), ({"state": "polling", "kind": "kie-standard"},
                                                    [a])):
        status, got = await post(http, f"{base}/admin/bulk/force-fail", {"filter": flt})
        assert (flt, status, [j["id"] for j in got["jobs"]]) \
            == (flt, 200, [str(j) for j in expect])  # newest call start first
        assert got["credits"] == sum(j["credits"] for j in got["jobs"])
    malformed: list[dict[str, Any]] = [
        {"filter": {"stat": "polling"}}, {"filter": {"state": "nope"}},
        {"job_ids": ["not-a-uuid"]}, {"job_ids": [str(a)], "filter": {}}, {},
        {"confirm": [], "filter": {}}, {"job_ids": [], "extra": 1}]
    for bad in malformed:
        status, text = await post(http, f"{base}/admin/bulk/force-fail", bad)
        assert (bad, status) == (bad, 400), text
    assert {j: (await events(conn, j), await ledger(conn, j))
            for j in (a, b, never, ended)} == before


async def test_the_run_is_one_transition_per_job_and_refunds_exactly_once(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    """The confirmed force-fail appends one ``Cancelled`` by admin per job to
    ``callwarden.call_events``, refunds each reservation in that event's transaction (its
    ``settled_by_seq``) and says how many credits; confirming the same preview again
    applies nothing, refunds nothing and leaves each row refunded once."""
    a = await host_job(conn, [3, 2])
    b = await host_job(conn, [4])
    url = f"{base}/admin/bulk/force-fail"
    _, plan = await post(http, url, {"job_ids": [str(a), str(b)]})
    status, done = await post(http, url, {"confirm": plan["jobs"]})
    assert status == 200, done
    assert (done["dry_run"], done["applied"], done["skipped"], done["credits_refunded"]) \
        == (False, 2, 0, 9.0)
    for job in (a, b):
        assert (await events(conn, job))[2:] == [(3, "Cancelled", "admin")]
        assert (await load(conn, job)).settlement == "refunded"
        assert all(row == ("refunded", 3) for row in await ledger(conn, job))
        assert await verify_job(conn, job) == []

    status, again = await post(http, url, {"confirm": plan["jobs"]})
    assert (status, again["applied"], again["credits_refunded"]) == (200, 0, 0.0)
    assert {s["id"]: s["reason"] for s in again["skips"]} == {
        str(a): "changed since the preview (polling -> cancelled)",
        str(b): "changed since the preview (polling -> cancelled)"}
    for job in (a, b):
        assert [e[1] for e in await events(conn, job)].count("Cancelled") == 1
        assert all(row == ("refunded", 3) for row in await ledger(conn, job))
    refunded = await (await conn.execute(
        "SELECT count(*) AS n, sum(credits_reserved) AS c FROM usage_logs "
        "WHERE job_id = ANY(%s) AND status = 'refunded'", ([a, b],))).fetchone()
    assert refunded is not None
    assert (refunded["n"], refunded["c"]) == (3, 9)


async def test_a_call_that_moved_since_the_preview_is_skipped_never_forced(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    """Between the preview and the confirmation one call's result arrives (polling ->
    upstream_succeeded: a state force-fail is still legal in) and another is polled again
    (an event, the same state): the first is skipped and keeps its reservation, the
    second is force-failed. A requeue confirmed for a call that ended meanwhile is skipped
    the same way."""
    moved = await host_job(conn, [4])
    polled = await host_job(conn, [2])
    url = f"{base}/admin/bulk/force-fail"
    _, plan = await post(http, url, {"filter": {}})
    assert {j["id"] for j in plan["jobs"]} == {str(moved), str(polled)}
    now = datetime.now(UTC)
    await append(conn, moved, await load(conn, moved), UpstreamSucceeded(
        at=now, actor="webhook", result=UpstreamResult(text="done")))
    await append(conn, polled, await load(conn, polled), ReconcileAttempted(
        at=now, actor="reconciler:r1", outcome="still_running"))
    status, done = await post(http, url, {"confirm": plan["jobs"]})
    assert status == 200, done
    assert (done["applied"], done["skipped"], done["credits_refunded"]) == (1, 1, 2.0)
    assert done["skips"] == [{"id": str(moved), "reason": "changed since the preview "
                                                         "(polling -> upstream_succeeded)"}]
    assert (await load(conn, moved)).state == "upstream_succeeded"
    assert await ledger(conn, moved) == [("reserved", None)]
    assert (await load(conn, polled)).state == "cancelled"

    _, requeue = await post(http, f"{base}/admin/bulk/requeue-reconcile",
                            {"job_ids": [str(moved)]})
    await append(conn, moved, await load(conn, moved), ReconcileAttempted(
        at=datetime.now(UTC), actor="reconciler:r1", outcome="still_running"))
    status, done = await post(http, f"{base}/admin/bulk/requeue-reconcile",
                              {"confirm": requeue["jobs"]})
    assert (done["applied"], done["skipped"]) == (1, 0)  # the same state: applied
    assert (await events(conn, moved))[-1][1:] == ("ReconcileAttempted", "admin")


async def test_bulk_actions_want_the_admin_token_and_an_enabled_admin(
        conn: Conn, db_url: str, http: aiohttp.ClientSession, base: str,
        tmp_path: Path) -> None:
    """Without the token, with a wrong one or from another site: 403 for the preview and
    the run alike, the call unchanged; a service with no admin token refuses them all
    (read-only) and its call list offers no checkbox or bulk panel, while the admin one
    does, each row naming the actions its state allows."""
    job = await host_job(conn, [3])
    ended = await host_job(conn, [1], end=True)
    url = f"{base}/admin/bulk/force-fail"
    confirm = {"confirm": [{"id": str(job), "call_state": "polling"}]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {**AUTH, "Sec-Fetch-Site": "cross-site"},
                    {**AUTH, "Origin": "https://evil.example"}):
        for body in ({"job_ids": [str(job)]}, confirm):
            status, _ = await post(http, url, body, headers)
            assert (headers, status) == (headers, 403)
    assert (await load(conn, job)).version == 2
    async with http.get(f"{base}/jobs") as resp:
        page = await resp.text()
    assert 'id="bulk"' in page
    boxes = dict(re.findall(r'class="pick-row" value="([0-9a-f-]{36})" '
                            r'data-actions="([^"]*)"', page))
    assert boxes == {str(job): "force-fail requeue-reconcile", str(ended): ""}

    async with open_pool(db_url, max_size=2) as pool, running_service(
            pool, tmp_path / "ro", ServiceConfig()) as urls:
        for headers in ({}, AUTH):
            for body in ({"job_ids": [str(job)]}, confirm):
                status, _ = await post(http, f"{urls.operator}/admin/bulk/force-fail", body,
                                       headers)
                assert status == 403
        async with http.get(f"{urls.operator}/jobs") as resp:
            page = await resp.text()
        assert str(job) in page
        assert "pick-row" not in page
        assert 'id="bulk"' not in page
    assert (await load(conn, job)).version == 2
    assert await ledger(conn, job) == [("reserved", None)]


async def test_a_bulk_action_is_bounded(
        conn: Conn, http: aiohttp.ClientSession, base: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A selection or a run of more than 500 jobs is refused (413) before anything is
    read or written; a filter matching more calls than the bound takes the newest ones
    up to it and says so (shown with a bound of 2, the service in this process)."""
    many = [str(uuid.uuid4()) for _ in range(501)]
    status, text = await post(http, f"{base}/admin/bulk/force-fail", {"job_ids": many})
    assert status == 413
    assert "at most 500" in text
    status, text = await post(http, f"{base}/admin/bulk/requeue-reconcile", {
        "confirm": [{"id": j, "call_state": "polling"} for j in many]})
    assert status == 413
    status, _ = await post(http, f"{base}/admin/bulk/reboot", {"job_ids": []})
    assert status == 404

    jobs = [await host_job(conn, [1], age_s=60 - i) for i in range(3)]  # jobs[2] newest
    monkeypatch.setattr(bulk, "LIMIT", 2)
    status, got = await post(http, f"{base}/admin/bulk/force-fail", {"filter": {}})
    assert status == 200, got
    assert (got["calls"], got["truncated"], got["limit"]) == (2, True, 2)
    assert [j["id"] for j in got["jobs"]] == [str(jobs[2]), str(jobs[1])]
    assert "Only the newest 2 matching calls" in got["summary"]
