"""What a provider hands back is not trusted (issue 11): results that can never be stored
end at once, media comes only from where the provider keeps it, costs are never negative
or above what was reserved, and an internal marker cannot be forged by a provider.

Real Postgres, the simulator over HTTP (its scripts make the hostile results), a canary
HTTP server on another loopback address standing for an internal service.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.pricing import Rate, RateTable
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.types import CallStarted, FinalizeClaimed, UpstreamResult, UpstreamSucceeded
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeRunner
from tests.support import no_sleep
from tests.support.calls import dead_worker_call, row, upstream_task

LLM = {"model": "claude-sonnet-4-6", "max_tokens": 16,
       "messages": [{"role": "user", "content": "hi"}]}


def kie(script: dict[str, Any]) -> dict[str, Any]:
    return {"model": "nano-banana-pro", "input": {"prompt": "x", "_sim": {
        "steps": [], "end": "succeeded", **script}}}


async def events_of(conn: Conn, job: uuid.UUID) -> list[str]:
    return [type(e).__name__ for e in await load_events(conn, job)]


async def error_code(conn: Conn, job: uuid.UUID) -> str:
    failed = [e for e in await load_events(conn, job) if type(e).__name__ == "UpstreamFailed"]
    assert failed, await events_of(conn, job)
    return str(getattr(failed[-1], "code", None))


@dataclass
class Canary:
    """An 'internal service' on 127.0.0.2: counts every request that reaches it."""

    url: str
    hits: list[str]


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    hits: list[str] = []

    async def secret(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=b"\x89PNG\r\n\x1a\nsecret-metadata", content_type="image/png")

    app = web.Application()
    app.router.add_get("/{tail:.*}", secret)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    try:
        yield Canary(url=f"http://127.0.0.2:{runner.addresses[0][1]}", hits=hits)
    finally:
        await runner.cleanup()


# -- 2. a finalization that can never succeed ends -------------------------------------------

@pytest.mark.parametrize(("script", "config"), [
    ({"media_body": "html"}, {}),  # an HTML error page where an image is expected
    ({}, {"media_max_bytes": 100}),  # larger than allowed
    ({"media_status": 400}, {}),  # a 4xx that will not change
    ({"result_urls": ["data:image/png;base64,!!not-base64!!"]}, {}),  # a data: URI
], ids=["html", "too-large", "http-400", "bad-data-uri"])
async def test_result_that_can_never_be_stored_fails_and_refunds_at_once(
        conn: Conn, make_runner: MakeRunner, script: dict[str, Any],
        config: dict[str, Any]) -> None:
    job = await create_job(conn, credits=10)
    out = await make_runner(**config).run(job, "kie-standard", kie(script))
    assert out.result == "failed"
    r = await row(conn, job)
    assert (r["status"], r["credits"], r["credits_charged"], r["assets"]) == (
        "failed", "refunded", 0, 0)
    assert await error_code(conn, job) == "media_unusable"
    assert "FinalizeFailed" not in await events_of(conn, job)  # not retried: it would not help
    assert await verify_job(conn, job) == []


async def test_storage_that_keeps_refusing_ends_exhausted_at_the_cap(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    """Storage errors are transient: each one counts towards the cap, then the call ends
    exhausted and refunded — never open forever with credits reserved."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the media folder should be")
    reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(blocked),
                            config=ReconcileConfig(attempt_cap=2, repoll_interval_s=3000),
                            sleep=no_sleep)
    task = await upstream_task(http, sim, "kie-standard", {"steps": [], "end": "succeeded"})
    job = await dead_worker_call(conn, "kie-standard", task, age=timedelta(minutes=11))
    now = utcnow()
    outcomes = []
    for i in range(4):  # one pass per re-poll interval
        counts = await reconciler.reconcile_once(now + timedelta(seconds=3001 * i))
        outcomes.append((counts.errors, counts.exhausted))
    assert outcomes[:3] == [(1, 0), (1, 0), (0, 1)]
    r = await row(conn, job)
    assert (r["call_state"], r["credits"], r["reconcile_attempts"]) == (
        "exhausted", "refunded", 2)
    assert (await events_of(conn, job)).count("FinalizeFailed") == 2
    assert await verify_job(conn, job) == []


# -- 3. no server-side request forgery -------------------------------------------------------

