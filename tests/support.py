"""Small helpers shared by test modules (fixtures live in the conftest files)."""

from __future__ import annotations

import asyncio

__all__ = ["no_sleep"]


async def no_sleep(_: float) -> None:
    """A ``sleep`` for code under test: yields to the event loop, never waits."""
    await asyncio.sleep(0)
