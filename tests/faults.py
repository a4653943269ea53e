"""The fault harness (issue 15), for the chaos tests and ``bench/chaos.py``.

- :class:`FaultProxy`: a TCP proxy on 127.0.0.1 between callwarden and its Postgres that
  can drop every connection (both sides closed at once), stall them (bytes held,
  connections kept open) and add latency to every chunk. It runs its own event loop in a
  thread, so it serves subprocesses and synchronous code alike; after ``lifetime_s`` it
  stops accepting and closes its connections.
- :class:`DatabaseFaults`: a schedule of faults at random intervals from a seeded RNG —
  the server restarted in immediate mode (crash recovery on start), one random
  callwarden backend terminated, every backend terminated, and the proxy's drops, stalls
  and latency — run in a thread until stopped, bounded in time and count, with a log of
  what was done and when (for the figures: counts, and the time of the last fault).

Only loopback addresses are used: the proxy listens on 127.0.0.1 and refuses a target
that is not local (a Unix socket folder, or a 127.x / localhost address).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from callwarden.database.db import EmbeddedServer

__all__ = ["FAULTS", "DatabaseFaults", "FaultLog", "FaultProxy"]

_CHUNK = 65536


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: not known to be local
        return False


class FaultProxy:
    """A TCP proxy to the server of ``target_url``; :meth:`url` is a URL through it."""

    def __init__(self, target_url: str, *, lifetime_s: float = 1800.0) -> None:
        info = conninfo_to_dict(target_url)
        host, port = str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)
        if info.get("hostaddr") or not (host.startswith("/") or _loopback(host)):
            raise ValueError(f"the fault proxy only reaches local servers, not {host!r}")
        self.target_url, self._host, self._port = target_url, host, port
        self.lifetime_s = lifetime_s
        self.port = 0
        self.accepted = self.dropped = 0
        self._latency_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")

    # -- life --------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._open())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def url(self, database: str | None = None) -> str:
        extra = {"dbname": database} if database else {}
        return make_conninfo(self.target_url, host="127.0.0.1", port=str(self.port), **extra)

    # -- faults (callable from any thread) ---------------------------------------------

    def drop(self) -> int:
        """Close every open connection, both sides at once; the number of connections dropped."""
        return self._call(self._drop())

    def stall(self, seconds: float, *, stop: threading.Event | None = None) -> float:
        """Hold every byte in both directions for ``seconds`` (connections stay open; new
        ones are accepted and held too), or until ``stop`` is set. Returns once the stall
        is over: the ``time.monotonic()`` just before bytes flow again."""
        self._call(self._set_flowing(False))  # in effect before the wait starts
        try:
            (stop or threading.Event()).wait(seconds)  # the fault's own length
        finally:
            resumed = time.monotonic()
            self._call(self._set_flowing(True))
        return resumed

    @property
    def flowing(self) -> bool:
        """False while a stall holds the bytes."""
        return self._flowing.is_set()

    def latency(self, seconds: float) -> None:
        """Delay every chunk forwarded by ``seconds`` from now on (0: none)."""
        self._latency_s = max(0.0, seconds)

    # -- inside the loop ---------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, int]) -> int:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _set_flowing(self, flowing: bool) -> int:
        (self._flowing.set if flowing else self._flowing.clear)()
        return 0

    async def _open(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._loop.call_later(self.lifetime_s, lambda: asyncio.ensure_future(self._close()))
        return self.port

    async def _close(self) -> int:
        if self._server is not None:
            self._server.close()
            self._server = None
        return await self._drop(count=False)

    async def _drop(self, *, count: bool = True) -> int:
        links = list(self._links)
        for a, b in links:
            for w in (a, b):
                w.transport.abort()
        self._links.clear()
        if count:
            self.dropped += len(links)
        return len(links)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self._host}/.s.PGSQL.{self._port}")
        return await asyncio.open_connection(self._host, self._port)

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await self._connect()
        except OSError:  # the server is down: the client sees its connection refused
            client_w.transport.abort()
            return
        self.accepted += 1
        link = (client_w, server_w)
        self._links.add(link)
        try:
            await asyncio.gather(self._pump(client_r, server_w),
                                 self._pump(server_r, client_w))
        finally:
            self._links.discard(link)
            for w in link:
                w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(_CHUNK):
                if self._latency_s:
                    await asyncio.sleep(self._latency_s)  # the injected latency
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()  # one side closed: close the other (no half-open links)


# -- a schedule of database faults ---------------------------------------------------------

#: The faults :class:`DatabaseFaults` draws from.
FAULTS = ("restart", "kill_backend", "kill_all", "drop", "stall", "latency")

_KILL_ONE = """
SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'
ORDER BY random() LIMIT 1"""
_KILL_ALL = """
SELECT count(pg_terminate_backend(pid)) AS killed FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'"""


