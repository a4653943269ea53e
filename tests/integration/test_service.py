"""The service's other faces: /metrics (scraped and parsed), /healthz, /readyz, the
admin actions (refused without the token), the dashboard's HTML (escaped), the read token
of the operator listener, and a worker's own metrics port."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from callwarden.database.db import Conn, Pool, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.types import CallStarted, Cancelled, ReconcileAttempted, TaskCreated
from callwarden.observe.metrics import record_reconcile, start_metrics_server
from callwarden.replay.verify import verify_job
from callwarden.service.app import ServiceConfig, load_listen_config
from tests.service import Listeners, running_service

TOKEN = "s3cret-admin"


def serve(pool: Pool, http: aiohttp.ClientSession, tmp_path: Path
          ) -> AbstractAsyncContextManager[Listeners]:
    return running_service(pool, tmp_path, ServiceConfig(admin_token=TOKEN))


@pytest.fixture
async def service(db_url: str, http: aiohttp.ClientSession, tmp_path: Path
                  ) -> AsyncIterator[Listeners]:
    async with open_pool(db_url, max_size=4) as pool, serve(pool, http, tmp_path) as urls:
        yield urls


@pytest.fixture
def base(service: Listeners) -> str:
    """The operator listener."""
    return service.operator


async def open_call(conn: Conn, kind: str, *, age_s: float = 0.0,
                    task_id: str | None = None) -> uuid.UUID:
    job = await create_job(conn, credits=5)
    at = datetime.now(UTC) - timedelta(seconds=age_s)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=at, actor="worker:t", kind=kind))).projection
    if task_id is not None:
        await append(conn, job, p, TaskCreated(at=at, actor="worker:t", task_id=task_id))
    return job


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[
        tuple[str, str], ...]], float]:
    async with http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_report_open_and_stale_calls_and_webhook_results(
        conn: Conn, http: aiohttp.ClientSession, service: Listeners) -> None:
    base = service.operator
    await open_call(conn, "kie-standard", age_s=3600, task_id="t-stale")   # past 10 min
    await open_call(conn, "kie-standard", age_s=5, task_id="t-fresh")
    await open_call(conn, "replicate-prediction", age_s=5)
    before = await scrape(http, f"{base}/metrics")
    async with http.post(f"{service.webhooks}/webhooks/replicate", data=b"{}") as resp:
        assert resp.status == 401  # no secret configured: refused
    samples = await scrape(http, f"{base}/metrics")
    assert samples[("callwarden_calls", (("kind", "kie-standard"), ("state", "polling")))] == 2
    assert samples[("callwarden_calls", (("kind", "replicate-prediction"),
                                         ("state", "created")))] == 1
    assert samples[("callwarden_calls_stale", (("kind", "kie-standard"),))] == 1
    assert samples[("callwarden_calls_stale", (("kind", "replicate-prediction"),))] == 0

    def grew(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        return samples.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    # Exactly the one delivery: its outcome, its latency observation, nothing else.
    assert grew("callwarden_webhook_deliveries_total", (
        ("outcome", "not_configured"), ("provider", "replicate"))) == 1
    assert grew("callwarden_webhook_handling_seconds_count", (("provider", "replicate"),)) == 1
    assert sum(v - before.get(k, 0.0) for k, v in samples.items()
               if k[0] == "callwarden_webhook_deliveries_total") == 1


async def test_admin_actions_need_the_token_and_go_through_the_write_path(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    job = await open_call(conn, "kie-standard", task_id="t-admin")
    url = f"{base}/admin/jobs/{job}"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        async with http.post(f"{url}/force-fail", headers=headers) as resp:
            assert resp.status == 403
    assert (await load(conn, job)).version == 2
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(f"{url}/requeue-reconcile", headers=auth) as resp:
        assert resp.status == 200
    async with http.post(f"{url}/force-fail", headers=auth) as resp:
        assert (resp.status, (await resp.json())["settlement"]) == (200, "settled")
    async with http.post(f"{url}/force-fail", headers=auth) as resp:
        assert resp.status == 409  # already terminal
    events = await load_events(conn, job)
    assert isinstance(events[2], ReconcileAttempted)
    assert (events[2].actor, events[2].next_attempt_at) == ("admin", None)
    assert isinstance(events[3], Cancelled)
    assert (events[3].actor, events[3].by) == ("admin", "admin")
    refund = await (await conn.execute(
        "SELECT status FROM usage_logs WHERE job_id = %s", (job,))).fetchone()
    assert refund == {"status": "refunded"}
    assert await verify_job(conn, job) == []


async def test_healthz_and_readyz_on_a_migrated_database(
        http: aiohttp.ClientSession, service: Listeners) -> None:
    for base in (service.webhooks, service.operator):
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/readyz") as resp:
            assert (resp.status, (await resp.json())["status"]) == (200, "ready")


async def test_readyz_fails_on_an_unmigrated_database(
        empty_db_url: str, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    async with open_pool(empty_db_url, max_size=2) as pool, serve(pool, http, tmp_path) as urls:
        for url in (urls.webhooks, urls.operator):
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{url}/readyz") as resp:
                body = await resp.json()
            assert (resp.status, body["status"]) == (503, "migrations pending")
            assert body["pending"][0] == "0001_host_baseline"


async def test_dashboard_pages_show_calls_and_escape_what_they_show(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    job = await open_call(conn, "kie-standard", age_s=3600, task_id="<script>x</script>")
    async with http.get(f"{base}/") as resp:
        home = await resp.text()
    assert str(job) in home  # listed as stale
    assert "<script>" not in home
    async with http.get(f"{base}/jobs", params={"q": "<script>x</script>"}) as resp:
        page = await resp.text()
    assert resp.url.path == f"/jobs/{job}"  # one match: redirected to the job's page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>" not in page
    assert "TaskCreated" in page
    async with http.get(f"{base}/jobs", params={"q": str(uuid.uuid4())}) as resp:
        assert resp.status == 404


async def test_a_worker_exposes_its_counters_on_its_own_port(
        http: aiohttp.ClientSession) -> None:
    """The port serves the process's counters live: one outcome recorded between two
    scrapes moves its sample by exactly one."""
    key = ("callwarden_reconcile_outcomes_total", (("kind", "kie-veo"), ("outcome", "finalized")))
    server, port = start_metrics_server(0)
    try:
        before = await scrape(http, f"http://127.0.0.1:{port}/metrics")
        record_reconcile("kie-veo", "finalized")
        after = await scrape(http, f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
    assert after[key] - before.get(key, 0.0) == 1


async def test_the_operator_listener_wants_the_read_token_when_one_is_set(
        conn: Conn, db_url: str, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """With a read token, every operator route but the probes wants it (a bearer header
    for scrapers and scripts, the password of HTTP Basic for a browser's prompt); the admin
    token reads too, the read token never acts."""
    job = await open_call(conn, "kie-standard", task_id="t-read")
    config = ServiceConfig(admin_token=TOKEN, read_token="reader")
    basic = "Basic " + base64.b64encode(b"anyone:reader").decode()
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path, config) as urls:
        op = urls.operator
        for path in ("/", f"/jobs/{job}", "/metrics", "/static/callwarden.css"):
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": "Basic " + base64.b64encode(b"reader:x").decode()}):
                async with http.get(op + path, headers=headers) as resp:
                    assert (path, resp.status) == (path, 401)
                    assert resp.headers["WWW-Authenticate"].startswith("Basic ")
            for headers in ({"Authorization": "Bearer reader"}, {"Authorization": basic},
                            {"Authorization": f"Bearer {TOKEN}"}):
                async with http.get(op + path, headers=headers) as resp:
                    assert (path, resp.status) == (path, 200)
        for path in ("/healthz", "/readyz"):
            async with http.get(op + path) as resp:
                assert resp.status == 200
        async with http.post(f"{op}/admin/jobs/{job}/force-fail",
                             headers={"Authorization": "Bearer reader"}) as resp:
            assert resp.status == 403
        async with http.post(f"{urls.webhooks}/webhooks/replicate", data=b"{}") as resp:
            assert resp.status == 401  # webhooks know nothing of the read token
    assert (await load(conn, job)).state == "polling"


async def test_without_a_read_token_the_operator_host_and_allowed_hosts_are_its_names(
        conn: Conn, db_url: str, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """``callwarden serve``'s names for its operator listener (``ListenConfig``: the
    operator host, here a private address, and ``allowed_hosts``), given to the app as an
    embedder would: a Host among them or loopback is served, any other gets 421 (the
    probes excepted)."""
    job = await open_call(conn, "kie-standard", task_id="t-names")
    listen = load_listen_config(None, {"CALLWARDEN_SERVE_OPERATOR_HOST": "10.0.0.5",
                                       "CALLWARDEN_SERVE_ALLOWED_HOSTS": "[FD00::1],ops"})
    config = ServiceConfig(admin_token=TOKEN, allowed_hosts=listen.operator_names)
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path, config) as urls:
        for host, status in (("10.0.0.5:8001", 200), ("10.0.0.5", 200), ("ops", 200),
                             ("[fd00:0::1]:8001", 200), ("127.0.0.1", 200),
                             ("10.0.0.6:8001", 421), ("ops.evil.example", 421),
                             ("[fd00::2]", 421)):
            async with http.get(f"{urls.operator}/jobs/{job}", headers={"Host": host}) as resp:
                assert (host, resp.status) == (host, status)
        async with http.get(f"{urls.operator}/readyz", headers={"Host": "x.example"}) as resp:
            assert resp.status == 200


async def test_the_webhook_listener_never_shows_the_database_error(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """``/readyz`` says "database unreachable" on both listeners; the database's own
    error text (hosts, ports) only on the operator's."""
    pool = open_pool("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1", wait_s=0.3)
    async with pool, running_service(pool, tmp_path, ServiceConfig(ready_timeout_s=0.3)) as urls:
        bodies = []
        for base in (urls.webhooks, urls.operator):
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                bodies.append(await resp.json())
    public, operator = bodies
    assert public["status"] == operator["status"] == "database unreachable"
    assert "detail" not in public
    assert "detail" in operator
