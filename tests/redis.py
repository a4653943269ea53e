"""A real Redis for the queue tests (Celery's broker, arq's queue), started like PgBouncer
(``tests/pgbouncer.py``): Debian's ``redis-server`` binary (``.ci/run`` installs it), on
127.0.0.1 at a free port, its folder a temp dir, no persistence (no RDB, no AOF), stopped
at the end. A missing binary is an error that names the package, never a skip."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

__all__ = ["running_redis"]

MISSING = ("redis-server is not installed: apt-get install redis-server (.ci/run installs "
           "it); the Celery and arq crash tests need a real Redis")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary() -> str:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError(MISSING)
    return binary


@contextmanager
def running_redis(folder: Path, *, ready_s: float = 20.0) -> Iterator[str]:
    """Yield ``redis://127.0.0.1:<port>/0`` of a fresh server living in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen(
        [_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--save", "", "--appendonly", "no", "--daemonize", "no",
         "--logfile", str(folder / "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + ready_s
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        while True:  # wait until it answers (bounded): a condition, not a sleep
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: "
                                       f"{(folder / 'redis.log').read_text(errors='replace')}"
                                       ) from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
