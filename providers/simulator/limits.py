"""Provider account limits: how many creates an account accepts per time window, how many
of its tasks may be in flight upstream at once, and what the simulator saw of both.

Real accounts have such limits (KIE: "at most 20 new generation requests per 10 s per
account; the rest are rejected with HTTP 429, unqueued"; ElevenLabs: the plan's concurrent
requests). Here they are off until a test sets an account's :class:`Limits` (in Python, or
``POST /_sim/limits``); the counters run either way, so a test can read how many tasks
were in flight at once without capping them.

A provider module that enforces limits enrols its account (:meth:`Accounts.enrol`), asks
it before creating anything (:meth:`Account.refusal`) and, once it has created, says when
the new task is finished (:meth:`Account.accept`): a task is in flight from its accepted
create until then (a task: until it reaches a terminal phase; a synchronous call: until it
is answered). Plain logic over an injected clock (simulated seconds), like
:mod:`callwarden.providers.simulator.model`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import msgspec

__all__ = ["Account", "Accounts", "Finished", "Limits", "Refusal"]

Refusal = Literal["rate", "concurrency"]
Finished = Callable[[], bool]


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An account's limits; ``None`` is no limit. ``create_rate=(n, window_s)``: at most
    ``n`` accepted creates in any ``window_s`` simulated seconds (a sliding window over the
    accepted creates' times: refused ones do not count). ``max_in_flight=n``: a create
    while ``n`` accepted tasks are unfinished is refused."""

    create_rate: tuple[int, float] | None = None
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        rate = self.create_rate
        if rate is not None and not (rate[0] >= 0 and math.isfinite(rate[1]) and rate[1] > 0):
            raise ValueError(f"create_rate wants (count >= 0, window_s > 0), got {rate}")
        if self.max_in_flight is not None and self.max_in_flight < 0:
            raise ValueError(f"max_in_flight wants a count >= 0, got {self.max_in_flight}")


class Account:
    """One provider account: its limits, its accepted creates' times (for the rate
    window), its unfinished tasks, and its counters."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Limits off, counters at zero, nothing accepted and nothing in flight."""
        self.limits = Limits()
        self.creates_accepted = 0
        self.creates_refused_rate = 0
        self.creates_refused_concurrency = 0
        self.max_in_flight_seen = 0
        self._accepted_at: deque[float] = deque()
        self._in_flight: list[Finished] = []

    def in_flight(self) -> int:
        """How many accepted tasks are unfinished now (the finished ones are forgotten)."""
        self._in_flight = [finished for finished in self._in_flight if not finished()]
        return len(self._in_flight)

    def refusal(self) -> Refusal | None:
        """Why a create now is refused (the rate before the concurrency; counted), else
        None: the create may go ahead."""
        reason = self._reason()
        if reason is not None:
            self.refused(reason)
        return reason

    def refused(self, reason: Refusal) -> None:
        """Count a create refused for ``reason`` (by :meth:`refusal`, or by a cap the
        provider module keeps itself)."""
        if reason == "rate":
            self.creates_refused_rate += 1
        else:
            self.creates_refused_concurrency += 1

    def accept(self, finished: Finished) -> None:
        """Count an accepted create, whose task is in flight until ``finished()``."""
        self._accepted_at.append(self._clock())
        self._in_flight.append(finished)
        self.creates_accepted += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight())

    def to_json(self) -> dict[str, Any]:
        """The limits, the counters and the tasks in flight now (for the control API)."""
        limits: dict[str, Any] = msgspec.to_builtins(self.limits)
        return {**limits, "creates_accepted": self.creates_accepted,
                "creates_refused_rate": self.creates_refused_rate,
                "creates_refused_concurrency": self.creates_refused_concurrency,
                "max_in_flight_seen": self.max_in_flight_seen, "in_flight": self.in_flight()}

    def _reason(self) -> Refusal | None:
        rate, cap = self.limits.create_rate, self.limits.max_in_flight
        if rate is not None and self._accepted_within(rate[1]) >= rate[0]:
            return "rate"
        if cap is not None and self.in_flight() >= cap:
            return "concurrency"
        return None

    def _accepted_within(self, window_s: float) -> int:
        """How many creates were accepted in the last ``window_s`` (older ones forgotten)."""
        start = self._clock() - window_s
        while self._accepted_at and self._accepted_at[0] <= start:
            self._accepted_at.popleft()
        return len(self._accepted_at)


class Accounts:
    """The account of each provider that enforces limits, by provider name."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._accounts: dict[str, Account] = {}

    def enrol(self, provider: str) -> Account:
        """``provider``'s account (made on the first call): its module enforces limits."""
        if provider not in self._accounts:
            self._accounts[provider] = Account(self._clock)
        return self._accounts[provider]

    def get(self, provider: str) -> Account | None:
        """``provider``'s account, None when its module enforces no limits."""
        return self._accounts.get(provider)

    def __getitem__(self, provider: str) -> Account:
        return self._accounts[provider]

    def reset(self) -> None:
        """Every account back to no limits and no counts."""
        for account in self._accounts.values():
            account.reset()
