"""Bring your own call, sync kinds and streams (routes that answer from the model within
the request: an AI writer, sync and SSE), and the blocking face of
:mod:`callwarden.calls.own` for code with no event loop.

    async with calls.sync_call(job_id, "anthropic-sync") as call:   # CallStarted
        answer = await my_client.messages(...)                       # the host's own call
        call.succeeded(text=answer.text, usage={"input_tokens": ..., "output_tokens": ...})
    # exit: UpstreamSucceeded, then Completed, committed at the pricing hook's charge for
    # the usage (default: the reservation); call.outcome is the Reported outcome

While the body runs the call heartbeats every ``CallConfig.heartbeat_every_s`` (a long
stream is not taken for dead past its kind's threshold). On exit:

- a result set with ``call.succeeded(...)``: recorded and finalized (completed, commit);
- ``call.failed(error)``, or no result at all (``no_result``): failed and refunded;
- an exception: failed (its class as the code) and refunded, then re-raised;
- ``GeneratorExit`` — an async generator yielding chunks to a client was closed before it
  ended, which is what a client disconnect is to the route — failed and refunded
  (``stream_closed``); ``CancelledError`` likewise (``cancelled``). The user never got the
  whole answer; as the original design's sync sweep rules for answers that never reached the user,
  the credits go back (the upstream cost is the host's). A route that wants to charge a
  partial answer catches ``GeneratorExit`` inside the block, calls ``call.succeeded``
  with what it has and returns.

A process that dies inside leaves the call ``created`` (sync): past the kind's threshold
(or its heartbeat timeout) the reconciler sweeps it and refunds, once; so does an exit
whose write fails (the database is down: its error is raised from the block). A job that already
has a call is refused on enter (:class:`~callwarden.calls.own.CallAlreadyStarted`: the context
used twice, a redelivered route): a sync call cannot be resumed, and nothing is written.

:class:`BlockingCalls` runs the same coroutines on a private event loop in a thread it
owns, over its own pool: every write is the one write path's statement, never a copy.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec

from callwarden.calls.beat import Beat
from callwarden.calls.config import CallConfig
from callwarden.calls.own import (
    Action,
    CallAlreadyStarted,
    CallNotStarted,
    OwnCall,
    OwnCalls,
    Reported,
    WrongKind,
)
from callwarden.calls.pricing import Pricing
from callwarden.database.boundary import translated
from callwarden.database.db import Pool, open_pool
from callwarden.projections.fold import CallProjection
from callwarden.providers.base import ProviderSettings
from callwarden.providers.kinds import is_sync_call
from callwarden.providers.outcomes import Blob, Failed, PollOutcome, Succeeded, Usage
from callwarden.providers.storage import MediaStore

__all__ = ["BlockingCall", "BlockingCalls", "BlockingSyncCallContext", "SyncCall",
           "SyncCallContext", "enter_sync", "exit_sync"]

T = TypeVar("T")


class SyncCall:
    """The handle inside a sync context: set the result; ``outcome`` once it exited."""

    def __init__(self, calls: OwnCalls, job_id: uuid.UUID, kind: str,
                 projection: CallProjection) -> None:
        self.job_id, self.kind, self.projection, self._calls = job_id, kind, projection, calls
        self.usage: Usage = {}  # a stream may fill it in as usage is reported
        self.outcome: Reported | None = None
        self._result: Succeeded | Failed | None = None
        self._beat: Beat | None = None

    def succeeded(self, *, text: str | None = None, media_urls: Sequence[str] = (),
                  usage: Usage | None = None, cost: float | None = None,
                  stop_reason: str | None = None, raw: dict[str, Any] | None = None,
                  blobs: Sequence[Blob] = ()) -> None:
        """The answer, recorded on exit; ``usage`` (normalised keys) is merged into
        :attr:`usage`, which the pricing hook charges."""
        self._calls.check_media(media_urls, blobs)
        self.usage.update(usage or {})
        self._result = Succeeded(media_urls=tuple(media_urls), text=text, cost=cost,
                                 stop_reason=stop_reason, raw=dict(raw or {}),
                                 blobs=tuple(blobs))

    def failed(self, error: str, *, code: str | None = None) -> None:
        """A failure the host handled (no exception): failed and refunded on exit."""
        self._result = Failed(error=error, code=code or "host_failed")


def check_sync_kind(kind: str, operation: str | None = None) -> None:
    """Refuse a kind a sync context cannot record: a polled kind is :class:`WrongKind`,
    an unknown one ``UnknownProviderKind``."""
    if not is_sync_call(kind, operation):  # an unknown kind raises here too
        raise WrongKind(f"{kind} is polled: use start() and task_created()")


async def enter_sync(calls: OwnCalls, job_id: uuid.UUID, kind: str,
                     operation: str | None = None) -> SyncCall:
    """``CallStarted`` (sync) and the heartbeat; raises, writing nothing, unless this
    started the job's call."""
    check_sync_kind(kind, operation)
    p, here = await calls._start(job_id, kind, sync=True)
    if not here:
        if p.state is None:
            raise CallNotStarted(f"job {job_id}: no call started (host status "
                                 f"{p.status!r}, or a task from other code)", p)
        raise CallAlreadyStarted(f"job {job_id} already has a call ({p.state})", p)
    call = SyncCall(calls, job_id, kind, p)
    call._beat = calls._beat(job_id).start()
    return call