async def test_result_url_on_a_foreign_or_internal_host_is_refused_unfetched(
        conn: Conn, make_runner: MakeRunner, canary: Canary) -> None:
    for url in ("https://evil.example/x.png", f"{canary.url}/latest/meta-data/",
                "http://169.254.169.254/latest/meta-data/iam", "file:///etc/passwd"):
        job = await create_job(conn, credits=10)
        out = await make_runner().run(job, "kie-standard", kie({"result_urls": [url]}))
        assert out.result == "failed", url
        assert (await row(conn, job))["credits"] == "refunded"
        assert await error_code(conn, job) == "media_unusable"
    assert canary.hits == []


async def test_redirect_to_an_internal_address_is_refused_at_the_hop(
        conn: Conn, make_runner: MakeRunner, canary: Canary) -> None:
    job = await create_job(conn, credits=10)
    script = {"media_redirect": f"{canary.url}/computeMetadata/v1/"}
    out = await make_runner().run(job, "kie-standard", kie(script))
    assert out.result == "failed"
    assert canary.hits == []
    assert (await row(conn, job))["assets"] == 0


async def test_allow_listed_name_that_resolves_to_loopback_is_refused(
        conn: Conn, make_runner: MakeRunner, canary: Canary) -> None:
    """The allow-list widens the hosts, never the addresses: a name resolving to a
    loopback/private address is refused in the resolver (only the configured endpoint may
    be one)."""
    port = canary.url.rsplit(":", 1)[1]
    job = await create_job(conn, credits=10)
    out = await make_runner(media_allow_hosts=("localhost",)).run(
        job, "kie-standard", kie({"result_urls": [f"http://localhost:{port}/x.png"]}))
    assert out.result == "failed"
    assert canary.hits == []


async def test_allow_listed_address_that_is_not_public_is_refused_unfetched(
        conn: Conn, make_runner: MakeRunner, canary: Canary) -> None:
    """An address in the allow-list is a host like any other, not a licence for its
    address: a URL naming a loopback/private IP is refused before anything is fetched.
    No resolver sees an IP literal (the connection goes to it as written), so the URL
    check is all that stands between it and the internal service."""
    job = await create_job(conn, credits=10)
    out = await make_runner(media_allow_hosts=("127.0.0.2",)).run(
        job, "kie-standard", kie({"result_urls": [f"{canary.url}/x.png"]}))
    assert out.result == "failed"
    assert await error_code(conn, job) == "media_unusable"
    assert (await row(conn, job))["credits"] == "refunded"
    assert canary.hits == []


async def test_one_runner_keeps_its_media_connection_and_the_guard_still_holds(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator, canary: Canary) -> None:
    """Issue 26: a runner's second download reuses the connection its first one made to
    the media host (no new resolution, handshake and close per call), a later result
    pointing at an internal address through the same runner is still refused unfetched,
    and once the runner is closed its next download opens a new connection."""
    runner = make_runner()

    async def completes() -> None:
        job = await create_job(conn, credits=10)
        assert (await runner.run(job, "kie-standard", kie({}))).result == "completed"

    await completes()
    await completes()
    first, second = sim.sim.media.peers
    assert first == second
    job = await create_job(conn, credits=10)
    script = {"media_redirect": f"{canary.url}/computeMetadata/v1/"}
    assert (await runner.run(job, "kie-standard", kie(script))).result == "failed"
    assert canary.hits == []
    await runner.aclose()
    await completes()
    assert sim.sim.media.peers[-1] != first


async def test_a_media_host_that_drops_kept_connections_costs_no_result(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator) -> None:
    """A media host that closes each connection once it has sent the media (keep-alive
    ended, not announced): the runner's kept connection is gone when the next result
    comes, and that result is still downloaded, on a new connection."""
    runner = make_runner()
    for _ in range(3):
        job = await create_job(conn, credits=10)
        out = await runner.run(job, "kie-standard", kie({"media_drops_connection": True}))
        assert out.result == "completed", out.detail
    peers = sim.sim.media.peers
    assert len(peers) == 3
    assert len(set(peers)) == 3


async def test_media_from_the_configured_endpoint_is_fetched(
        conn: Conn, make_runner: MakeRunner) -> None:
    job = await create_job(conn, credits=10)
    assert (await make_runner().run(job, "kie-standard", kie({}))).result == "completed"


# -- 9. money is never negative or over-charged ----------------------------------------------

# The host's price list: one credit per KIE credit the LLM proxy reports it consumed.
PER_KIE_CREDIT = RateTable(rates=(Rate(kind="kie-llm", unit="provider_credits",
                                       credits=1.0),))


