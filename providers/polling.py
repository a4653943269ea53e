"""The one poll loop behind every async client's ``resume`` (never creates a task)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from providers.base import OnPoll
from providers.errors import TransientError
from providers.outcomes import PollOutcome, Running

__all__ = ["poll_until_done"]


async def poll_until_done(
    poll: Callable[[str], Awaitable[PollOutcome]],
    task_id: str,
    *,
    interval_s: float,
    budget_s: float,
    on_poll: OnPoll | None,
    sleep: Callable[[float], Awaitable[None]],
    now: Callable[[], float],
) -> PollOutcome:
    """Poll until a terminal outcome or ``budget_s`` is spent (then the last ``Running``).

    Elapsed time is the larger of the ``now`` clock and the total slept, so a fake ``sleep``
    still bounds the loop. A transient error is retried on the next tick while budget
    remains, then raised."""
    start, slept = now(), 0.0
    while True:
        try:
            outcome = await poll(task_id)
        except TransientError:
            if max(now() - start, slept) + interval_s > budget_s:
                raise
        else:
            if on_poll is not None:
                await on_poll(outcome)
            spent = max(now() - start, slept)
            if not isinstance(outcome, Running) or spent + interval_s > budget_s:
                return outcome
        await sleep(interval_s)
        slept += interval_s
