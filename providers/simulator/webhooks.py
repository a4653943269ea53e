"""Outgoing callbacks: background POSTs with retries, duplicates, drops and reordering.

Each :meth:`Webhooks.deliver` runs as a background task that the simulator tracks and
cancels on close. Every attempt (and every decision not to send) is recorded in
``deliveries``; tests wait on them with :meth:`Webhooks.wait_for` (an
``asyncio.Condition``, no polling) or :meth:`Webhooks.drain`.

Retries follow the provider's own schedule when one is given (``schedule``: the delays
before each retry, in simulated seconds — KIE's 1, 5 and 15 minutes; Replicate's backoff),
waited on the simulator's clock (real time at its factor, times ``schedule_scale``, which
a demo sets to compress minutes into seconds); otherwise a short exponential backoff.
``headers`` may be a function of the attempt's timestamp: then every attempt, retries
included, is signed afresh with its own timestamp, as the providers do. Which failures
are retried (``retry_on``) and how long the provider waits for an answer (``timeout_s``:
KIE 15 s) are per delivery too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import msgspec

from callwarden.providers.simulator.model import Clock, WebhookPlan

__all__ = ["Delivery", "Outcome", "RetryOn", "Sign", "Webhooks", "retry_any_failure",
           "retry_server_errors"]

Outcome = Literal["delivered", "rejected", "error", "dropped", "simulated_failure"]
Sign = Callable[[int], dict[str, str]]
"""The headers of one attempt, signed at its (simulated, unix seconds) timestamp."""
RetryOn = Callable[[int | None], bool]
"""Whether a failed attempt (its status; ``None``: no answer) is retried."""


def _fixed(headers: Mapping[str, str]) -> Sign:
    copy = dict(headers)

    def sign(_ts: int) -> dict[str, str]:
        return copy
    return sign


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def retry_any_failure(status: int | None) -> bool:
    """Retry after no answer or any non-2xx answer (Replicate, KIE)."""
    return True


def retry_server_errors(status: int | None) -> bool:
    """Retry after no answer or a 5xx only: a 4xx is final (ElevenLabs' STT webhooks)."""
    return status is None or status >= 500


@dataclass(frozen=True)
class _Policy:
    retries: int
    delays: list[float] | None
    timeout_s: float
    retry_on: RetryOn


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """One delivery attempt. ``status`` is the receiver's HTTP status (None when nothing
    was sent or the connection failed); ``attempt`` counts from 1 (0 for a drop)."""

    url: str
    status: int | None
    attempt: int
    outcome: Outcome
    body: bytes
    headers: dict[str, str]
    at: float
    duplicate: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "delivered"


class Webhooks:
    """Schedules callback deliveries and records what happened to each attempt."""

    def __init__(self, clock: Clock, *, retry_base_s: float = 0.05, hold_s: float = 0.3,
                 timeout_s: float = 5.0, schedule_scale: float = 1.0) -> None:
        self._clock = clock
        self.retry_base_s = retry_base_s
        self.hold_s = hold_s
        self.timeout_s = timeout_s
        self.schedule_scale = schedule_scale
        self.deliveries: list[Delivery] = []
        self._cond = asyncio.Condition()
        self._sent: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def deliver(self, url: str, body: bytes, headers: Mapping[str, str] | Sign,
                plan: WebhookPlan, *, retries: int = 3,
                schedule: Sequence[float] | None = None, timeout_s: float | None = None,
                retry_on: RetryOn = retry_any_failure) -> None:
        """Schedule a POST of ``body`` to ``url``; retried ``retries`` times, or once per
        delay of ``schedule`` (simulated seconds) when given, after each attempt whose
        answer ``retry_on`` says to retry (its status; ``None``: no answer). ``headers``:
        fixed, or signed per attempt (a :data:`Sign`). ``timeout_s``: how long the
        provider waits for an answer (default: this instance's)."""
        sign: Sign = headers if callable(headers) else _fixed(headers)
        delays = list(schedule) if schedule is not None else None
        policy = _Policy(retries if delays is None else len(delays), delays,
                         timeout_s if timeout_s is not None else self.timeout_s, retry_on)
        self._spawn(self._run(url, body, sign, plan, policy))

    async def wait_for(self, count: int, timeout: float = 5.0, *,  # noqa: ASYNC109
                       outcome: Outcome | None = None) -> list[Delivery]:
        """Wait until ``count`` recorded attempts (with ``outcome`` if given) exist."""
        def matching() -> list[Delivery]:
            return [d for d in self.deliveries if outcome is None or d.outcome == outcome]

        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: len(matching()) >= count),
                                   timeout)
            return matching()

    async def drain(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until every scheduled delivery (with its retries) has finished."""
        while self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending:
                raise TimeoutError(f"{len(pending)} webhook deliveries still running")

    def reset(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.deliveries.clear()
        self._sent.clear()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _now(self) -> int:
        return int(self._clock.now())

    async def _run(self, url: str, body: bytes, sign: Sign, plan: WebhookPlan,
                   policy: _Policy) -> None:
        if plan.drop:
            await self._record(url, None, 0, "dropped", body, sign(self._now()))
            return
        if plan.out_of_order:
            await self._hold(url)
        if await self._attempts(url, body, sign, plan, policy):
            for _ in range(plan.duplicates):
                await self._post(url, body, sign(self._now()), attempt=1,
                                 timeout_s=policy.timeout_s, duplicate=True)

    async def _hold(self, url: str) -> None:
        """Hold this delivery until another one to ``url`` was sent (or ``hold_s``)."""
        async with self._cond:
            seen = self._sent.get(url, 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: self._sent.get(url, 0) > seen), self.hold_s)

    async def _attempts(self, url: str, body: bytes, sign: Sign, plan: WebhookPlan,
                        policy: _Policy) -> bool:
        for attempt in range(1, policy.retries + 2):
            headers = sign(self._now())  # each attempt signed with its own timestamp
            status: int | None = None
            if attempt <= plan.fail_first:
                await self._record(url, None, attempt, "simulated_failure", body, headers)
            else:
                status = await self._post(url, body, headers, attempt=attempt,
                                          timeout_s=policy.timeout_s)
                if _ok(status):
                    return True
            if attempt > policy.retries or not policy.retry_on(status):
                return False
            await self._pause(attempt, policy.delays)
        return False

    async def _pause(self, attempt: int, delays: list[float] | None) -> None:
        if delays is None:
            await asyncio.sleep(self.retry_base_s * 2 ** (attempt - 1))
        else:
            await self._clock.sleep(delays[attempt - 1], scale=self.schedule_scale)

    async def _post(self, url: str, body: bytes, headers: dict[str, str], *, attempt: int,
                    timeout_s: float, duplicate: bool = False) -> int | None:
        """POST once; the answer's status (``None``: no answer in ``timeout_s``)."""
        status: int | None = None
        try:
            async with self._client().post(
                url, data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError):
            pass
        outcome: Outcome = ("delivered" if _ok(status)
                            else ("error" if status is None else "rejected"))
        await self._record(url, status, attempt, outcome, body, headers, duplicate=duplicate)
        return status

    async def _record(self, url: str, status: int | None, attempt: int, outcome: Outcome,
                      body: bytes, headers: dict[str, str], *, duplicate: bool = False) -> None:
        delivery = Delivery(url=url, status=status, attempt=attempt, outcome=outcome,
                            body=body, headers=headers, at=self._clock.now(),
                            duplicate=duplicate)
        async with self._cond:
            self.deliveries.append(delivery)
            if outcome in ("delivered", "rejected"):
                self._sent[url] = self._sent.get(url, 0) + 1
            self._cond.notify_all()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

