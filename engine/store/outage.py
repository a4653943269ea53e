"""Riding through a database outage: one log line when it starts, one when it ends, and a
bounded, jittered backoff between attempts (not one line, nor one tight retry, per failed
statement).

Every long-running actor (worker, reconciler, service, demo) keeps one :class:`Outage`
per loop: ``down(exc)`` on each ``DatabaseUnavailable`` (it returns how long to wait before
the next attempt), ``up()`` on the first success after. :func:`until_up` wraps one operation
that must eventually succeed (the demo's bookkeeping). Nothing here changes what is written:
a transition that failed was not written (the write path is one statement), and the actor
decides again from what it reads once the database is back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from engine.errors import DatabaseUnavailable

__all__ = ["Outage", "observe", "until_up"]

T = TypeVar("T")
_observers: list[Callable[[Outage, bool], None]] = []


def observe(fn: Callable[[Outage, bool], None]) -> None:
    """Call ``fn(outage, started)`` when any outage of this process starts (``True``) or
    ends (``False``); metrics hook in here (``engine.service.metrics``)."""
    if fn not in _observers:
        _observers.append(fn)


class Outage:
    """The state of the database as one actor sees it (``what`` names the actor in logs).

    ``limit_s``: an outage longer than this is reported (``over_limit``), e.g. by
    ``/readyz``, a metric or a ``--once`` exit status."""

    def __init__(self, log: logging.Logger, what: str, *, base_s: float = 0.2,
                 cap_s: float = 5.0, limit_s: float = 300.0,
                 rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what = log, what
        self.base_s, self.cap_s, self.limit_s = base_s, cap_s, limit_s
        self.rng, self.clock = rng or random.Random(), clock
        self.down_since: float | None = None
        self.failures = 0
        self.outages = 0
        self.downtime_s = 0.0
        self.longest_s = 0.0

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    @property
    def down_for_s(self) -> float:
        return 0.0 if self.down_since is None else self.clock() - self.down_since

    @property
    def over_limit(self) -> bool:
        return self.down_for_s > self.limit_s

    def down(self, exc: BaseException) -> float:
        """Record a failed attempt; the seconds to wait before the next (full jitter,
        doubling up to ``cap_s``)."""
        if self.down_since is None:
            self.down_since, self.failures = self.clock(), 0
            self.outages += 1
            self.log.warning("%s: database unavailable, retrying with backoff: %s",
                             self.what, str(exc).splitlines()[0] if str(exc) else exc)
            for fn in _observers:
                fn(self, True)
        self.failures += 1
        return self.rng.uniform(0, min(self.cap_s, self.base_s * 2 ** min(self.failures, 16)))

    def up(self) -> None:
        """Record a success; ends the outage (logged once) if there was one."""
        if self.down_since is None:
            return
        lasted = self.clock() - self.down_since
        self.downtime_s += lasted
        self.longest_s = max(self.longest_s, lasted)
        self.log.warning("%s: database back after %.1f s (%d failed attempts)", self.what,
                         lasted, self.failures)
        self.down_since = None
        for fn in _observers:
            fn(self, False)


async def until_up(op: Callable[[], Awaitable[T]], outage: Outage, *,
                   sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> T:
    """``op()``, retried through ``DatabaseUnavailable`` (with ``outage``'s backoff) until
    it succeeds; any other error propagates."""
    while True:
        try:
            result = await op()
        except DatabaseUnavailable as exc:
            await sleep(outage.down(exc))
            continue
        outage.up()
        return result
