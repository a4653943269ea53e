"""A background loop that heartbeats until it is stopped, and always stops.

Every heartbeat loop in the engine (the runner while it stores a result's media, an own
call's ``beating()`` block, a sync call's body, the reference worker's lease keeper) is a
:class:`Beat`. Cancelling the task alone is not enough: on Python 3.11 ``asyncio.wait_for``
can swallow a cancel that arrives as its inner wait completes, and psycopg_pool waits for
a free connection that way, so a heartbeat loop cancelled while it waited for the pool ran
on after its call had ended (found by ``bench/capacity.py``: three such loops held the
pool and wrote heartbeats for finished jobs until the pool closed), and a cancel that lands
while psycopg_pool hands the waiting task a connection can leave that connection checked
out for good (the same bench: 7 of 8 connections left after a window, in 4 runs of 10).
``stop()`` therefore sets a flag the loop checks around every beat, cancels only a sleep,
and waits for a beat in flight to finish.

With the default ``sleep`` the first wait is the event loop's timer, and the loop's task is
made only when it fires: most blocks end before their first beat is due, and then stopping
is cancelling a timer (no task made, cancelled and waited for over turns of the event
loop: a runner's call starts one around its create and one around storing its media).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["Beat"]


class Beat:
    """``beat()`` every ``every_s`` seconds (``sleep`` waits) from :meth:`start` until
    :meth:`stop`, or until a beat answers ``False`` (a lease that was lost)."""

    def __init__(self, beat: Callable[[], Awaitable[bool | None]], every_s: float, *,
                 sleep: Callable[[float], Awaitable[object]] | None = None) -> None:
        """``sleep``: how the loop waits (default :func:`asyncio.sleep`, the first wait on
        the loop's timer: see the module)."""
        self._beat, self._every_s = beat, every_s
        self._sleep, self._timed = sleep or asyncio.sleep, sleep is None
        self._stopped = self._sleeping = False
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.TimerHandle | None = None

    def start(self) -> Beat:
        loop = asyncio.get_running_loop()
        if self._timed:
            self._first = loop.call_later(self._every_s, self._first_due)
        else:
            self._task = loop.create_task(self._run())
        return self

    def _first_due(self) -> None:
        self._first = None
        self._task = asyncio.get_running_loop().create_task(self._run(slept=True))

    async def _run(self, *, slept: bool = False) -> None:
        """Beat after each wait (``slept``: the first one is over) until stopped."""
        while not self._stopped:
            if not slept:
                self._sleeping = True
                try:
                    await self._sleep(self._every_s)
                finally:
                    self._sleeping = False
            slept = False
            if self._stopped or await self._beat() is False:
                return

    async def stop(self) -> None:
        """End the loop and wait for it: a sleep is cancelled, a beat in flight is left to
        finish (cancelling a task that waits for a pooled connection can lose the
        connection), and the caller's own cancellation does not reach the beat (shielded)."""
        self._stopped = True
        if self._first is not None:  # the first beat was not due yet: no task was made
            self._first.cancel()
            self._first = None
        task, self._task = self._task, None
        if task is None:
            return
        if self._sleeping:
            task.cancel()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():  # the caller's own cancellation, not the sleep's
                raise

    async def __aenter__(self) -> Beat:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
