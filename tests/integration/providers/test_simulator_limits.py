"""The simulator enforces a provider account's limits when a test sets them, and counts
what it saw either way: KIE's "at most 20 new generation requests per 10 s per account;
the rest are rejected with HTTP 429, unqueued" (``create_rate``), a cap on the tasks in
flight upstream (``max_in_flight``; ElevenLabs' refusal is its own concurrency 429), and
the counters ``creates_accepted``, ``creates_refused_rate``,
``creates_refused_concurrency`` and ``max_in_flight_seen``.

Everything goes over HTTP on 127.0.0.1 (the control API sets the limits and moves the
simulated clock the rate window runs on); nothing is patched, nothing sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import aiohttp

from callwarden.providers.simulator.core import Limits, RunningSimulator

KIE_CREATE: Final = "/api/v1/jobs/createTask"
KIE_POLL: Final = "/api/v1/jobs/recordInfo"
KIE_AUTH: Final = {"Authorization": "Bearer sim-key"}
KIE_429: Final = (429, {"code": 429, "msg": "Rate limit exceeded"},
                  "application/json;charset=UTF-8")
TTS: Final = "/v1/text-to-speech/JBFqnCBsd6RMkjVDRZzb"

Answer = tuple[int, Any, str]


async def control(http: aiohttp.ClientSession, rs: RunningSimulator, method: str,
                  path: str, body: Any = None) -> tuple[int, Any]:
    async with http.request(method, f"{rs.base_url}/_sim{path}", json=body) as resp:
        return resp.status, await resp.json()


async def set_limits(http: aiohttp.ClientSession, rs: RunningSimulator, provider: str,
                     **limits: Any) -> None:
    status, _ = await control(http, rs, "POST", "/limits",
                              {"provider": provider, "limits": limits})
    assert status == 200


async def seen(http: aiohttp.ClientSession, rs: RunningSimulator, provider: str = "kie"
               ) -> dict[str, Any]:
    """The account's limits and counters, as the control API reports them."""
    status, body = await control(http, rs, "GET", f"/limits/{provider}")
    assert status == 200
    return body  # type: ignore[no-any-return]


async def advance(http: aiohttp.ClientSession, rs: RunningSimulator, seconds: float) -> None:
    assert (await control(http, rs, "POST", "/clock/advance", {"seconds": seconds}))[0] == 200


async def create(http: aiohttp.ClientSession, rs: RunningSimulator,
                 script: dict[str, Any] | None = None) -> Answer:
    """One KIE market create: (HTTP status, body, content type)."""
    body: dict[str, Any] = {"model": "sim/model", "input": {"prompt": "a cat"}}
    if script is not None:
        body["_sim"] = script
    async with http.post(rs.url("kie", KIE_CREATE), json=body, headers=KIE_AUTH) as resp:
        return resp.status, await resp.json(content_type=None), resp.headers["Content-Type"]


async def created(http: aiohttp.ClientSession, rs: RunningSimulator,
                  script: dict[str, Any] | None = None) -> str:
    """The id of a KIE market task, whose create must be accepted."""
    status, body, _ = await create(http, rs, script)
    assert (status, body["code"]) == (200, 200), body
    return str(body["data"]["taskId"])


async def finish(http: aiohttp.ClientSession, rs: RunningSimulator, task_id: str) -> None:
    """Poll the task (its default script: one queued and two running polls) to success."""
    for _ in range(4):
        async with http.get(rs.url("kie", KIE_POLL), params={"taskId": task_id},
                            headers=KIE_AUTH) as resp:
            state = (await resp.json(content_type=None))["data"]["state"]
    assert state == "success"


def refusals(rs: RunningSimulator, provider: str = "kie") -> list[str | None]:
    return [e.refused for e in rs.sim.journal.entries(provider)]


