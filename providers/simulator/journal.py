"""What the simulator saw and what it will do wrong: the request journal and armed faults.

The journal records every request to a provider route *before* any fault applies, so a
test can prove "the resume never sent a second create" even when that create was reset.
A create that the provider's account limits refused is marked so once refused.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from callwarden.providers.simulator.model import Fault

__all__ = ["Faults", "Journal", "JournalEntry"]


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    provider: str
    route: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float
    fault: str | None = None  # the fault injected into this request, if any
    refused: str | None = None  # the account limit that refused it: "rate", "concurrency"

    @property
    def processed(self) -> bool:
        """Whether the provider's handler ran and did the work (a 429/5xx/reset fault
        answers without it; an account limit refuses it)."""
        return self.refused is None and self.fault in (
            None, "hang", "late", "malformed_json", "gzip_bomb")

    def json(self) -> Any:
        """The body decoded as JSON (raises ``msgspec.DecodeError`` when it is not)."""
        return msgspec.json.decode(self.body)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able view (the body as text) for the control API."""
        data = msgspec.to_builtins(self)
        data["body"] = self.body.decode("utf-8", "replace")
        return data  # type: ignore[no-any-return]


class Journal:
    """Every request to a provider route, in arrival order."""

    def __init__(self) -> None:
        self._entries: list[JournalEntry] = []

    def record(self, entry: JournalEntry) -> None:
        self._entries.append(entry)

    def refuse(self, entry: JournalEntry, reason: str) -> None:
        """Mark ``entry`` (already recorded) as refused for ``reason``; nothing when it is
        gone (a reset cleared the journal meanwhile)."""
        for index in range(len(self._entries) - 1, -1, -1):
            if self._entries[index] is entry:
                self._entries[index] = msgspec.structs.replace(entry, refused=reason)
                return

    def entries(self, provider: str | None = None, route: str | None = None) -> list[JournalEntry]:
        return [
            e for e in self._entries
            if (provider is None or e.provider == provider) and (route is None or e.route == route)
        ]

    def count(self, provider: str | None = None, route: str | None = None) -> int:
        return len(self.entries(provider, route))

    def clear(self) -> None:
        self._entries.clear()


class Faults:
    """Faults armed per (provider, route); each applies to the next ``times`` requests,
    or (``for_s``) to every request until ``clock()`` passes its end: an outage, which
    comes before any counted fault on the same route."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._armed: dict[tuple[str, str], deque[list[Any]]] = {}
        self._outages: dict[tuple[str, str], tuple[Fault, float]] = {}

    def arm(self, provider: str, route: str, fault: Fault) -> None:
        """Queue ``fault`` after any fault already armed on the same route (an outage
        replaces the route's outage, if any)."""
        if fault.for_s is not None:
            if fault.for_s > 0:
                self._outages[(provider, route)] = (fault, self.clock() + fault.for_s)
            return
        if fault.times > 0:
            self._armed.setdefault((provider, route), deque()).append([fault, fault.times])

    def outage_left_s(self, provider: str, route: str) -> float:
        """Simulated seconds until the route's outage ends (0: none)."""
        armed = self._outages.get((provider, route))
        return max(0.0, armed[1] - self.clock()) if armed else 0.0

    def take(self, provider: str, route: str) -> Fault | None:
        """The fault to apply to this request, if any (uses up one of its ``times``)."""
        outage = self._outages.get((provider, route))
        if outage is not None:
            if self.clock() < outage[1]:
                return outage[0]
            del self._outages[(provider, route)]
        queue = self._armed.get((provider, route))
        if not queue:
            return None
        slot = queue[0]
        slot[1] -= 1
        if slot[1] <= 0:
            queue.popleft()
        fault: Fault = slot[0]
        return fault

    def pending(self, provider: str | None = None) -> int:
        """How many faulty requests are still armed."""
        return sum(
            slot[1] for (p, _), q in self._armed.items() if provider in (None, p) for slot in q
        )

    def clear(self) -> None:
        self._armed.clear()
        self._outages.clear()
