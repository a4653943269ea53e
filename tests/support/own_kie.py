"""A host's own KIE code for the bring-your-own-call tests: plain aiohttp against the
simulator's real routes (``tests/integration/test_own_call.py``, ``test_own_dispatch.py``)."""

from __future__ import annotations

from typing import Any

import aiohttp

from callwarden.providers.simulator.core import RunningSimulator

__all__ = ["KIE_AUTH", "KIE_REQ", "kie_create", "kie_poll"]

KIE_REQ: dict[str, Any] = {"model": "nano-banana-pro", "input": {"prompt": "a cat"}}
KIE_AUTH = {"Authorization": "Bearer sim-key"}


async def kie_create(http: aiohttp.ClientSession, sim: RunningSimulator,
                     body: dict[str, Any]) -> str:
    async with http.post(sim.url("kie", "/api/v1/jobs/createTask"), json=body,
                         headers=KIE_AUTH) as resp:
        return str((await resp.json())["data"]["taskId"])


async def kie_poll(http: aiohttp.ClientSession, sim: RunningSimulator,
                   task_id: str) -> dict[str, Any] | None:
    """The host's own poll loop: the simulator's timeline moves per poll, so no sleep.
    ``None``: KIE does not know the task (``recordInfo is null``)."""
    for _ in range(20):
        async with http.get(sim.url("kie", "/api/v1/jobs/recordInfo"),
                            params={"taskId": task_id}, headers=KIE_AUTH) as resp:
            body = await resp.json()
        if body["code"] != 200:
            return None
        if body["data"]["state"] in ("success", "fail"):
            return dict(body["data"])
    raise AssertionError("the task never finished")