def _exit_outcome(call: SyncCall, exc: BaseException | None) -> Succeeded | Failed:
    if isinstance(exc, GeneratorExit):
        return Failed(error="the stream was closed before it ended", code="stream_closed")
    if isinstance(exc, asyncio.CancelledError):
        return Failed(error="cancelled before the call ended", code="cancelled")
    if exc is not None:
        return Failed(error=f"{type(exc).__name__}: {exc}", code=type(exc).__name__)
    if isinstance(call._result, Succeeded):
        return msgspec.structs.replace(call._result, usage=dict(call.usage))
    return call._result or Failed(error="the context exited without a result",
                                  code="no_result")


async def exit_sync(calls: OwnCalls, call: SyncCall, exc: BaseException | None) -> Reported:
    """Stop the heartbeat; record the outcome (``exc``: what ended the body) and finalize."""
    if call._beat is not None:
        await call._beat.stop()
    call.outcome = await calls.record(call.job_id, call.kind, _exit_outcome(call, exc),
                                      call.projection)
    call.projection = call.outcome.projection
    return call.outcome


class SyncCallContext:
    """``async with calls.sync_call(...)``. The exit's write runs in a task of its own
    (shielded), so a second cancellation while it runs cannot lose it."""

    def __init__(self, calls: OwnCalls, job_id: uuid.UUID, kind: str,
                 operation: str | None) -> None:
        check_sync_kind(kind, operation)  # before the host reserves, if it builds us first
        self.calls, self.job_id, self.kind, self.operation = calls, job_id, kind, operation
        self.call: SyncCall | None = None

    async def __aenter__(self) -> SyncCall:
        self.call = await enter_sync(self.calls, self.job_id, self.kind, self.operation)
        return self.call

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self.call is not None
        task = asyncio.get_running_loop().create_task(exit_sync(self.calls, self.call, exc))
        self.calls._settling.add(task)
        task.add_done_callback(self.calls._settling.discard)
        await asyncio.shield(task)


