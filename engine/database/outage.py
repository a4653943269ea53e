"""Riding through a database outage: one log line when it starts, one when it ends, and a
bounded, jittered backoff between attempts (not one line, nor one tight retry, per failed
statement).

Every long-running actor (worker, reconciler, service, demo) keeps one :class:`Outage`
per loop: ``down(exc)`` on each ``DatabaseUnavailable`` (it returns how long to wait before
the next attempt), ``up()`` on the first success after. :func:`until_up` wraps one operation
that must eventually succeed (the demo's bookkeeping). Nothing here changes what is written:
a transition that failed was not written (the write path is one statement), and the actor
decides again from what it reads once the database is back.

An outage longer than the limit (``CALLWARDEN_DB_OUTAGE_LIMIT_S``, default 300 s) is
reported: one error line when it crosses the limit, ``over_limit`` for ``/readyz`` and the
``callwarden_database_outage_over_limit`` gauge, and a non-zero exit for ``--once``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from callwarden.errors import ConfigError, DatabaseUnavailable

__all__ = ["DEFAULT_LIMIT_S", "LIMIT_ENV", "Outage", "configured_limit_s", "observe",
           "until_up"]

LIMIT_ENV = "CALLWARDEN_DB_OUTAGE_LIMIT_S"
DEFAULT_LIMIT_S = 300.0

T = TypeVar("T")
_observers: list[Callable[[Outage, bool], None]] = []


def observe(fn: Callable[[Outage, bool], None]) -> None:
    """Call ``fn(outage, started)`` when any outage of this process starts (``True``) or
    ends (``False``); metrics hook in here (``callwarden.observe.metrics``)."""
    if fn not in _observers:
        _observers.append(fn)


def configured_limit_s(environ: Mapping[str, str] | None = None) -> float:
    """The outage limit from ``CALLWARDEN_DB_OUTAGE_LIMIT_S`` (seconds, > 0), else the
    default; a value that is not a positive number is a :class:`ConfigError` naming it."""
    raw = (os.environ if environ is None else environ).get(LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{LIMIT_ENV}: expected a number of seconds > 0, got {raw!r}")
    return value


class Outage:
    """The state of the database as one actor sees it (``what`` names the actor in logs).

    ``limit_s``: an outage longer than this is reported (``over_limit``), e.g. by
    ``/readyz``, a metric or a ``--once`` exit status; by default
    :func:`configured_limit_s`."""

    def __init__(self, log: logging.Logger, what: str, *, base_s: float = 0.2,
                 cap_s: float = 5.0, limit_s: float | None = None,
                 rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what = log, what
        self.base_s, self.cap_s = base_s, cap_s
        self.limit_s = configured_limit_s() if limit_s is None else limit_s
        self.rng, self.clock = rng or random.Random(), clock
        self.down_since: float | None = None
        self.failures = 0
        self.outages = 0
        self.downtime_s = 0.0
        self.longest_s = 0.0
        self._over_reported = False

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
            self._over_reported = False
            self.outages += 1
            self.log.warning("%s: database unavailable, retrying with backoff: %s",
                             self.what, str(exc).splitlines()[0] if str(exc) else exc)
            for fn in _observers:
                fn(self, True)
        self.failures += 1
        if self.over_limit and not self._over_reported:
            self._over_reported = True
            self.log.error("%s: database unavailable for %.0f s, longer than the outage "
                           "limit (%s=%g)", self.what, self.down_for_s, LIMIT_ENV,
                           self.limit_s)
        return self.rng.uniform(0, min(self.cap_s, self.base_s * 2 ** min(self.failures, 16)))

    def report(self) -> dict[str, float | bool]:
        """What ``/readyz`` says about this outage: how long so far, the limit, and
        whether it is over it."""
        return {"down_s": round(self.down_for_s, 1), "limit_s": self.limit_s,
                "over_limit": self.over_limit}

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