async def test_kie_accepts_20_creates_per_10_s_and_refuses_the_21st_with_its_429(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """With ``create_rate=(20, 10)``, 21 creates in a row are 20 tasks and one HTTP 429 in
    the shape the simulator answers for any KIE 429 (an armed ``rate_limit`` fault), which
    creates no task and is journaled as refused, not processed; the counters say so; once
    10 simulated seconds have passed, the next create is accepted."""
    await set_limits(http, sim, "kie", create_rate=[20, 10])
    answers = [await create(http, sim) for _ in range(21)]
    assert [a[1]["code"] for a in answers[:20]] == [200] * 20
    assert answers[20] == KIE_429
    assert len(sim.sim.tasks.all("kie")) == 20
    assert refusals(sim) == [None] * 20 + ["rate"]
    assert [e.processed for e in sim.sim.journal.entries("kie")] == [True] * 20 + [False]
    counts = await seen(http, sim)
    assert (counts["creates_accepted"], counts["creates_refused_rate"],
            counts["creates_refused_concurrency"]) == (20, 1, 0)

    await control(http, sim, "POST", "/faults", {
        "provider": "kie", "route": "create", "fault": {"kind": "rate_limit"}})
    assert await create(http, sim) == KIE_429  # the fault's 429: the same answer

    await advance(http, sim, 10)
    await created(http, sim)
    assert len(sim.sim.tasks.all("kie")) == 21
    assert (await seen(http, sim))["creates_accepted"] == 21


async def test_the_rate_window_slides_over_the_accepted_creates_times(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """``create_rate=(2, 100)`` (set from Python) counts the creates accepted in the last
    100 simulated seconds: a create is accepted again as soon as the oldest accepted one
    is 100 s old (not when a fixed bucket turns over), and refused creates do not hold
    the window back."""
    sim.sim.accounts["kie"].limits = Limits(create_rate=(2, 100.0))
    await created(http, sim)                  # t=0: A
    await advance(http, sim, 50)
    await created(http, sim)                  # t=50: B
    assert (await create(http, sim))[0] == 429
    await advance(http, sim, 50)              # t=100: A leaves the window
    await created(http, sim)                  # C
    assert (await create(http, sim))[0] == 429  # B and C are within 100 s
    await advance(http, sim, 50)              # t=150: B leaves
    await created(http, sim)
    assert refusals(sim) == [None, None, "rate", None, "rate", None]
    account = sim.sim.accounts["kie"]
    assert (account.creates_accepted, account.creates_refused_rate) == (4, 2)


async def test_kie_refuses_a_third_create_while_two_tasks_are_in_flight_until_one_finishes(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """With ``max_in_flight=2``, a create while two created tasks are not in a terminal
    phase is KIE's 429 and creates no task; once one task has succeeded, a create is
    accepted again; ``max_in_flight_seen`` is 2."""
    await set_limits(http, sim, "kie", max_in_flight=2)
    first = await created(http, sim)
    await created(http, sim)
    assert await create(http, sim) == KIE_429
    assert len(sim.sim.tasks.all("kie")) == 2

    await finish(http, sim, first)
    await created(http, sim)
    assert await create(http, sim) == KIE_429
    assert refusals(sim)[-1] == "concurrency"
    assert await seen(http, sim) == {
        "create_rate": None, "max_in_flight": 2, "creates_accepted": 3,
        "creates_refused_rate": 0, "creates_refused_concurrency": 2,
        "max_in_flight_seen": 2, "in_flight": 2}


async def test_max_in_flight_seen_counts_each_task_from_its_create_to_its_terminal_phase(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """Without limits (the default) every create is accepted and the counters still run:
    a task is in flight from its create until it reaches a terminal phase, by polls or on
    the simulated clock (a 30 s step that nobody polls), and ``max_in_flight_seen`` is the
    most at once (4 here), not the number of creates (6)."""
    a, b, c = [await created(http, sim) for _ in range(3)]
    await finish(http, sim, a)
    await created(http, sim)                  # 3 in flight
    await created(http, sim, {"steps": [{"phase": "running", "seconds": 30}]})  # 4
    assert (await seen(http, sim))["in_flight"] == 4
    await advance(http, sim, 30)              # the timed task succeeds unpolled
    for task_id in (b, c):
        await finish(http, sim, task_id)
    await created(http, sim)                  # 2 in flight
    counts = await seen(http, sim)
    assert (counts["max_in_flight_seen"], counts["in_flight"], counts["creates_accepted"],
            counts["creates_refused_rate"], counts["creates_refused_concurrency"]
            ) == (4, 2, 6, 0, 0)
    assert counts["max_in_flight_seen"] == sim.sim.accounts["kie"].max_in_flight_seen


async def test_elevenlabs_max_in_flight_refuses_a_concurrent_call_with_its_concurrency_429(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """ElevenLabs is synchronous: with ``max_in_flight=1`` a TTS call while another is
    being answered gets its ``429 concurrent_limit_exceeded`` (the existing concurrency
    answer); once the first is answered, the next call is accepted."""
    await set_limits(http, sim, "elevenlabs", max_in_flight=1)
    key = {"xi-api-key": sim.sim.api_key}

    async def tts(script: dict[str, Any] | None = None) -> tuple[int, Any]:
        body = {"text": "hi"} | ({"_sim": script} if script else {})
        async with http.post(sim.url("elevenlabs", TTS), json=body, headers=key) as resp:
            return resp.status, await resp.json() if resp.status != 200 else None

    slow = asyncio.create_task(tts({"hang_s": 2}))  # answered after 2 s (server side)
    async with asyncio.timeout(10):
        while (await seen(http, sim, "elevenlabs"))["in_flight"] == 0:
            pass
    status, refused = await tts()
    detail = refused["detail"]
    assert (status, detail["code"], detail["type"]) == (
        429, "concurrent_limit_exceeded", "rate_limit_error")
    assert (await slow)[0] == 200
    assert (await tts())[0] == 200
    assert refusals(sim, "elevenlabs") == [None, "concurrency", None]
    counts = await seen(http, sim, "elevenlabs")
    assert (counts["creates_accepted"], counts["creates_refused_concurrency"],
            counts["max_in_flight_seen"], counts["in_flight"]) == (2, 1, 1, 0)


async def test_limits_are_validated_kept_per_enforcing_provider_and_cleared_by_reset(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """The control API refuses invalid limits (400) and a provider whose simulation
    enforces none (404); ``/_sim/reset`` turns the limits off and zeroes the counters, so
    21 creates in a row are all accepted again."""
    for bad in ({"create_rate": [20, 0]}, {"create_rate": [-1, 10]},
                {"max_in_flight": -1}, {"max_inflight": 2}):
        status, _ = await control(http, sim, "POST", "/limits",
                                  {"provider": "kie", "limits": bad})
        assert status == 400, bad
    assert (await control(http, sim, "POST", "/limits",
                          {"provider": "replicate", "limits": {}}))[0] == 404
    assert (await control(http, sim, "GET", "/limits/replicate"))[0] == 404

    await set_limits(http, sim, "kie", create_rate=[1, 10], max_in_flight=1)
    await created(http, sim)
    assert (await create(http, sim))[0] == 429
    assert (await control(http, sim, "POST", "/reset"))[0] == 200
    assert await seen(http, sim) == {
        "create_rate": None, "max_in_flight": None, "creates_accepted": 0,
        "creates_refused_rate": 0, "creates_refused_concurrency": 0,
        "max_in_flight_seen": 0, "in_flight": 0}
    assert [(await create(http, sim))[0] for _ in range(21)] == [200] * 21
