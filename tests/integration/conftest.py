"""Fixtures shared by the integration tests: the provider simulator, an HTTP session, a
connection pool on the test's database, and factories for the real actors (a worker's
``CallRunner``, a ``Reconciler``) wired to them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from psycopg.conninfo import make_conninfo

from callwarden.calls.config import CallConfig
from callwarden.calls.pricing import Pricing
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Pool, open_pool
from callwarden.providers.simulator.core import RunningSimulator, running_simulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler, Signal
from tests.support import no_sleep
from tests.support.leases import HeldMedia, holding_media
from tests.support.webhooks import Service, serving

APPLICATION_NAME = "cw-integration-test"  # lets a test find (and kill) the pool's backends

MakeReconciler = Callable[..., Reconciler]
MakeRunner = Callable[..., CallRunner]


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    """A simulator with every provider module that exists, on a free local port."""
    async with running_simulator() as rs:
        yield rs


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Pool]:
    url = make_conninfo(db_url, application_name=APPLICATION_NAME)
    async with open_pool(url, max_size=6, check=True) as p:
        yield p


@pytest.fixture
async def make_reconciler(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                          tmp_path: Path) -> AsyncIterator[MakeReconciler]:
    """``make(signal=None, call_config=None, **ReconcileConfig fields)``; each one made is
    closed when the test ends (its kept media connections)."""
    made: list[Reconciler] = []

    def make(signal: Signal | None = None, call_config: CallConfig | None = None,
             **config: Any) -> Reconciler:
        made.append(Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                               config=ReconcileConfig(**config), sleep=no_sleep,
                               signal=signal, call_config=call_config))
        return made[-1]
    yield make
    for reconciler in made:
        await reconciler.aclose()


@pytest.fixture
async def make_runner(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                      tmp_path: Path) -> AsyncIterator[MakeRunner]:
    """``make(pricing=None, **CallConfig fields)``: a worker's runner that never sleeps
    between polls; each one made is closed when the test ends."""
    made: list[CallRunner] = []

    def make(pricing: Pricing | None = None, **config: Any) -> CallRunner:
        made.append(CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                               config=CallConfig(**config), sleep=no_sleep, pricing=pricing,
                               callback_url=lambda job, kind: "http://127.0.0.1:9/cb"))
        return made[-1]
    yield make
    for runner in made:
        await runner.aclose()


@pytest.fixture
async def held() -> AsyncIterator[HeldMedia]:
    """A media host that holds each download until the test answers it."""
    async with holding_media() as state:
        yield state


@pytest.fixture
async def service(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                  tmp_path: Path) -> AsyncIterator[Service]:
    """The webhook service on 127.0.0.1 over the test's pool and simulator."""
    async with serving(pool, sim, http, tmp_path) as s:
        yield s
