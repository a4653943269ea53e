"""callwarden.calls.beat.Beat: a heartbeat loop ends when it is stopped, and stopping it
never cancels a beat in flight (a cancelled wait for a pooled connection could lose the
connection, or be swallowed by Python 3.11's ``asyncio.wait_for`` and leave the loop
running)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from callwarden.calls.beat import Beat


async def no_wait(_: float) -> None:
    await asyncio.sleep(0)


async def settle() -> None:
    """Give every ready task many turns (a loop that survived would beat again)."""
    for _ in range(50):
        await asyncio.sleep(0)


class HeldBeat:
    """A beat that waits for ``release`` and counts the beats begun, ended and cancelled."""

    def __init__(self) -> None:
        self.begun = self.ended = self.cancelled = 0
        self.in_flight, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self) -> None:
        self.begun += 1
        self.in_flight.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.ended += 1


#: The loop's waits: a sleep of its own, or the default (the first one on the loop's timer).
SLEEPS = pytest.mark.parametrize("sleep", [no_wait, None], ids=["own_sleep", "timer"])


@SLEEPS
async def test_stop_lets_the_beat_in_flight_finish_and_no_other_starts(
        sleep: Callable[[float], Awaitable[None]] | None) -> None:
    """``stop()`` during a beat does not cancel it: the beat completes (it saw no
    CancelledError), ``stop()`` returns once it has, and no further beat runs."""
    beat = HeldBeat()
    loop = Beat(beat, 0.0, sleep=sleep).start()
    await beat.in_flight.wait()
    stopping = asyncio.ensure_future(loop.stop())
    await settle()
    assert not stopping.done()  # waits for the beat in flight
    beat.release.set()
    await asyncio.wait({stopping}, timeout=5)
    assert stopping.done(), "stop() did not return after the beat finished"
    await settle()
    assert (beat.begun, beat.ended, beat.cancelled) == (1, 1, 0)


@SLEEPS
async def test_a_cancelled_caller_does_not_cancel_the_beat_in_flight(
        sleep: Callable[[float], Awaitable[None]] | None) -> None:
    """The task that stops the loop being cancelled (a worker shutting down) is not
    passed on to the beat: it still completes, and the loop still ends."""
    beat = HeldBeat()
    loop = Beat(beat, 0.0, sleep=sleep).start()
    await beat.in_flight.wait()
    task = loop._task
    assert task is not None
    stopping = asyncio.ensure_future(loop.stop())
    await settle()
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    beat.release.set()
    await asyncio.wait({task}, timeout=5)
    assert (beat.ended, beat.cancelled, task.done()) == (1, 0, True)


async def test_stop_during_the_sleep_ends_the_loop_at_once() -> None:
    """A loop asleep for an hour is stopped without waiting it out, and never beats."""
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1

    loop = Beat(beat, 3600.0).start()
    await settle()
    await asyncio.wait_for(loop.stop(), timeout=5)
    assert beats == 0


async def test_a_beat_answering_false_ends_the_loop() -> None:
    """A beat that answers ``False`` (the worker's lease was lost) is the last one."""
    beats = 0

    async def beat() -> bool:
        nonlocal beats
        beats += 1
        return beats < 3

    loop = Beat(beat, 0.0, sleep=no_wait).start()
    task = loop._task
    assert task is not None
    await asyncio.wait({task}, timeout=5)
    assert task.done()
    await loop.stop()
    assert beats == 3


async def test_the_timer_makes_no_task_before_the_first_beat_then_beats_until_stopped() -> None:
    """With the default sleep no task is made until the first beat is due (a block that
    ends before it only cancels a timer); from then on the loop beats every ``every_s``
    until it is stopped, and not after."""
    beats = 0
    three = asyncio.Event()

    async def beat() -> None:
        nonlocal beats
        beats += 1
        if beats == 3:
            three.set()

    idle = Beat(beat, 3600.0).start()
    assert idle._task is None
    await idle.stop()
    loop = Beat(beat, 0.001).start()
    assert loop._task is None
    await asyncio.wait_for(three.wait(), timeout=5)
    task = loop._task
    assert task is not None
    await asyncio.wait_for(loop.stop(), timeout=5)
    # its task ended and no timer is left: no beat can come after the stop
    assert task.done()
    assert (loop._task, loop._first) == (None, None)
