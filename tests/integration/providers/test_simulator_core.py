"""The simulator core, provider-agnostic: scripts, journal, faults, media expiry, control
API and webhook delivery. Uses a tiny fake provider module ("echo") mounted by core."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.providers.simulator.core import (
    Fault,
    RunningSimulator,
    Script,
    Simulator,
    Step,
    WebhookPlan,
    load_provider_modules,
    running_simulator,
)
from callwarden.providers.simulator.model import Clock, TaskStore
from callwarden.providers.simulator.webhooks import retry_server_errors


class EchoModule:
    """A minimal provider: create/poll tasks, one sync call; errors as {"error", "code"}."""

    NAME = "echo"

    def routes(self, sim: Simulator) -> list[web.RouteDef]:
        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            script = sim.script_for(self.NAME, body)
            task_id = f"t{len(sim.tasks.all(self.NAME)) + 1}"
            sim.tasks.create(self.NAME, "echo", body, script, callback_url=None,
                             task_id=task_id)
            return web.json_response({"id": task_id, "echoed": body})

        async def poll(request: web.Request) -> web.Response:
            task = sim.tasks.get(self.NAME, request.match_info["id"])
            if task is None:
                return self.render_error(404, "no such task")
            phase = task.observe(sim.clock.now())
            if phase.name == "vanished":
                return self.render_error(404, "no such task")
            return web.json_response({"state": phase.name, "progress": phase.progress})

        return [
            web.post("/tasks", create, name="create"),
            web.post("/v2/tasks", create, name="create.v2"),
            web.get("/tasks/{id}", poll, name="poll"),
        ]

    def render_error(self, status: int, message: str, *, retry_after: float | None = None,
                     in_body: bool = False) -> web.Response:
        headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else {}
        return web.json_response({"error": message, "code": status},
                                 status=200 if in_body else status, headers=headers)


@pytest.fixture
async def echo() -> AsyncIterator[RunningSimulator]:
    async with running_simulator(modules=[EchoModule()]) as rs:
        yield rs


@dataclass
class Receiver:
    """A webhook receiver answering with queued statuses (then 200)."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()

    async def hook(request: web.Request) -> web.Response:
        rec.received.append((await request.read(), dict(request.headers)))
        return web.Response(status=rec.statuses.pop(0) if rec.statuses else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    yield rec
    await runner.cleanup()


async def _post(http: aiohttp.ClientSession, url: str, data: Any) -> tuple[int, Any]:
    async with http.post(url, json=data) as resp:
        return resp.status, await resp.json(content_type=None)


# --- scripts and tasks (pure) ---------------------------------------------------------------

def _phases(script: Script, n: int) -> list[str]:
    task = TaskStore(Clock()).create("p", "f", {}, script, callback_url=None, task_id="x",
                                     now=1000.0)
    return [task.observe(1000.0).name for _ in range(n)]


def test_default_script_is_one_queued_poll_two_running_then_success() -> None:
    assert _phases(Script(), 5) == ["queued", "running", "running", "succeeded", "succeeded"]


def test_stuck_script_keeps_running_and_vanished_script_vanishes() -> None:
    steps = [Step(phase="running", polls=1)]
    assert _phases(Script(steps=steps, end="stuck"), 4) == ["running"] * 4
    assert _phases(Script(steps=steps, end="vanished"), 2) == ["running", "vanished"]


def test_time_based_step_ends_on_sim_time_not_polls() -> None:
    script = Script(steps=[Step(phase="running", seconds=60, progress=40.0)], end="failed")
    task = TaskStore(Clock()).create("p", "f", {}, script, callback_url=None, task_id="x",
                                     now=0.0)
    first = task.observe(10.0)
    assert (first.name, first.progress) == ("running", 40.0)
    assert task.observe(59.0).name == "running"
    assert task.peek(60.0).name == "failed"
    assert task.polls == 2


def test_peek_does_not_count_a_poll_and_cancel_wins() -> None:
    task = TaskStore(Clock()).create("p", "f", {}, Script(), callback_url=None, task_id="x",
                                     now=0.0)
    assert [task.peek(0.0).name for _ in range(3)] == ["queued"] * 3
    assert task.polls == 0
    task.cancel(1.0)
    assert task.observe(1.0).name == "canceled"


def test_clock_factor_scales_and_advance_offsets() -> None:
    clock = Clock(factor=3600.0, start=0.0)
    assert clock.real_seconds(3600.0) == pytest.approx(1.0)
    before = clock.now()
    assert clock.advance(100.0) - before >= 100.0


def test_load_provider_modules_skips_only_missing_modules() -> None:
    assert load_provider_modules(["callwarden.providers.simulator.no_such_provider"]) == []
    with pytest.raises(ImportError):
        load_provider_modules(["no_such_top_level_package.kie"])


# --- journal, scripts and faults over HTTP ----------------------------------------------------

async def test_journal_records_each_request_with_logical_route(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    await _post(http, echo.url("echo", "/tasks"), {"a": 1})
    await _post(http, echo.url("echo", "/v2/tasks"), {"b": 2})
    async with http.get(echo.url("echo", "/tasks/t1"), headers={"X-Key": "k"}):
        pass
    creates = echo.sim.journal.entries("echo", "create")
    assert [(e.method, e.path, e.json()) for e in creates] == [
        ("POST", "/echo/tasks", {"a": 1}), ("POST", "/echo/v2/tasks", {"b": 2})]
    poll = echo.sim.journal.entries(route="poll")[0]
    assert poll.headers["x-key"] == "k"
    assert echo.sim.journal.count("echo") == 3


async def test_sim_field_and_queued_script_drive_new_tasks(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    queued = {"provider": "echo", "script": {"steps": [], "end": "failed"}}
    await _post(http, echo.base_url + "/_sim/scripts", queued)
    await _post(http, echo.url("echo", "/tasks"), {})
    await _post(http, echo.url("echo", "/tasks"), {"_sim": {"steps": [], "end": "vanished"}})
    await _post(http, echo.url("echo", "/tasks"), {})
    states = []
    for task_id in ("t1", "t2", "t3"):
        async with http.get(echo.url("echo", f"/tasks/{task_id}")) as resp:
            states.append((resp.status, (await resp.json())["state"] if resp.ok else None))
    assert states == [(200, "failed"), (404, None), (200, "queued")]


@pytest.mark.parametrize(
    ("fault", "status", "body", "retry_after"),
    [
        (Fault(kind="http_status", status=503), 503, {"error": "simulated upstream error "
                                                      "(HTTP 503)", "code": 503}, None),
        (Fault(kind="rate_limit", retry_after=7), 429, {"error": "rate limited", "code": 429},
         "7"),
        (Fault(kind="rate_limit_in_body"), 200, {"error": "rate limited", "code": 429}, None),
    ],
)
async def test_status_faults_use_the_provider_error_envelope(
    echo: RunningSimulator, http: aiohttp.ClientSession, fault: Fault, status: int,
    body: dict[str, Any], retry_after: str | None,
) -> None:
    echo.sim.faults.arm("echo", "create", fault)
    async with http.post(echo.url("echo", "/tasks"), json={}) as resp:
        assert (resp.status, await resp.json()) == (status, body)
        assert resp.headers.get("Retry-After") == retry_after
    assert echo.sim.tasks.all("echo") == []
    status2, _ = await _post(http, echo.url("echo", "/tasks"), {})
    assert status2 == 200


async def test_fault_applies_times_then_clears_and_is_journaled(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    echo.sim.faults.arm("echo", "create", Fault(kind="http_status", status=500, times=2))
    statuses = [(await _post(http, echo.url("echo", "/v2/tasks"), {}))[0] for _ in range(3)]
    assert statuses == [500, 500, 200]
    assert echo.sim.journal.count("echo", "create") == 3


async def test_reset_fault_closes_connection_without_answer(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    echo.sim.faults.arm("echo", "create", Fault(kind="reset"))
    with pytest.raises(aiohttp.ClientError):
        await _post(http, echo.url("echo", "/tasks"), {"x": 1})
    assert echo.sim.journal.count("echo", "create") == 1
    assert echo.sim.tasks.all("echo") == []


async def test_hang_fault_outlasts_a_short_client_timeout(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    echo.sim.faults.arm("echo", "poll", Fault(kind="hang", hang_s=5))
    await _post(http, echo.url("echo", "/tasks"), {})
    with pytest.raises(TimeoutError):
        async with http.get(echo.url("echo", "/tasks/t1"),
                            timeout=aiohttp.ClientTimeout(total=0.2)):
            pass


async def test_malformed_json_fault_truncates_the_real_answer(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    echo.sim.faults.arm("echo", "create", Fault(kind="malformed_json"))
    async with http.post(echo.url("echo", "/tasks"), json={"k": "v"}) as resp:
        raw = await resp.read()
        assert resp.status == 200
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(raw)
    assert raw.startswith(b'{"id"')


# --- media ---------------------------------------------------------------------------------

async def test_media_url_serves_bytes_until_ttl_passes_on_sim_clock(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    url = echo.sim.media.put(b"PNGDATA", "image/png", ttl_s=3600)
    async with http.get(url) as resp:
        assert (resp.status, resp.content_type, await resp.read()) == (
            200, "image/png", b"PNGDATA")
    echo.sim.clock.advance(3601)
    assert echo.sim.media.is_expired(url)
    async with http.get(url) as resp:
        assert resp.status == 404


async def test_media_expire_makes_url_404(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    url = echo.sim.media.put(b"x", "audio/mpeg", ttl_s=None)
    echo.sim.media.expire(url)
    async with http.get(url) as resp:
        assert resp.status == 404


# --- control API ---------------------------------------------------------------------------

async def test_control_api_arms_faults_reads_journal_advances_clock_and_resets(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    base = echo.base_url + "/_sim"
    fault = {"provider": "echo", "route": "create", "fault": {"kind": "http_status",
                                                               "status": 502}}
    assert (await _post(http, base + "/faults", fault))[0] == 200
    assert (await _post(http, echo.url("echo", "/tasks"), {"n": 1}))[0] == 502
    await _post(http, echo.url("echo", "/tasks"), {"n": 2})
    async with http.get(base + "/journal", params={"route": "create"}) as resp:
        journal = await resp.json()
    assert [msgspec.json.decode(e["body"]) for e in journal] == [{"n": 1}, {"n": 2}]
    async with http.get(base + "/tasks/echo/t1") as resp:
        task = await resp.json()
    assert (task["input"], task["phase"], task["polls"]) == ({"n": 2}, "queued", 0)
    before = echo.sim.clock.now()
    _, advanced = await _post(http, base + "/clock/advance", {"seconds": 7200})
    assert advanced["now"] >= before + 7200
    await _post(http, base + "/reset", {})
    assert echo.sim.journal.count() == 0
    async with http.get(base + "/tasks/echo/t1") as resp:
        assert resp.status == 404


async def test_control_api_rejects_invalid_fault(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    bad = {"provider": "echo", "route": "create", "fault": {"kind": "explode"}}
    assert (await _post(http, echo.base_url + "/_sim/faults", bad))[0] == 400


# --- webhooks ------------------------------------------------------------------------------

async def test_webhook_retries_until_2xx_then_stops(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    receiver.statuses = [500, 503]
    echo.sim.webhooks.deliver(receiver.url, b'{"n":1}', {"X-Id": "a"}, WebhookPlan())
    done = await echo.sim.webhooks.wait_for(1, timeout=5, outcome="delivered")
    assert [(d.attempt, d.status) for d in echo.sim.webhooks.deliveries] == [
        (1, 500), (2, 503), (3, 200)]
    assert done[0].body == b'{"n":1}'
    assert [h["X-Id"] for _, h in receiver.received] == ["a", "a", "a"]


async def test_webhook_gives_up_after_retries(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    receiver.statuses = [500] * 10
    echo.sim.webhooks.deliver(receiver.url, b"{}", {}, WebhookPlan(), retries=1)
    await echo.sim.webhooks.drain()
    assert [d.outcome for d in echo.sim.webhooks.deliveries] == ["rejected", "rejected"]


async def test_retry_on_decides_which_failed_attempts_are_retried(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    receiver.statuses = [400, 503]
    echo.sim.webhooks.deliver(receiver.url, b"a", {}, WebhookPlan(),
                              retry_on=retry_server_errors)
    await echo.sim.webhooks.drain()
    echo.sim.webhooks.deliver(receiver.url, b"b", {}, WebhookPlan(),
                              retry_on=retry_server_errors)
    await echo.sim.webhooks.drain()
    assert [(d.body, d.attempt, d.status) for d in echo.sim.webhooks.deliveries] == [
        (b"a", 1, 400), (b"b", 1, 503), (b"b", 2, 200)]


async def test_a_delivery_waits_for_an_answer_only_its_own_timeout(
    echo: RunningSimulator,
) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/hang", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/hang"
        assert echo.sim.webhooks.timeout_s >= 5  # the default would outlast the drain
        echo.sim.webhooks.deliver(url, b"{}", {}, WebhookPlan(), retries=0, timeout_s=0.2)
        await echo.sim.webhooks.drain(timeout=2)
        assert [d.outcome for d in echo.sim.webhooks.deliveries] == ["error"]
    finally:
        release.set()
        await runner.cleanup()


async def test_control_api_registers_an_account_webhook_that_reset_keeps(
    echo: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    base = echo.base_url + "/_sim"
    status, body = await _post(http, base + "/webhooks",
                               {"provider": "elevenlabs", "url": "http://127.0.0.1:9/h"})
    assert status == 200
    await _post(http, base + "/reset", {})
    assert echo.sim.workspace_webhooks == {"elevenlabs": {body["webhook_id"]:
                                                          "http://127.0.0.1:9/h"}}
    assert (await _post(http, base + "/webhooks", {"provider": "elevenlabs"}))[0] == 400


async def test_webhook_duplicates_and_simulated_failures(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    plan = WebhookPlan(duplicates=2, fail_first=1)
    echo.sim.webhooks.deliver(receiver.url, b"{}", {}, plan)
    await echo.sim.webhooks.wait_for(3, outcome="delivered")
    outcomes = [(d.outcome, d.duplicate) for d in echo.sim.webhooks.deliveries]
    assert outcomes == [("simulated_failure", False), ("delivered", False),
                        ("delivered", True), ("delivered", True)]
    assert len(receiver.received) == 3


async def test_dropped_webhook_is_never_sent(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    echo.sim.webhooks.deliver(receiver.url, b"{}", {}, WebhookPlan(drop=True))
    await echo.sim.webhooks.drain()
    assert [d.outcome for d in echo.sim.webhooks.deliveries] == ["dropped"]
    assert receiver.received == []


async def test_out_of_order_webhook_is_overtaken_by_the_next(
    echo: RunningSimulator, receiver: Receiver,
) -> None:
    echo.sim.webhooks.deliver(receiver.url, b"first", {}, WebhookPlan(out_of_order=True))
    echo.sim.webhooks.deliver(receiver.url, b"second", {}, WebhookPlan())
    await echo.sim.webhooks.wait_for(2, outcome="delivered")
    assert [body for body, _ in receiver.received] == [b"second", b"first"]


async def test_wait_for_times_out_when_nothing_is_delivered(echo: RunningSimulator) -> None:
    with pytest.raises(TimeoutError):
        await echo.sim.webhooks.wait_for(1, timeout=0.05)


async def test_drive_advances_a_task_nobody_polls(echo: RunningSimulator) -> None:
    task = echo.sim.tasks.create("echo", "echo", {}, Script(), callback_url=None,
                                 task_id="d1")
    seen: list[str] = []
    finished = asyncio.Event()

    async def on_phase(phase: Any) -> None:
        seen.append(phase.name)
        if phase.terminal:
            finished.set()

    echo.sim.drive(task, on_phase, interval_s=0.001)
    await asyncio.wait_for(finished.wait(), 5)
    assert seen == ["queued", "running", "succeeded"]