class BlockingCalls:
    """:class:`~callwarden.calls.own.OwnCalls` for blocking code: a private event loop in a
    daemon thread and a pool of ``max_size`` connections to ``url`` on it. Use it as a
    context manager (or :meth:`close` it). Not from inside its own loop's thread."""

    def __init__(self, url: str, *, media: MediaStore | None = None,
                 settings: ProviderSettings | None = None, owner: str | None = None,
                 config: CallConfig | None = None, pricing: Pricing | None = None,
                 max_size: int = 4) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="callwarden-own-calls")
        self._thread.start()
        try:
            self.pool = self._run(self._open(url, max_size))
        except BaseException:
            self._stop()
            raise
        self.calls = OwnCalls(self.pool, media=media, settings=settings, owner=owner,
                              config=config, pricing=pricing)

    @staticmethod
    async def _open(url: str, max_size: int) -> Pool:
        pool = open_pool(url, max_size=max_size, check=True)
        try:
            with translated():  # a server out of reach: DatabaseUnavailable
                await pool.open(wait=True)
        except BaseException:
            await pool.close()
            raise
        return pool

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BlockingCalls used from its own event loop: use OwnCalls")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.pool.close())
        self._stop()

    def __enter__(self) -> BlockingCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, job_id: uuid.UUID, kind: str, *,
              operation: str | None = None) -> BlockingCall:
        """:meth:`OwnCalls.start <callwarden.calls.own.OwnCalls.start>`, blocking."""
        return BlockingCall(self, self._run(self.calls.start(job_id, kind,
                                                             operation=operation)))

    def sync_call(self, job_id: uuid.UUID, kind: str, *,
                  operation: str | None = None) -> BlockingSyncCallContext:
        """``with``: the sync context, blocking (the same :class:`SyncCall` handle)."""
        return BlockingSyncCallContext(self, job_id, kind, operation)


class BlockingCall:
    """:class:`~callwarden.calls.own.OwnCall`, blocking: the same attributes and methods."""

    def __init__(self, blocking: BlockingCalls, call: OwnCall) -> None:
        self._b, self.call = blocking, call

    @property
    def job_id(self) -> uuid.UUID:
        return self.call.job_id

    @property
    def action(self) -> Action:
        return self.call.action

    @property
    def resume_task_id(self) -> str | None:
        return self.call.resume_task_id

    @property
    def task_id(self) -> str | None:
        return self.call.task_id

    @property
    def outcome(self) -> Reported | None:
        return self.call.outcome

    def task_created(self, task_id: str) -> Reported:
        return self._b._run(self.call.task_created(task_id))

    def report(self, outcome: PollOutcome) -> Reported:
        return self._b._run(self.call.report(outcome))

    def succeeded(self, *, media_urls: Sequence[str] = (), text: str | None = None,
                  cost: float | None = None, usage: Usage | None = None,
                  stop_reason: str | None = None, raw: dict[str, Any] | None = None,
                  blobs: Sequence[Blob] = ()) -> Reported:
        return self._b._run(self.call.succeeded(
            media_urls=media_urls, text=text, cost=cost, usage=usage,
            stop_reason=stop_reason, raw=raw, blobs=blobs))

    def failed(self, error: str, *, code: str | None = None) -> Reported:
        return self._b._run(self.call.failed(error, code=code))

    def not_found(self, message: str = "") -> Reported:
        return self._b._run(self.call.not_found(message))

    def finalize(self) -> Reported:
        return self._b._run(self.call.finalize())

    def heartbeat(self, progress: float | None = None) -> None:
        self._b._run(self.call.heartbeat(progress))


class BlockingSyncCallContext:
    """``with blocking.sync_call(...)``: enter and exit run on the private loop."""

    def __init__(self, blocking: BlockingCalls, job_id: uuid.UUID, kind: str,
                 operation: str | None) -> None:
        self._b, self.job_id, self.kind, self.operation = blocking, job_id, kind, operation
        self.call: SyncCall | None = None

    def __enter__(self) -> SyncCall:
        self.call = self._b._run(enter_sync(self._b.calls, self.job_id, self.kind,
                                            self.operation))
        return self.call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self.call is not None
        self._b._run(exit_sync(self._b.calls, self.call, exc))