@dataclass
class FaultLog:
    """What a :class:`DatabaseFaults` run did: how many of each fault, the backends and
    connections they cut, and when the last one ended (``time.monotonic``)."""

    counts: Counter[str] = field(default_factory=Counter)
    backends_killed: int = 0
    connections_dropped: int = 0
    last_fault_end: float | None = None
    started: float | None = None
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"faults": dict(self.counts), "backends_killed": self.backends_killed,
                "connections_dropped": self.connections_dropped}


class DatabaseFaults:
    """Faults on ``server`` (and through ``proxy``) every ``every_s`` seconds (uniform
    in the range), from ``rng``. Every other fault is a restart (down ``down_s``, uniform),
    so a run of N faults restarts the server (N + 1) // 2 times; the rest are dealt from
    ``kinds``. ``busy``: a condition to wait for before the first fault (calls in flight).
    """

    def __init__(self, server: EmbeddedServer, database: str, proxy: FaultProxy | None, *,
                 rng: random.Random, every_s: tuple[float, float] = (2.0, 5.0),
                 down_s: tuple[float, float] = (0.5, 2.0),
                 kinds: tuple[str, ...] = FAULTS,
                 busy: Callable[[], bool] | None = None) -> None:
        unknown = set(kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}")
        if proxy is None:
            kinds = tuple(k for k in kinds if k not in ("drop", "stall", "latency"))
        self.server, self.database, self.proxy = server, database, proxy
        self.rng, self.every_s, self.down_s, self.kinds = rng, every_s, down_s, kinds
        self.busy = busy
        self.log = FaultLog()
        self._deck: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, max_faults: int | None = None, for_s: float = 600.0) -> None:
        self._thread = threading.Thread(target=self._run, args=(max_faults, for_s),
                                        daemon=True, name="database-faults")
        self._thread.start()

    def stop(self) -> FaultLog:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        return self.log

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self, max_faults: int | None, for_s: float) -> None:
        while self.busy is not None and not self.busy():
            if self._stop.wait(0.2):  # a polling period of the condition
                return
        self.log.started = time.monotonic()
        deadline = self.log.started + for_s
        n = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            if max_faults is not None and n >= max_faults:
                return
            if self._stop.wait(self.rng.uniform(*self.every_s)):
                return
            name = self._next(n)
            try:
                self._apply(name)
            except Exception as exc:  # a fault that could not be applied is reported
                self.log.errors.append(f"{name}: {exc}")
            self.log.counts[name] += 1
            self.log.last_fault_end = time.monotonic()
            n += 1

    def _next(self, n: int) -> str:
        """Every other fault a restart; the others dealt from a shuffled deck of the other
        kinds (so a run of 2 × len(kinds) faults applies each kind at least once)."""
        others = [k for k in self.kinds if k != "restart"]
        if "restart" in self.kinds and (n % 2 == 0 or not others):
            return "restart"
        if not self._deck:
            self._deck = self.rng.sample(others, len(others))
        return self._deck.pop()

    def _sql(self, query: str) -> int:
        # Through the server's own database (the query filters on datname), so a fault
        # never depends on the demo's database existing (a round drops and creates it).
        with psycopg.connect(self.server.url(), connect_timeout=5, autocommit=True) as c:
            rows = c.execute(query, (self.database,)).fetchall()
        return sum(int(r[0]) for r in rows)

    def _apply(self, name: str) -> None:
        if name == "restart":
            self.server.restart(down_s=self.rng.uniform(*self.down_s))
        elif name == "kill_backend":
            self.log.backends_killed += self._sql(_KILL_ONE)
        elif name == "kill_all":
            self.log.backends_killed += self._sql(_KILL_ALL)
        elif self.proxy is not None and name == "drop":
            self.log.connections_dropped += self.proxy.drop()
        elif self.proxy is not None and name == "stall":
            self.proxy.stall(self.rng.uniform(0.5, 3.0), stop=self._stop)
        elif self.proxy is not None and name == "latency":
            self.proxy.latency(self.rng.uniform(0.005, 0.05))
            self._stop.wait(self.rng.uniform(1.0, 4.0))  # the latency's own length
            self.proxy.latency(0.0)
