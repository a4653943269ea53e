"""Bring your own call: host code that makes the provider request itself (its own HTTP
client) still records every transition through the fenced write path, as ``CallRunner``
does. Async kinds here; sync and streaming calls, and the blocking face for code without
an event loop, in :mod:`callwarden.calls.own_sync`. docs/embedding.md has worked examples.

Async kinds (a handler that creates and polls its own task)::

    calls = OwnCalls(pool, media=media, settings=settings)   # one per process
    call = await calls.start(job_id, "kie-standard")          # CallStarted, before the create
    if call.action == "create":
        await call.task_created(await my_kie.create_task(...))  # TaskCreated
    elif call.action != "resume":
        return                                  # see the actions below
    data = await my_kie.poll_until_done(call.task_id)  # or CallRunner.run resumes it
    await call.succeeded(media_urls=data.urls)         # UpstreamSucceeded, then finalized

``call.action`` tells the host what to do next; a redelivery is never told to create:

- ``create``: this start recorded ``CallStarted``; make the create request.
- ``resume``: the job holds task ``call.resume_task_id``; poll it, never create another.
- ``ambiguous``: a call started earlier has no task id (the create's answer was lost, or
  it is in flight elsewhere). ``CallConfig.ambiguous_create="sweep"`` (the default, as the
  runner): do nothing, the reconciler sweeps and refunds it; ``"recreate"`` answers
  ``create`` instead (risking paying the provider twice).
- ``finalize``: upstream already succeeded; ``await call.finalize()``.
- ``done``: terminal; ``call.outcome`` says how it ended.
- ``not_started``: the host ended the job, or other code put a task on the row (the
  reconciler adopts it); nothing was written.

A create the provider refused (a 4xx, a rate limit: nothing exists upstream) is
``await call.failed(...)`` (refunded); one whose answer was lost (a timeout, a 5xx) is left
alone: the reconciler sweeps it. Outcomes are finalized by the runner's
:class:`~callwarden.calls.finalize.Finalizer` (media downloaded and stored, committed at the
pricing hook's charge, default the reservation).

Bad input raises before anything is written: another task id than the job holds is
:class:`TaskIdConflict` (one that *another job* holds: ``TaskAlreadyClaimed``); the wrong
kind, :class:`WrongKind`. A report on a call already terminal (a webhook, the reconciler
or a cancel got there first) is a race, not a bug: ``ok=False`` with the terminal result,
nothing written. The same task id reported twice is ``ok=False`` too.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from callwarden.calls.beat import Beat
from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.identity import incarnation
from callwarden.calls.inline import store_inline
from callwarden.calls.pricing import Pricing
from callwarden.calls.runner import ACTIVE, CallOutcome, Result, call_outcome
from callwarden.database.clock import Clock, DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.port import Database
from callwarden.database.postgres import as_database
from callwarden.database.write import AppendResult, Decide
from callwarden.errors import (
    CallAlreadyStarted,
    CallNotStarted,
    CallWaiting,
    ConfigError,
    DatabaseError,
    OwnCallError,
    TaskIdConflict,
    WrongKind,
)
from callwarden.events.states import CallState
from callwarden.events.types import CallStarted, Event, TaskCreated
from callwarden.projections.fold import EMPTY, CallProjection
from callwarden.providers.base import ProviderSettings
from callwarden.providers.kinds import is_sync_call
from callwarden.providers.outcomes import (
    Blob,
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
    Usage,
)
from callwarden.providers.storage import MediaStore, StoredObject
from callwarden.rules.upstream import upstream_event
from callwarden.rules.waits import rate_limited_error, rate_limited_pause

if TYPE_CHECKING:
    from callwarden.calls.own_sync import SyncCallContext

__all__ = ["Action", "CallAlreadyStarted", "CallNotStarted", "OwnCall", "OwnCallError",
           "OwnCalls", "Reported", "TaskIdConflict", "WrongKind"]

log = logging.getLogger("callwarden.calls")
Action = Literal["create", "resume", "ambiguous", "finalize", "done", "not_started"]
_OPEN_RESULT = (CallState.UPSTREAM_SUCCEEDED, CallState.FINALIZING)


class Reported(CallOutcome, frozen=True, kw_only=True):
    """A :class:`~callwarden.calls.runner.CallOutcome` plus ``ok``: this report's event was
    appended (``False``: someone else's write stood first, e.g. the call was terminal)."""

    ok: bool = False


def _reported(ok: bool, job_id: uuid.UUID, p: CallProjection, detail: str | None = None,
              pending: Result = "left_for_reconciler") -> Reported:
    if not ok and detail is None:
        detail = f"nothing recorded: the call is {p.state or 'not started'}"
    o = call_outcome(job_id, p, detail, pending)
    return Reported(ok=ok, job_id=job_id, result=o.result, projection=p, detail=o.detail)


class _NoMedia:
    """The finalizer's media store when the host gave none: only text results can be kept."""

    async def put(self, key: str, data: bytes, content_type: str) -> StoredObject:
        raise ConfigError("no media store: OwnCalls(media=...) keeps media results")

    async def get(self, key: str) -> bytes:
        raise ConfigError("no media store")

    async def head(self, key: str) -> StoredObject:
        raise ConfigError("no media store")

    async def exists(self, key: str) -> bool:
        return False


class OwnCalls:
    """Records host-made calls for one process incarnation (``owner``). ``db``: the
    database the calls are recorded in (a pool, or a
    :class:`~callwarden.database.port.Database`); ``media`` and ``settings`` are the
    finalizer's (media results are downloaded from the kind's media hosts and stored in
    ``media``); ``pricing`` charges completed calls (default: the reservation)."""

    def __init__(self, db: Pool | Database, *, media: MediaStore | None = None,
                 settings: ProviderSettings | None = None, owner: str | None = None,
                 clock: Clock | None = None, config: CallConfig | None = None,
                 pricing: Pricing | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.db: Database = as_database(db)
        self.media = media
        self.settings = settings or ProviderSettings()
        self.owner = owner or incarnation("worker")
        self.clock = clock if clock is not None else DatabaseClock()
        self.config, self.sleep = config or CallConfig(), sleep
        self.finalizer = Finalizer(self.db, media or _NoMedia(), self.settings,
                                   owner=self.owner, clock=self.clock, config=self.config,
                                   pricing=pricing)
        self._settling: set[asyncio.Task[Reported]] = set()

    async def aclose(self) -> None:
        """Close the media connections its finalizer keeps between finalizations."""
        await self.finalizer.aclose()

    async def start(self, job_id: uuid.UUID, kind: str, *,
                    operation: str | None = None) -> OwnCall:
        """Register an async call before its create request (see the module docstring)."""
        if is_sync_call(kind, operation):  # an unknown kind raises here, nothing written
            raise WrongKind(f"{kind} is a sync call: use sync_call()")
        p, here = await self._start(job_id, kind, sync=False)
        if not here and p.state is not None and p.provider_kind not in (None, kind):
            raise WrongKind(f"job {job_id} has a {p.provider_kind} call, not {kind}", p)
        action: Action
        if here or (p.state is CallState.CREATED and self.config.policy_for(kind) == "recreate"):
            action = "create"
        elif p.state is CallState.CREATED:
            action = "ambiguous"
        elif p.state is CallState.POLLING:
            action = "resume"
        elif p.state in _OPEN_RESULT:
            action = "finalize"
        else:
            action = "done" if p.terminal else "not_started"
        return OwnCall(self, job_id, kind, p, action)

    def sync_call(self, job_id: uuid.UUID, kind: str, *,
                  operation: str | None = None) -> SyncCallContext:
        """``async with``: a sync or streaming call (:mod:`callwarden.calls.own_sync`). The
        kind is checked here, so a host that builds the context before it reserves
        credits never reserves for a kind that cannot be recorded (``WrongKind``)."""
        from callwarden.calls.own_sync import SyncCallContext  # it imports this module

        return SyncCallContext(self, job_id, kind, operation)

    async def record(self, job_id: uuid.UUID, kind: str, outcome: PollOutcome,
                     current: CallProjection | None = None) -> Reported:
        """Record an upstream outcome on an open call, then finalize a success."""
        if isinstance(outcome, Succeeded):
            self.check_media(outcome.media_urls, outcome.blobs)
        outcome, keys = await store_inline(self.media or _NoMedia(), job_id, kind, outcome,
                                           settings=self.settings, config=self.config)
        event = upstream_event(outcome, self.owner, self.clock(), stored_keys=keys)
        if event is None or isinstance(outcome, Running):  # a heartbeat, no event
            if await self.heartbeat(job_id, outcome.progress if isinstance(outcome, Running)
                                    else None):
                return _reported(False, job_id, current or EMPTY, "still running",
                                 "still_running")
            # no longer polled: ended under the host's poll (a cancel, the reconciler, the
            # host's status), or its result recorded: say how it stands, so that the
            # host's loop stops rather than poll a settled call
            p = await self.db.load(job_id)
            return _reported(False, job_id, p, f"the call is {p.state or 'not started'}: "
                                               "no longer polled")
        r = await self.transition(job_id, lambda q: event if q.state in ACTIVE else None,
                                  current)
        if r.projection.state in _OPEN_RESULT:
            done = await self.finalizer.finalize(job_id, current=r.projection)
            return _reported(r.ok, job_id, done.projection, done.error or done.outcome)
        return _reported(r.ok, job_id, r.projection)

    def check_media(self, media_urls: Sequence[str], blobs: Sequence[Blob]) -> None:
        if self.media is None and (media_urls or blobs):
            raise ConfigError("a media result needs a media store: OwnCalls(media=...)")

    async def heartbeat(self, job_id: uuid.UUID, progress: float | None = None) -> bool:
        """Projection-only: the call is alive (never an event; a failure is logged).
        ``False``: the call is no longer one to poll (it ended, or its result is
        recorded); a heartbeat that failed is taken as alive."""
        try:
            return await self.db.heartbeat(job_id, self.owner,
                                           int(progress) if progress is not None else None)
        except DatabaseError as exc:
            log.warning("job %s: heartbeat not written (%s)", job_id, exc)
            return True

    async def transition(self, job_id: uuid.UUID, decide: Decide,
                         current: CallProjection | None = None) -> AppendResult:
        return await self.db.transition(job_id, decide, current=current)

    async def _start(self, job_id: uuid.UUID, kind: str,
                     sync: bool) -> tuple[CallProjection, bool]:
        """``CallStarted`` as if new; :class:`CallWaiting` when the account's limits
        refuse it."""
        await self.db.sync_clock(self.clock)
        event = CallStarted(at=self.clock(), actor=self.owner, kind=kind, sync=sync)
        r = await self.db.append(job_id, EMPTY, event)
        if r.waiting is not None:
            raise CallWaiting(r.waiting.reason, r.waiting.retry_after_s, r.projection)
        return r.projection, r.ok

    def _beat(self, job_id: uuid.UUID) -> Beat:
        """The call's heartbeat loop while the host's own code runs (not yet started)."""
        return Beat(lambda: self.heartbeat(job_id), self.config.heartbeat_every_s,
                    sleep=self.sleep)


class OwnCall:
    """One async call the host makes itself; every method writes through the fenced path
    and returns a :class:`Reported`."""

    def __init__(self, calls: OwnCalls, job_id: uuid.UUID, kind: str,
                 projection: CallProjection, action: Action) -> None:
        self.calls, self.job_id, self.kind = calls, job_id, kind
        self.projection, self.action = projection, action
        self.resume_task_id = projection.provider_task_id if action == "resume" else None
        self.outcome: Reported | None = (_reported(False, job_id, projection)
                                         if action == "done" else None)
        self._rate_until: float | None = None  # the 429 wait's end (rate_limited)

    @property
    def task_id(self) -> str | None:
        """The upstream task id recorded on the job (``None`` before ``task_created``)."""
        return self.projection.provider_task_id

    async def task_created(self, task_id: str) -> Reported:
        """``TaskCreated``, right after the create answered (the task id it gave).
        The same id twice is ``ok=False`` (nothing written); another is
        :class:`TaskIdConflict`; a call already terminal is ``ok=False``."""
        if not task_id:
            raise TaskIdConflict("an empty task id", self.projection)
        event = TaskCreated(at=self.calls.clock(), actor=self.calls.owner, task_id=task_id)

        def decide(p: CallProjection) -> Event | None:
            if p.provider_task_id not in (None, task_id):
                raise TaskIdConflict(f"job {self.job_id} holds task {p.provider_task_id}, "
                                     f"not {task_id}", p)
            return event if p.state is CallState.CREATED else None

        r = await self.calls.transition(self.job_id, decide, self.projection)
        return self._keep(_reported(r.ok, self.job_id, r.projection, pending="still_running"))

    async def report(self, outcome: PollOutcome) -> Reported:
        """The host's own poll answered: ``Running`` (a heartbeat), ``Succeeded``,
        ``Failed`` or ``NotFound`` (swept); a result is finalized by the Finalizer."""
        return self._keep(await self.calls.record(self.job_id, self.kind, outcome,
                                                  self.projection))

    async def succeeded(self, *, media_urls: Sequence[str] = (), text: str | None = None,
                        cost: float | None = None, usage: Usage | None = None,
                        stop_reason: str | None = None, raw: dict[str, Any] | None = None,
                        blobs: Sequence[Blob] = ()) -> Reported:
        """Upstream succeeded (``usage``: normalised keys for the pricing hook; ``cost``:
        what the provider reported, in its units): record it, then finalize."""
        return await self.report(Succeeded(
            media_urls=tuple(media_urls), text=text, cost=cost, usage=dict(usage or {}),
            stop_reason=stop_reason, raw=dict(raw or {}), blobs=tuple(blobs)))

    async def failed(self, error: str, *, code: str | None = None) -> Reported:
        """Upstream failed, or the create was refused: failed and refunded."""
        return await self.report(Failed(error=error, code=code))

    async def rate_limited(self, retry_after_s: float | None = None, *,
                           error: str = "the provider refused the create (429)"
                           ) -> float | None:
        """The provider refused the create with 429: nothing was created. When a
        ``[limits]`` account names the kind, the whole fleet's account pauses and slows
        (``callwarden.slow_down``: docs/admission.md) and this answers the seconds to wait
        before creating again (``retry_after_s``: the provider's Retry-After, if it sent
        one), while ``CallConfig.rate_limited_wait_s`` lasts from the first 429; ``None``
        when the call was failed and refunded instead (no limit names the kind, or the
        wait ran out: ``error``, naming the account)::

            while True:
                try:
                    task = await my_client.create(prompt)
                except MyRateLimited as exc:
                    if (wait := await call.rate_limited(exc.retry_after)) is None:
                        return
                    await asyncio.sleep(wait)
                else:
                    break
        """
        now = time.monotonic()
        if self._rate_until is None:
            self._rate_until = now + self.calls.config.rate_limited_wait_s
        slowed = await self.calls.db.slow_down(self.kind, retry_after_s)
        if slowed is not None:
            pause = rate_limited_pause(slowed.paused_s, retry_after_s)
            if now + pause <= self._rate_until:
                return pause
            error = rate_limited_error(error, slowed.account,
                                       self.calls.config.rate_limited_wait_s)
        await self.failed(error, code="rate_limited")
        return None

    async def not_found(self, message: str = "") -> Reported:
        """The provider does not know the task: swept and refunded."""
        return await self.report(NotFound(message=message))

    async def finalize(self) -> Reported:
        """Finalize a result already recorded (``action == "finalize"``)."""
        done = await self.calls.finalizer.finalize(self.job_id, current=self.projection)
        return self._keep(_reported(done.outcome == "completed", self.job_id,
                                    done.projection, done.error or done.outcome))

    async def heartbeat(self, progress: float | None = None) -> None:
        """While the host polls: the call is alive (projection only)."""
        await self.calls.heartbeat(self.job_id, progress)

    @asynccontextmanager
    async def beating(self) -> AsyncIterator[OwnCall]:
        """Heartbeat every ``CallConfig.heartbeat_every_s`` while the block runs (the
        host's own poll loop), so a worker killed inside it is taken over after the
        heartbeat timeout, not the kind's threshold (``TaskCreated`` was the first beat)::

            async with call.beating():
                data = await my_client.poll_until_done(call.task_id)
            await call.succeeded(media_urls=data.urls)
        """
        async with self.calls._beat(self.job_id):
            yield self

    def _keep(self, r: Reported) -> Reported:
        if r.projection is not EMPTY:
            self.projection = r.projection
        self.outcome = r
        return r
