"""Helpers shared by test modules (fixtures live in the conftest files): small ones here,
the rest by subject in this package's modules. No test module imports another test
module (``tests/unit/test_packaging.py`` checks it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from callwarden.providers.errors import TransientError
from callwarden.providers.outcomes import PollOutcome, Running

__all__ = ["no_sleep", "poll_until_done", "serving_app"]

Sleep = Callable[[float], Awaitable[None]]


async def no_sleep(_: float) -> None:
    """A ``sleep`` for code under test: yields to the event loop, never waits."""
    await asyncio.sleep(0)


async def poll_until_done(poll: Callable[[str], Awaitable[PollOutcome]], task_id: str, *,
                          interval_s: float, budget_s: float,
                          on_poll: Callable[[PollOutcome], Awaitable[None]] | None = None,
                          sleep: Sleep = no_sleep) -> PollOutcome:
    """Drive a provider client's ``poll`` in a test until a terminal outcome, or until
    ``budget_s`` worth of ``interval_s`` sleeps is spent (then the last ``Running``). A
    transient error is retried on the next tick while budget remains. (The engine's one
    poll loop is ``CallRunner``'s; clients have no loop of their own.)"""
    slept = 0.0
    while True:
        try:
            outcome = await poll(task_id)
        except TransientError:
            if slept + interval_s > budget_s:
                raise
        else:
            if on_poll is not None:
                await on_poll(outcome)
            if not isinstance(outcome, Running) or slept + interval_s > budget_s:
                return outcome
        await sleep(interval_s)
        slept += interval_s


@asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a free port of 127.0.0.1 while the block runs: its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