@pytest.mark.parametrize("cost", [-50, -0.01])
async def test_a_bad_cost_from_the_provider_is_dropped_never_charged(
        conn: Conn, make_runner: MakeRunner, cost: object) -> None:
    """The call succeeded (and was billed upstream): its result is kept, and the charge
    comes from the price list as if no cost were reported — never a negative one."""
    job = await create_job(conn, credits=10)
    out = await make_runner(pricing=PER_KIE_CREDIT).run(
        job, "kie-llm", {**LLM, "_sim": {"cost": cost}})
    assert out.result == "completed"
    r = await row(conn, job)
    assert (r["credits"], r["credits_charged"]) == ("committed", 10)
    kind, payload = (await (await conn.execute(
        "SELECT type, payload FROM callwarden.call_events WHERE job_id = %s ORDER BY seq DESC "
        "LIMIT 1",
        (job,))).fetchone() or {}).values()
    assert (kind, payload.get("cost")) == ("Completed", None)


@pytest.mark.parametrize(("cost", "charged"), [(7.0, [4, 3]), (20.0, [4, 6]), (0.0, [0, 0])])
async def test_charge_is_split_over_a_jobs_reservations_never_above_the_total(
        conn: Conn, make_runner: MakeRunner, cost: float, charged: list[int]) -> None:
    job = await create_job(conn, credits=4)
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'user-1', 'reserved', 6)", (job,))  # the host's second
    out = await make_runner(pricing=PER_KIE_CREDIT).run(
        job, "kie-llm", {**LLM, "_sim": {"cost": cost}})
    assert out.result == "completed"
    rows = await (await conn.execute(
        "SELECT status, credits_charged FROM usage_logs WHERE job_id = %s ORDER BY id",
        (job,))).fetchall()
    assert [(r["status"], r["credits_charged"]) for r in rows] == [
        ("committed", c) for c in charged]


# -- 11. the internal marker cannot be forged by a provider -----------------------------------

async def _succeeded_with(conn: Conn, job: uuid.UUID, result: UpstreamResult) -> None:
    p = await load(conn, job)
    p = (await append(conn, job, p, CallStarted(at=utcnow(), actor="w",
                                                kind="replicate-prediction"))).projection
    await append(conn, job, p, UpstreamSucceeded(at=utcnow(), actor="w", result=result))


async def test_prestored_keys_in_the_providers_answer_are_never_read(
        conn: Conn, pool: Pool, sim: RunningSimulator, tmp_path: Path) -> None:
    store = LocalFolderStore(tmp_path / "media")
    victim = await create_job(conn, credits=10)
    secret = await store.put(f"media/{victim}/0.png", b"\x89PNG\r\n\x1a\nvictim", "image/png")
    job = await create_job(conn, credits=10)
    forged = {"id": "p1", "status": "succeeded", "prestored_keys": [secret.key]}
    await _succeeded_with(conn, job, UpstreamResult(raw=forged))
    done = await Finalizer(pool, store, sim.settings, owner="w").finalize(job)
    assert done.outcome == "completed"
    assets = await (await conn.execute("SELECT storage_key FROM assets WHERE job_id = %s",
                                       (job,))).fetchall()
    assert assets == []  # the other job's media was not attached


async def test_old_event_naming_another_jobs_key_is_refused(
        conn: Conn, pool: Pool, sim: RunningSimulator, tmp_path: Path) -> None:
    """v1 kept the keys in ``raw``, where a provider could forge them: the upcaster moves
    them, and the finalizer refuses any key outside the job's own prefix."""
    store = LocalFolderStore(tmp_path / "media")
    victim = await create_job(conn, credits=10)
    secret = await store.put(f"media/{victim}/0.png", b"\x89PNG\r\n\x1a\nvictim", "image/png")
    job = await create_job(conn, credits=10)
    await _succeeded_with(conn, job, UpstreamResult())
    v1 = {"type": "UpstreamSucceeded", "at": utcnow().isoformat(), "actor": "w",
          "result": {"raw": {"prestored_keys": [secret.key]}}}
    await conn.execute("UPDATE callwarden.call_events SET version = 1, payload = %s::jsonb "
                       "WHERE job_id = %s AND seq = 2", (msgspec.json.encode(v1).decode(), job))
    await conn.execute("UPDATE jobs SET upstream_result = %s::jsonb WHERE id = %s", (
        msgspec.json.encode({"stored_keys": [secret.key]}).decode(), job))
    done = await Finalizer(pool, store, sim.settings, owner="w").finalize(job)
    assert (done.outcome, await error_code(conn, job)) == ("failed", "media_unusable")
    assert (await row(conn, job))["credits"] == "refunded"


