"""A host's own Replicate code, run as a durable task by ``own_call_task`` (Celery,
``tests/acceptance/celery_app.py``) and ``own_call_function`` (arq,
``tests/acceptance/arq_app.py``): the host makes every request itself, with its own
User-Agent, and callwarden decides whether it creates or resumes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp

from callwarden.calls.own import OwnCall
from callwarden.providers.outcomes import PollOutcome, Running, Succeeded

KIND = "replicate-prediction"
USER_AGENT = "own-host/1.0"


async def predict(call: OwnCall, request: dict[str, Any]) -> None:
    """Create the prediction when told to (``call.action == "create"``), then poll the
    job's one prediction until it is no longer running."""
    base = os.environ["CALLWARDEN_REPLICATE_URL"]
    headers = {"Authorization": f"Bearer {os.environ['REPLICATE_API_TOKEN']}",
               "User-Agent": USER_AGENT}
    async with aiohttp.ClientSession(headers=headers) as http:
        if call.action == "create":
            async with http.post(f"{base}/v1/predictions", json=request) as resp:
                await call.task_created(str((await resp.json())["id"]))
        while True:
            reported = await call.report(await _poll(http, base, call.task_id))
            if reported.result != "still_running":
                return
            await asyncio.sleep(0.1)  # the host's poll cadence


async def _poll(http: aiohttp.ClientSession, base: str, task_id: str | None) -> PollOutcome:
    async with http.get(f"{base}/v1/predictions/{task_id}") as resp:
        answer = await resp.json()
    if answer["status"] in ("starting", "processing"):
        return Running(raw_state=answer["status"])
    output = answer["output"]
    return Succeeded(media_urls=tuple([output] if isinstance(output, str) else output))
