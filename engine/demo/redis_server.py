"""A private Redis for ``callwarden demo --queue`` (and the queue tests, ``tests/redis.py``):
the ``redis-server`` binary on 127.0.0.1 at a free port, its folder ``folder``, no
persistence (no RDB, no AOF), stopped at the end. Readiness is a raw ``PING`` over a
socket, so this module needs no Redis client library."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["redis_binary", "running_redis"]

_FALLBACK = Path("/usr/bin/redis-server")  # Debian's, should PATH be narrow


def redis_binary() -> str | None:
    """The ``redis-server`` binary (on PATH, else Debian's), or None."""
    found = shutil.which("redis-server")
    if found:
        return found
    return str(_FALLBACK) if _FALLBACK.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def running_redis(folder: Path, *, binary: str | None = None,
                  ready_s: float = 20.0) -> Iterator[str]:
    """Yield ``redis://127.0.0.1:<port>/0`` of a fresh server living in ``folder``
    (``binary``: default :func:`redis_binary`; a missing one is ``FileNotFoundError``)."""
    binary = binary or redis_binary()
    if binary is None:
        raise FileNotFoundError("redis-server is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--save", "", "--appendonly", "no", "--daemonize", "no",
         "--logfile", str(folder / "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + ready_s
        while not _pong(port):  # wait until it answers (bounded): a condition, not a sleep
            if proc.poll() is not None or time.monotonic() > deadline:
                log = folder / "redis.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"redis-server did not start: {text}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
