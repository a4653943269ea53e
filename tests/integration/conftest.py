"""Fixtures for provider integration tests: a fresh simulator and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from providers.simulator.core import RunningSimulator, running_simulator


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    """A simulator with every provider module that exists, on a free local port."""
    async with running_simulator() as rs:
        yield rs


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
