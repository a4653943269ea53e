"""Messages the Celery broker lost, published again (``demo --queue celery``).

kombu's Redis transport takes a message off the queue with ``BRPOP`` and only then records
it in the ``unacked`` hash (``QoS.append``). A worker SIGKILLed between the two loses the
message for good (kombu#305, celery#7950): its job never gets a call, so no redelivery and
no reconciler will ever run it (the reconciler does not own the host's queue). A host on
Celery over Redis needs what this module does: publish again a job that has no call and
whose message is neither queued nor unacked, in two scans in a row. A second delivery of a
job that was not lost after all is harmless under the default ``ambiguous_create="sweep"``:
``CallStarted`` is fenced on version 0, and a delivery that finds the call ``created`` by
another leaves it to the reconciler (under ``"recreate"`` it would create again).

It reads kombu's defaults: the ``unacked`` key, the queue's priority-0 list (no
``global_keyprefix``, no priorities) and protocol 2's ``headers.id``; with other settings
every job looks missing and is published again up to :data:`MAX_REPUBLISH` times.

The decision (:func:`lost`) is pure; :class:`LostMessages` reads Redis and publishes.
arq needs none of this: a job stays in its queue until a worker finishes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import cast

__all__ = ["MAX_REPUBLISH", "LostMessages", "lost", "task_ids"]

log = logging.getLogger("callwarden.demo")
_READ_BOTH = ("return {redis.call('LRANGE', KEYS[1], 0, -1), "
              "redis.call('HVALS', KEYS[2])}")
MAX_REPUBLISH = 3  # per job: a task that fails before its call starts is not retried forever


def _task_id(message: object) -> str | None:
    if isinstance(message, dict):
        headers = message.get("headers")
        tid = headers.get("id") if isinstance(headers, dict) else None
        if isinstance(tid, str):
            return tid
    return None


def task_ids(queued: Iterable[bytes], unacked: Iterable[bytes]) -> set[str]:
    """The task ids (protocol 2's ``headers.id``) of kombu's messages: ``queued`` as the
    queue's list holds them, ``unacked`` as kombu keeps them (``[message, exchange,
    routing key]``). What does not parse is skipped: another producer's message."""
    found: set[str] = set()
    for raw, wrapped in [(m, False) for m in queued] + [(m, True) for m in unacked]:
        with contextlib.suppress(ValueError, TypeError):
            decoded = json.loads(raw)
            tid = _task_id(decoded[0] if wrapped and isinstance(decoded, list) and decoded
                           else decoded)
            if tid is not None:
                found.add(tid)
    return found


def lost(unstarted: set[str], present: set[str], suspects: set[str]
         ) -> tuple[set[str], set[str]]:
    """``(publish again, suspects for the next scan)``: a job with no call whose message
    is not ``present`` is a suspect; a suspect of the previous scan still missing is lost.
    One scan is not enough: a live worker holds a message it has just popped for a moment
    before it records it as unacked."""
    missing = unstarted - present
    return missing & suspects, missing - suspects


class LostMessages:
    """Every ``every_s``, publish again (``publish``) the jobs :func:`lost` names, each at
    most :data:`MAX_REPUBLISH` times; ``unstarted`` lists the jobs with no call yet (None
    while the database is unreachable: that scan is skipped)."""

    def __init__(self, redis_url: str, queue_name: str,
                 unstarted: Callable[[], Awaitable[set[str] | None]],
                 publish: Callable[[set[str]], None]) -> None:
        self.redis_url, self.queue_name = redis_url, queue_name
        self.unstarted, self.publish = unstarted, publish
        self.republished: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.republished.values())

    def _present(self) -> set[str]:
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2,
                                      socket_timeout=2)
        try:
            # One script, so both reads are atomic: a restore (unacked -> list, itself a
            # transaction) cannot fall between them and hide its message from both.
            queued, unacked = cast(tuple[list[bytes], list[bytes]], client.eval(
                _READ_BOTH, 2, self.queue_name, "unacked"))
        finally:
            client.close()
        return task_ids(queued, unacked)

    async def scan(self, suspects: set[str]) -> set[str]:
        """One scan: publish again what :func:`lost` names; returns the new suspects.
        It never raises: a failure is logged and the next scan tries again (a watch that
        died in the background would leave every later loss unseen)."""
        try:
            unstarted = await self.unstarted()
            if unstarted is None:
                return suspects
            present = await asyncio.to_thread(self._present)
            again, following = lost(unstarted, present, suspects)
            again = {j for j in again if self.republished.get(j, 0) < MAX_REPUBLISH}
            if again:
                log.warning("lost messages: %d job(s) with no call and no message (a "
                            "worker killed between BRPOP and unacked): publishing again: "
                            "%s", len(again), ", ".join(sorted(again)))
                await asyncio.to_thread(self.publish, again)
                for j in again:
                    self.republished[j] = self.republished.get(j, 0) + 1
        except Exception as exc:  # Redis, kombu's publish, the database: log, go on
            log.warning("lost messages: scan failed, the next one tries again: %s: %s",
                        type(exc).__name__, exc)
            return suspects  # a job it failed to publish is still a suspect
        return following

    async def run(self, stop: asyncio.Event, every_s: float = 2.0) -> None:
        suspects: set[str] = set()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                return
            suspects = await self.scan(suspects)