async def test_claim_lease_fits_the_media_to_store(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    config = CallConfig(finalize_lease_s=30, media_timeout_s=100, store_timeout_s=20,
                        lease_margin_s=5)
    job = await create_job(conn, credits=10)
    task = await upstream_task(http, sim, "kie-standard", {"steps": [], "end": "succeeded",
                                                           "media_count": 3})
    p = await load(conn, job)
    p = (await append(conn, job, p, CallStarted(at=utcnow(), actor="w",
                                                kind="kie-standard"))).projection
    urls = tuple(f"{sim.url('kie', '/x')}/{i}" for i in range(3))
    await append(conn, job, p, UpstreamSucceeded(at=utcnow(), actor="w",
                                                 result=UpstreamResult(media_urls=urls)))
    assert task
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), sim.settings, owner="w",
                          config=config)
    await finalizer.finalize(job)
    claim = next(e for e in await load_events(conn, job) if isinstance(e, FinalizeClaimed))
    assert (claim.lease_until - claim.at).total_seconds() == 3 * (100 + 20) + 5


async def test_without_a_price_list_the_reservation_is_committed(
        conn: Conn, make_runner: MakeRunner) -> None:
    """A provider's own cost (KIE credits here) is not the host's credits: by default the
    reservation is committed, whatever the provider reports."""
    job = await create_job(conn, credits=10)
    out = await make_runner().run(job, "kie-llm", {**LLM, "_sim": {"cost": 2.5}})
    assert out.result == "completed"
    assert (await row(conn, job))["credits_charged"] == 10


class _BrokenPricing:
    def charge(self, kind: str, usage: dict[str, float | str],
               reported_cost: float | None) -> float | None:
        raise KeyError("model_pricing has no row for this model")


async def test_a_pricing_function_that_raises_keeps_the_result_and_the_reservation(
        conn: Conn, make_runner: MakeRunner) -> None:
    """A host's pricing bug never loses a paid result: the call completes and commits
    what was reserved (logged), instead of failing finalization until it is exhausted."""
    job = await create_job(conn, credits=10)
    out = await make_runner(pricing=_BrokenPricing()).run(
        job, "kie-llm", {**LLM, "_sim": {"cost": 2.5}})
    assert out.result == "completed"
    r = await row(conn, job)
    assert (r["credits"], r["credits_charged"]) == ("committed", 10)


async def test_nul_characters_from_a_provider_are_still_recorded(
        conn: Conn, make_runner: MakeRunner) -> None:
    """Postgres refuses NUL in text and jsonb; a provider's answer carrying one must not
    keep the call from ending (it is recorded as U+FFFD)."""
    job = await create_job(conn, credits=10)
    out = await make_runner().run(job, "kie-standard", {"model": "m", "input": {"_sim": {
        "steps": [], "end": "failed", "error": "upstream \u0000 said no"}}})
    assert out.result == "failed"
    r = await row(conn, job)
    assert (r["credits"], r["error_message"]) == ("refunded", "upstream \ufffd said no")


async def test_a_host_name_that_is_not_a_valid_name_fails_at_once(
        conn: Conn, make_runner: MakeRunner) -> None:
    job = await create_job(conn, credits=10)
    bad = "https://a..replicate.delivery/x.png"
    out = await make_runner().run(job, "kie-standard", kie({"result_urls": [bad]}))
    assert out.result == "failed"
    assert await error_code(conn, job) == "media_unusable"


DEADLOCK_ONCE = """
CREATE SEQUENCE completions;
CREATE OR REPLACE FUNCTION deadlock_once() RETURNS trigger AS $$
BEGIN
    IF NEW.type = 'Completed' AND nextval('completions') = 1 THEN
        RAISE EXCEPTION 'deadlock (test trigger)' USING ERRCODE = '40P01';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER deadlock_once BEFORE INSERT ON callwarden.call_events
    FOR EACH ROW EXECUTE FUNCTION deadlock_once();
"""


async def test_a_deadlock_while_completing_is_retried_in_a_new_transaction(
        conn: Conn, make_runner: MakeRunner) -> None:
    await conn.execute(DEADLOCK_ONCE.encode())
    job = await create_job(conn, credits=10)
    assert (await make_runner().run(job, "kie-standard", kie({}))).result == "completed"
    assert (await row(conn, job))["assets"] == 1
