"""A real Redis for the queue tests (Celery's broker, arq's queue), and their fixtures
(``redis_url``: the module's own server, emptied for each test; ``arq_redis``; a plugin of
``tests/conftest.py``), started like PgBouncer (``tests/pgbouncer.py``): Debian's
``redis-server`` binary (``.ci/run`` installs it), on 127.0.0.1 at a free port, its folder
a temp dir, no persistence (no RDB, no AOF), stopped at the end — the demo's own starter
(:mod:`callwarden.demo.redis_server`). A missing binary is an error that names the
package, never a skip."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from callwarden.demo import redis_server
from tests.debian import binary

__all__ = ["arq_redis", "redis_server_url", "redis_url", "running_redis"]

MISSING = ("redis-server is not installed: apt-get install redis-server (.ci/run installs "
           "it); the Celery and arq crash tests need a real Redis")


@contextmanager
def running_redis(folder: Path, *, ready_s: float = 20.0) -> Iterator[str]:
    """Yield ``redis://127.0.0.1:<port>/0`` of a fresh server living in ``folder``."""
    found = redis_server.redis_binary() or binary(("redis-server",), "redis-server",
                                                  paths=("/usr/bin/redis-server",))
    if found is None:
        raise RuntimeError(MISSING)
    with redis_server.running_redis(folder, binary=found, ready_s=ready_s) as url:
        yield url


@pytest.fixture(scope="module")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` for the module's queue tests."""
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
async def redis_url(redis_server_url: str) -> str:
    """The module's server, emptied for this test."""
    client = aioredis.Redis.from_url(redis_server_url)
    await client.flushall()
    await client.aclose()
    return redis_server_url


@pytest.fixture
async def arq_redis(redis_url: str) -> AsyncIterator[ArqRedis]:
    client = await create_pool(RedisSettings.from_dsn(redis_url))
    try:
        yield client
    finally:
        await client.aclose()
