"""One clock for every actor: the database's (DESIGN §10, "compared on one clock").

Heartbeats are written with the database's ``now()``; leases, call start times and event
stamps are written by workers, reconcilers and webhook receivers on other hosts and
compared by each other. With each host's own clock, a skew of a minute makes a live call
look dead (or a live finalization lease look expired). So every actor reads time from
:class:`DatabaseClock`: the local clock plus the offset to the database's clock, measured
with ``SELECT now()`` (at the midpoint of the round trip) and refreshed every
``refresh_s`` by :func:`sync_clock`. Reading it is a pure local computation.

Tests pass any ``Callable[[], datetime]`` (a logical clock) instead; :func:`sync_clock`
leaves those alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from callwarden.database.boundary import connection
from callwarden.database.db import Conn, Pool
from callwarden.database.write import execute
from callwarden.errors import DatabaseError, DatabaseUnavailable

__all__ = ["Clock", "DatabaseClock", "sync_clock", "utcnow"]

log = logging.getLogger("callwarden.clock")
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """This host's clock (timezone-aware UTC); actors use :class:`DatabaseClock`."""
    return datetime.now(UTC)


class DatabaseClock:
    """The database's time, estimated locally (see the module docstring)."""

    def __init__(self, refresh_s: float = 60.0, *, local: Clock | None = None) -> None:
        """``local``: this host's clock (default :func:`utcnow`; a test passes a skewed
        one to stand for another host)."""
        self.refresh_s = refresh_s
        self.local = local or utcnow
        self.offset = timedelta(0)
        self._synced: float | None = None

    def __call__(self) -> datetime:
        return self.local() + self.offset

    def due(self) -> bool:
        return self._synced is None or time.monotonic() - self._synced >= self.refresh_s

    async def sync(self, conn: Conn) -> None:
        """Measure the offset to the database's clock now."""
        before = self.local()
        rows = await execute(conn, "clock_now", {})
        after = self.local()
        self.offset = rows[0]["now"] - (before + (after - before) / 2)
        self._synced = time.monotonic()


async def sync_clock(clock: Clock, pool: Pool) -> None:
    """Refresh ``clock`` if it is a :class:`DatabaseClock` whose offset is due; a failure
    keeps the last offset (time keeps running locally)."""
    if not isinstance(clock, DatabaseClock) or not clock.due():
        return
    try:
        async with connection(pool) as conn:
            await clock.sync(conn)
    except DatabaseError as exc:  # the pool's own timeout too (DatabaseUnavailable)
        level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
        log.log(level, "could not read the database clock (keeping the last offset): %s", exc)
