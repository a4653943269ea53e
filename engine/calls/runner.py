"""The worker API: run one job's external call durably, in a few lines of any handler.

    async with CallRunner(pool, session, settings, media) as runner:
        outcome = await runner.run(job_id, "kie-standard", {"model": ..., "input": {...}})

(``async with``, or ``await runner.aclose()``, closes the media connections the runner
keeps between finalizations.)

Async kinds: record ``CallStarted`` *before* the create request, create, record
``TaskCreated``, poll (heartbeat and progress go to projection columns, not events),
record the outcome, finalize. If the job already has a task id (a redelivery, a second
worker), it polls that task and never creates another. A call left ``created`` without a
task id by a crash inside the create request is the one ambiguous window: by default it is
left for the reconciler to sweep and refund (``ambiguous_create="recreate"`` opts into
creating again). A terminal call returns its outcome without touching the provider.
Sync kinds: record ``CallStarted``, call, record the outcome, complete.
No queue library is assumed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import aiohttp
import msgspec

from callwarden.calls.beat import Beat
from callwarden.calls.config import CallConfig
from callwarden.calls.failpoints import failpoint
from callwarden.calls.finalize import Finalizer, FinalizeResult
from callwarden.calls.identity import incarnation
from callwarden.calls.inline import store_inline
from callwarden.calls.pricing import Pricing
from callwarden.database.clock import Clock, DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.port import Database
from callwarden.database.postgres import as_database
from callwarden.database.write import Decide
from callwarden.errors import DatabaseError
from callwarden.events.states import CallState
from callwarden.events.types import (
    CallStarted,
    Event,
    TaskCreated,
    UpstreamFailed,
    UpstreamSucceeded,
)
from callwarden.observe.tracing import call_context
from callwarden.projections.fold import EMPTY, CallProjection
from callwarden.providers.base import AsyncKindClient, ProviderSettings, SyncKindClient
from callwarden.providers.closing import AsyncClosing
from callwarden.providers.errors import (
    MediaExpired,
    NotSent,
    ProviderError,
    RateLimited,
    StorageError,
    TransientError,
)
from callwarden.providers.kinds import get_kind, is_sync_call
from callwarden.providers.outcomes import Failed, PollOutcome, Running
from callwarden.providers.registry import client_for
from callwarden.providers.storage import MediaStore
from callwarden.rules.upstream import upstream_event
from callwarden.rules.waits import rate_limited_error, rate_limited_pause

__all__ = ["ACTIVE", "CallOutcome", "CallRunner", "call_outcome"]

log = logging.getLogger("callwarden.calls")
T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Result = Literal["completed", "failed", "swept", "exhausted", "cancelled",
                 "left_for_reconciler", "still_running", "waiting"]
ACTIVE = (CallState.CREATED, CallState.POLLING)
_TERMINAL_RESULT: dict[CallState, Result] = {
    CallState.COMPLETED: "completed", CallState.FAILED: "failed", CallState.SWEPT: "swept",
    CallState.EXHAUSTED: "exhausted", CallState.CANCELLED: "cancelled"}


class CallOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """``waiting``: the account's limits refused the start (nothing was written; ``detail``
    names the limit): run the job again after ``retry_after_s``, which its queue does
    without counting a delivery (docs/admission.md)."""

    job_id: uuid.UUID
    result: Result
    projection: CallProjection
    detail: str | None = None
    retry_after_s: float | None = None


def call_outcome(job_id: uuid.UUID, p: CallProjection, detail: str | None = None,
                 pending: Result = "left_for_reconciler") -> CallOutcome:
    """The outcome a caller sees for ``p`` (``pending``: the result while it is open)."""
    result = _TERMINAL_RESULT.get(p.state, pending) if p.state is not None else pending
    return CallOutcome(job_id=job_id, result=result, projection=p, detail=detail)


class CallRunner(AsyncClosing):
    """Runs calls for one process incarnation (``owner``). ``db``: the database the calls are
    recorded in (a :data:`~callwarden.database.db.Pool`, or a
    :class:`~callwarden.database.port.Database`); ``media``: where media results are stored;
    ``monotonic``: the clock the poll budget and the heartbeat cadence are measured on."""

    def __init__(self, db: Pool | Database, session: aiohttp.ClientSession,
                 settings: ProviderSettings, media: MediaStore, *, owner: str | None = None,
                 clock: Clock | None = None, config: CallConfig | None = None,
                 sleep: Sleep = asyncio.sleep,
                 callback_url: Callable[[uuid.UUID, str], str | None] | None = None,
                 pricing: Pricing | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.db: Database = as_database(db)
        self.session, self.settings, self.media = session, settings, media
        self.monotonic = monotonic
        self.owner = owner or incarnation("worker")
        self.clock = clock if clock is not None else DatabaseClock()
        self.config, self.sleep = config or CallConfig(), sleep
        self.callback_url = callback_url
        self.finalizer = Finalizer(self.db, media, settings, owner=self.owner,
                                   clock=self.clock, config=self.config, pricing=pricing)
        self._last_beat: dict[uuid.UUID, float] = {}

    async def aclose(self) -> None:
        """Close the media connections kept between finalizations (``async with`` does it
        too; the host's own ``session`` is the host's to close)."""
        await self.finalizer.aclose()

    async def run(self, job_id: uuid.UUID, kind: str, request: Mapping[str, Any], *,
                  operation: str | None = None) -> CallOutcome:
        """Run (or resume, or report) the job's call; see the module docstring."""
        try:
            with call_context(job_id, kind):
                return await self._run(job_id, kind, request, operation)
        finally:
            self._last_beat.pop(job_id, None)

    async def _run(self, job_id: uuid.UUID, kind: str, request: Mapping[str, Any],
                   operation: str | None) -> CallOutcome:
        get_kind(kind)  # an unknown kind is refused before anything is written
        await self.db.sync_clock(self.clock)
        sync = is_sync_call(kind, operation)
        client = client_for(kind, self.session, self.settings, operation=operation,
                            callback_url=self._callback(job_id, kind))
        failpoint("before_call_started")
        # optimistically started as if new (one statement, fenced on version 0, admitted by
        # the account's limits); otherwise the append re-reads and we go on from there
        started = await self.db.append(job_id, EMPTY, CallStarted(
            at=self.clock(), actor=self.owner, kind=kind, sync=sync))
        if started.waiting is not None:
            return CallOutcome(job_id=job_id, result="waiting", projection=started.projection,
                               detail=started.waiting.reason,
                               retry_after_s=started.waiting.retry_after_s)
        p, started_here = started.projection, started.ok
        if p.terminal:
            return call_outcome(job_id, p)
        if p.state is None:  # the host ended the job, or another system's task is on it
            return call_outcome(job_id, p, f"not started: the host's status is {p.status!r}, or "
                                       "the row holds a task from other code (the "
                                       "reconciler adopts it)")
        if sync:
            if started_here:
                return await self._run_sync(job_id, kind, cast(SyncKindClient, client),
                                            request, p)
            return await self._after_upstream(job_id, p, "sync call interrupted")
        return await self._run_async(job_id, kind, p, cast(AsyncKindClient, client), request,
                                     started_here)

    # -- async kinds ------------------------------------------------------------------

    async def _run_async(self, job_id: uuid.UUID, kind: str, p: CallProjection,
                         client: AsyncKindClient, request: Mapping[str, Any],
                         started_here: bool) -> CallOutcome:
        if p.state is CallState.CREATED:
            if not started_here and self.config.policy_for(kind) == "sweep":
                return call_outcome(job_id, p, "ambiguous create: left for the reconciler")
            p, detail = await self._create(job_id, p, client, request)
            if p.state is CallState.CREATED or p.terminal:
                return call_outcome(job_id, p, detail)
        if p.state is CallState.POLLING:
            p, detail, finalized = await self._poll(job_id, kind, p, client)
            if finalized or p.state in ACTIVE:
                return call_outcome(job_id, p, detail, pending="still_running")
        return await self._after_upstream(job_id, p, None)

    async def _create(self, job_id: uuid.UUID, p: CallProjection, client: AsyncKindClient,
                      request: Mapping[str, Any]) -> tuple[CallProjection, str | None]:
        failpoint("before_create")
        until = self.monotonic() + self.config.rate_limited_wait_s
        while True:
            try:
                task_id = await self._beating(job_id, client.create(
                    request, callback_url=self._callback(job_id, client.kind)))
            except RateLimited as exc:  # provably not created: slow down, or fail and refund
                account, pause = await self._slowed(client.kind, exc, until)
                if pause is None:
                    return await self._failed(job_id, p, self._limited(exc, account),
                                              "rate_limited"), None
                await self._beating(job_id, self.sleep(pause))
                continue
            except TimeoutError:  # cancelled in flight: the task may exist upstream
                return p, (f"create did not answer within provider_call_timeout_s "
                           f"({self.config.provider_call_timeout_s:g} s): left for the "
                           "reconciler")
            except NotSent as exc:  # provably not created: fail now and refund
                return await self._failed(job_id, p, str(exc), "not_sent"), None
            except TransientError as exc:  # ambiguous: the task may exist upstream
                return p, f"create failed ambiguously ({exc}): left for the reconciler"
            except ProviderError as exc:  # refused: nothing was created
                return await self._failed(job_id, p, str(exc), type(exc).__name__), None
            break
        failpoint("after_create")
        event = TaskCreated(at=self.clock(), actor=self.owner, task_id=task_id)
        return await self._record(job_id, lambda q: event if q.state is CallState.CREATED
                                  else None, p), None

    async def _slowed(self, kind: str, exc: RateLimited,
                      until: float) -> tuple[str | None, float | None]:
        """A 429 on a create: the kind's account (if a limit names it) pauses its starts and
        halves its caps for the whole fleet (``Database.slow_down``), and this call creates
        again after the pause while ``rate_limited_wait_s`` lasts. The account, and the
        pause (``None``: fail the call now)."""
        slowed = await self.db.slow_down(kind, exc.retry_after)
        if slowed is None:
            return None, None
        pause = rate_limited_pause(slowed.paused_s, exc.retry_after)
        log.info("%s create refused (%s): account %s paused %.2f s, caps x%.3f", kind, exc,
                 slowed.account, pause, slowed.rate_factor)
        return slowed.account, pause if self.monotonic() + pause <= until else None

    async def _failed(self, job_id: uuid.UUID, p: CallProjection, error: str,
                      code: str) -> CallProjection:
        return await self._record(job_id, self._if_active(UpstreamFailed(
            at=self.clock(), actor=self.owner, error=error, code=code)), p)

    async def _poll(self, job_id: uuid.UUID, kind: str, p: CallProjection,
                    client: AsyncKindClient) -> tuple[CallProjection, str | None, bool]:
        """Poll until the task ends or the budget is spent: the projection, a detail, and
        whether the success was finalized at once (:meth:`Finalizer.finalize_at_once`)."""
        assert p.provider_task_id is not None
        deadline = self.monotonic() + self.config.budget_for(kind)
        interval = self.config.interval_for(kind)
        last_error: str | None = None
        self._last_beat.setdefault(job_id, self.monotonic())  # TaskCreated just proved it
        while True:
            outcome: PollOutcome | None = None
            try:
                outcome = await client.poll(p.provider_task_id)
            except MediaExpired as exc:
                outcome = Failed(error=f"result expired: {exc}", code="result_gone")
            except ProviderError as exc:
                last_error = str(exc)
            failpoint("mid_poll")
            keys: tuple[str, ...] = ()
            if outcome is not None:
                try:
                    outcome, keys = await self.inline(job_id, kind, outcome)
                except StorageError as exc:  # the next poll answers the same again
                    outcome, last_error = None, f"storing an inline result: {exc}"
            event = (upstream_event(outcome, self.owner, self.clock(), stored_keys=keys)
                     if outcome else None)
            if isinstance(event, UpstreamSucceeded):
                failpoint("success_seen")
                done = await self._finalize_success(job_id, kind, p, event)
                if done is not None:
                    return done.projection, done.error or done.outcome, True
            if event is not None:
                return await self._record(job_id, self._if_active(event), p), None, False
            await self._heartbeat(job_id, outcome.progress if isinstance(outcome, Running)
                                  else None)
            if self.monotonic() + interval > deadline:
                return await self._load(job_id), last_error or "poll budget spent", False
            await self.sleep(interval)

    async def _finalize_success(self, job_id: uuid.UUID, kind: str, p: CallProjection,
                                event: UpstreamSucceeded) -> FinalizeResult | None:
        """The success and its finalization (:meth:`Finalizer.finalize_success`): at once
        (one transaction) when no webhook can race this worker (the call has no callback
        URL), else the success with its claim, then ``Completed``. The call beats while
        its media are stored before the claim (it is still ``polling``), so no reconciler
        takes it over."""
        at_once = self._callback(job_id, kind) is None
        if not (at_once and (event.result.media_urls or event.result.stored_keys)):
            return await self.finalizer.finalize_success(job_id, p, event, at_once=at_once)

        async with Beat(lambda: self._heartbeat(job_id, None), self.config.heartbeat_every_s):
            return await self.finalizer.finalize_success(job_id, p, event, at_once=True)

    # -- sync kinds -------------------------------------------------------------------

    async def _run_sync(self, job_id: uuid.UUID, kind: str, client: SyncKindClient,
                        request: Mapping[str, Any], p: CallProjection) -> CallOutcome:
        # the call's heartbeat runs through the call and the storing of its inline media:
        # once it has beaten, the reconciler judges it by the heartbeat timeout
        async with Beat(lambda: self._heartbeat(job_id, None), self.config.heartbeat_every_s):
            outcome = await self._sync_call(kind, client, request)
            failpoint("after_sync_call")
            outcome, keys = await self.inline(job_id, kind, outcome)
        event = upstream_event(outcome, self.owner, self.clock(), stored_keys=keys)
        assert event is not None
        p = await self._record(job_id, self._if_active(event), p)
        return await self._after_upstream(job_id, p, None)

    async def _sync_call(self, kind: str, client: SyncKindClient,
                         request: Mapping[str, Any]) -> PollOutcome:
        """The sync call's answer; a 429 of a limited account's kind slows the account and
        calls again after the pause, as a create does (:meth:`_slowed`)."""
        until = self.monotonic() + self.config.rate_limited_wait_s
        while True:
            try:
                return await self._timed(client.call(request))
            except TimeoutError:
                return Failed(error=f"the call did not answer within provider_call_timeout_s "
                                    f"({self.config.provider_call_timeout_s:g} s)",
                              code="timeout")
            except RateLimited as exc:  # not processed: slow down, or fail and refund
                account, pause = await self._slowed(kind, exc, until)
                if pause is None:
                    return Failed(error=self._limited(exc, account), code=type(exc).__name__)
                await self.sleep(pause)
            except ProviderError as exc:  # nothing to recover for a sync call: fail, refund
                return Failed(error=str(exc), code=type(exc).__name__)

    def _limited(self, exc: RateLimited, account: str | None) -> str:
        """A 429's error text: the provider's, and the account's wait that ran out."""
        return rate_limited_error(str(exc), account, self.config.rate_limited_wait_s)

    async def inline(self, job_id: uuid.UUID, kind: str,
                     outcome: PollOutcome) -> tuple[PollOutcome, tuple[str, ...]]:
        """Inline results stored before the outcome is recorded (:mod:`callwarden.calls.inline`)."""
        return await store_inline(self.media, job_id, kind, outcome,
                                  settings=self.settings, config=self.config)

    # -- shared -----------------------------------------------------------------------

    async def _after_upstream(self, job_id: uuid.UUID, p: CallProjection,
                              detail: str | None) -> CallOutcome:
        if p.state in (CallState.UPSTREAM_SUCCEEDED, CallState.FINALIZING):
            failpoint("after_upstream_result")
            done = await self.finalizer.finalize(job_id, current=p)
            return call_outcome(job_id, done.projection, done.error or done.outcome)
        return call_outcome(job_id, p, detail)

    def _if_active(self, event: Event) -> Decide:
        return lambda q: event if q.state in ACTIVE else None

    async def _record(self, job_id: uuid.UUID, decide: Decide,
                      current: CallProjection | None = None) -> CallProjection:
        """``transition`` from the projection we hold (``current``): no re-read unless
        someone else wrote in between."""
        return (await self.db.transition(job_id, decide, current=current)).projection

    async def _load(self, job_id: uuid.UUID) -> CallProjection:
        return await self.db.load(job_id)

    async def _beating(self, job_id: uuid.UUID, work: Awaitable[T]) -> T:
        """``work`` (a create or a sync call: the provider's code, a host adapter's
        included) under the call's heartbeat, as an own call's body is, and within
        ``provider_call_timeout_s`` (``TimeoutError`` past it): a slow create or model
        is never taken for a dead worker and swept while it runs."""
        async with Beat(lambda: self._heartbeat(job_id, None), self.config.heartbeat_every_s):
            return await self._timed(work)

    async def _timed(self, work: Awaitable[T]) -> T:
        async with asyncio.timeout(self.config.provider_call_timeout_s):
            return await work

    async def _heartbeat(self, job_id: uuid.UUID, progress: float | None) -> None:
        """A projection-only write: when it fails (the database blinked), the call keeps
        polling and the next beat tries again; a heartbeat never abandons a call."""
        now = self.monotonic()
        if now - self._last_beat.get(job_id, -1e9) < self.config.heartbeat_every_s:
            return
        try:
            await self.db.heartbeat(job_id, self.owner,
                                    int(progress) if progress is not None else None)
        except DatabaseError as exc:  # the pool's timeout too (DatabaseUnavailable)
            log.warning("job %s: heartbeat not written (%s); still polling", job_id, exc)
            return
        self._last_beat[job_id] = now

    def _callback(self, job_id: uuid.UUID, kind: str) -> str | None:
        return self.callback_url(job_id, kind) if self.callback_url else None

