"""A real Redis for the queue tests (Celery's broker, arq's queue), started like PgBouncer
(``tests/pgbouncer.py``): Debian's ``redis-server`` binary (``.ci/run`` installs it), on
127.0.0.1 at a free port, its folder a temp dir, no persistence (no RDB, no AOF), stopped
at the end — the demo's own starter (:mod:`callwarden.demo.redis_server`). A missing binary
is an error that names the package, never a skip."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from callwarden.demo import redis_server
from tests.debian import binary

__all__ = ["running_redis"]

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
