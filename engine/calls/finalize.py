"""Finalization, shared by workers, the reconciler and webhooks (the original design's
``finalizeJobWithMedia``): claim -> store media -> complete, exactly once.

1. Claim with an owner id of *this claim* (the process incarnation plus a fresh suffix, so
   two finalizations in one process never both believe they hold it) and a lease sized to
   the work (:meth:`~callwarden.calls.config.CallConfig.lease_for`); an expired lease is taken over.
2. Download each result URL (size-limited, only from the kind's media hosts: see
   :mod:`callwarden.providers.media_guard`) and store it under a deterministic per-job key, so a
   repeat after a crash overwrites the same object — all within a deadline inside the
   lease, so nobody takes over a finalization that is still working.
3. In one transaction: ``Completed`` (with the text result and stop reason, if any;
   commit at the pricing hook's charge — :mod:`callwarden.calls.pricing`, default the reservation
   — never above the reservation), the ``assets`` rows, progress 100, and the sole-cause
   reopen of the parent ``workflow_executions`` row (compare-and-set on ``failed``).

What a failure means::

    the result is gone (MediaExpired)                UpstreamFailed(code="result_gone")
    it can never be stored (refused host, wrong      UpstreamFailed(code="media_unusable")
      type, too large, a 4xx that will not change)     -> failed + refund at once
    transient (5xx, timeout, storage down,           FinalizeFailed -> retried later; the
      the deadline passed)                             reconciler counts it towards its cap
    the host ended the job meanwhile                 HostEnded (as the host decided)

Only the holder of the claim ever appends ``FinalizeFailed``/``UpstreamFailed``/
``Completed`` for it: a loser's error is never recorded under the winner's claim.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Literal

import msgspec

from callwarden.calls.config import CallConfig
from callwarden.calls.failpoints import failpoint
from callwarden.calls.pricing import BUILTIN, ChargeReservation, Pricing, checked_charge
from callwarden.database.clock import Clock, DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.port import Database
from callwarden.database.postgres import as_database
from callwarden.database.write import AppendResult, Decide
from callwarden.errors import WriteConflict
from callwarden.events.states import CallState
from callwarden.events.types import (
    Completed,
    Event,
    FinalizeClaimed,
    FinalizeFailed,
    StoredMedia,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import CallProjection, apply
from callwarden.providers.base import ProviderSettings
from callwarden.providers.closing import AsyncClosing
from callwarden.providers.errors import (
    MediaExpired,
    MediaRefused,
    ProviderError,
    StorageError,
    is_transient,
)
from callwarden.providers.media import download
from callwarden.providers.media_guard import MediaSessions
from callwarden.providers.registry import media_fetch_for
from callwarden.providers.storage import MediaStore, ObjectNotFound, media_key
from callwarden.rules.host import host_ended

log = logging.getLogger("callwarden.finalize")

#: Threads a host's own pricing hooks run on (per process).
HOOK_THREADS = 4
_HOOK_SLOTS = threading.BoundedSemaphore(HOOK_THREADS)
_hooks: ThreadPoolExecutor | None = None


def _hook_threads() -> ThreadPoolExecutor:
    global _hooks
    if _hooks is None:
        _hooks = ThreadPoolExecutor(max_workers=HOOK_THREADS,
                                    thread_name_prefix="callwarden-pricing")
    return _hooks

__all__ = ["Clock", "FinalizeResult", "Finalizer"]

Outcome = Literal["completed", "not_claimable", "retry_later", "result_gone", "failed",
                  "cancelled", "host_ended", "lost_race"]
_MAX_COMPLETE_TRIES = 4


class FinalizeResult(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    projection: CallProjection
    error: str | None = None


class _GiveUp(Exception):
    def __init__(self, outcome: Outcome, event: FinalizeFailed | UpstreamFailed) -> None:
        super().__init__(event.error)
        self.outcome, self.event = outcome, event


class Finalizer(AsyncClosing):
    """Runs finalizations for one process incarnation (``owner``)."""

    def __init__(self, db: Pool | Database, media: MediaStore, settings: ProviderSettings, *,
                 owner: str, clock: Clock | None = None,
                 config: CallConfig | None = None, pricing: Pricing | None = None) -> None:
        """``db``: the database (a pool, or a :class:`~callwarden.database.port.Database`);
        ``media``: where media results are stored; ``pricing``: what a completed call is
        charged (default: its reservation; :mod:`callwarden.calls.pricing`)."""
        self.db: Database = as_database(db)
        self.media, self.settings = media, settings
        self.owner = owner
        self.clock = clock if clock is not None else DatabaseClock()
        self.config = config or CallConfig()
        self.pricing: Pricing = pricing if pricing is not None else ChargeReservation()
        self.media_sessions = MediaSessions()

    async def aclose(self) -> None:
        """Close the media connections kept between finalizations (``async with`` does
        it too); a finalizer used again afterwards opens new ones."""
        await self.media_sessions.aclose()

    async def finalize(self, job_id: uuid.UUID,
                       current: CallProjection | None = None) -> FinalizeResult:
        """Finalize the job's call; ``current`` is the projection the caller holds (it
        saves a read; a stale one only costs a re-read)."""
        await self.db.sync_clock(self.clock)
        claim_owner = f"{self.owner}/{uuid.uuid4().hex[:8]}"
        claim = await self._claim(job_id, current, claim_owner)
        if not claim.ok:
            return FinalizeResult(outcome="host_ended" if claim.host_ended
                                  else "not_claimable", projection=claim.projection)
        return await self._finish(job_id, claim.projection, claim_owner)

    async def _finish(self, job_id: uuid.UUID, p: CallProjection,
                      claim_owner: str) -> FinalizeResult:
        """Under the claim ``p`` holds: store the media, then complete (or give up)."""
        failpoint("after_claim")
        try:
            media = await self._store_within_deadline(job_id, p)
        except _GiveUp as stop:
            return await self._give_up(job_id, claim_owner, stop)
        failpoint("after_upload")
        return await self._complete(job_id, p, media, claim_owner)

    async def finalize_success(self, job_id: uuid.UUID, current: CallProjection,
                               succeeded: UpstreamSucceeded, *,
                               at_once: bool) -> FinalizeResult | None:
        """The actor that saw the success finalizes it (issue 26: fewer transactions).

        ``at_once=False``: ``UpstreamSucceeded`` and ``FinalizeClaimed`` in one statement,
        then the media, then ``Completed`` (two transactions instead of three).
        ``at_once=True`` (no webhook can race this actor): the media are downloaded and
        stored first, while the call is still ``polling`` (deterministic keys: a second
        writer stores the same objects), then ``UpstreamSucceeded``, ``FinalizeClaimed``
        and ``Completed`` (or the claim's ``FinalizeFailed``/``UpstreamFailed``) go in one
        statement with the asset rows and the workflow reopen (one transaction).

        ``None``: nothing was written (the host ended the job, or another actor wrote
        first): the caller records the success the usual way and finalizes under a claim.
        """
        if current.state is not CallState.POLLING or host_ended(
                current, at=succeeded.at, actor=succeeded.actor) is not None:
            return None
        claim_owner = f"{self.owner}/{uuid.uuid4().hex[:8]}"
        seen = apply(current, succeeded)
        claim = self._decide_claim(claim_owner)(seen)
        if claim is None:
            return None
        if not at_once:
            r = await self.db.append(job_id, current, (succeeded, claim))
            return await self._finish(job_id, r.projection, claim_owner) if r.ok else None
        claimed = apply(seen, claim)
        try:
            media = await self._store_within_deadline(job_id, claimed)
        except _GiveUp as stop:
            r = await self.db.append(job_id, current, (succeeded, claim, stop.event))
            return FinalizeResult(outcome=stop.outcome, projection=r.projection,
                                  error=stop.event.error) if r.ok else None
        failpoint("after_upload")
        result = claimed.upstream_result or UpstreamResult()
        completed = Completed(at=self.clock(), actor=self.owner, media=media,
                              cost=await self._charge(claimed.provider_kind or "", result),
                              text=result.text, stop_reason=result.stop_reason)
        try:
            r = await self.db.append(job_id, current, (succeeded, claim, completed),
                                     assets=media)
        except WriteConflict:  # a deadlock rolled it back: the usual way
            return None
        return FinalizeResult(outcome="completed", projection=r.projection) if r.ok else None

    # -- the claim -------------------------------------------------------------------------

    def _decide_claim(self, claim_owner: str) -> Decide:
        def decide(p: CallProjection) -> Event | None:
            now = self.clock()
            media = len(p.upstream_result.media_urls) if p.upstream_result else 0
            lease = now + timedelta(seconds=self.config.lease_for(media))
            event = FinalizeClaimed(at=now, actor=self.owner, owner=claim_owner,
                                    lease_until=lease)
            if p.state is CallState.UPSTREAM_SUCCEEDED:
                return event
            expired = p.finalize_lease_until is not None and now >= p.finalize_lease_until
            if p.state is CallState.FINALIZING and expired:
                return event
            return None
        return decide

    async def _claim(self, job_id: uuid.UUID, current: CallProjection | None,
                     claim_owner: str) -> AppendResult:
        return await self.db.transition(job_id, self._decide_claim(claim_owner),
                                        current=current)

    # -- storing ---------------------------------------------------------------------------

    async def _store_within_deadline(self, job_id: uuid.UUID,
                                     p: CallProjection) -> tuple[StoredMedia, ...]:
        result = p.upstream_result or UpstreamResult()
        deadline = self.config.deadline_for(len(result.media_urls))
        try:
            async with asyncio.timeout(deadline):
                return await self._store_all(job_id, p, result)
        except TimeoutError:
            raise _GiveUp("retry_later", FinalizeFailed(
                at=self.clock(), actor=self.owner,
                error=f"finalization took longer than {deadline:g} s (inside its lease)"),
            ) from None
        except MediaExpired as exc:
            raise _GiveUp("result_gone", UpstreamFailed(
                at=self.clock(), actor=self.owner, error=f"result expired: {exc}",
                code="result_gone")) from None
        except (ProviderError, StorageError) as exc:
            if is_transient(exc):
                raise _GiveUp("retry_later", FinalizeFailed(
                    at=self.clock(), actor=self.owner, error=str(exc))) from None
            raise _GiveUp("failed", UpstreamFailed(
                at=self.clock(), actor=self.owner, error=f"result unusable: {exc}",
                code="media_unusable")) from None

    async def _store_all(self, job_id: uuid.UUID, p: CallProjection,
                         result: UpstreamResult) -> tuple[StoredMedia, ...]:
        out = [await self._head(job_id, k) for k in result.stored_keys]
        if not result.media_urls:
            return tuple(out)
        fetch = media_fetch_for(p.provider_kind, self.settings, self.config.media_allow_hosts)
        session = self.media_sessions.session(fetch.policy)
        for index, url in enumerate(result.media_urls, start=len(out)):
            got = await download(session, url, policy=fetch.policy,
                                 max_bytes=self.config.media_max_bytes,
                                 timeout_s=self.config.media_timeout_s,
                                 credentials=fetch.credentials,
                                 allowed_types=fetch.allowed_types)
            key = media_key(str(job_id), index, got.content_type)
            obj = await self.media.put(key, got.data, got.content_type)
            out.append(StoredMedia(key=obj.key, url=obj.url or obj.uri,
                                   content_type=obj.content_type, size=obj.size))
        return tuple(out)

    async def _head(self, job_id: uuid.UUID, key: str) -> StoredMedia:
        """An inline result the worker stored: only keys under this job's own prefix."""
        if not key.startswith(media_key(str(job_id), 0, "").rsplit("/", 1)[0] + "/"):
            raise MediaRefused(f"stored key {key!r} is not under job {job_id}'s prefix")
        try:
            obj = await self.media.head(key)
        except ObjectNotFound as exc:
            raise MediaExpired(f"inline result {key} was never stored") from exc
        return StoredMedia(key=obj.key, url=obj.url or obj.uri, content_type=obj.content_type,
                           size=obj.size)

    # -- ending ----------------------------------------------------------------------------

    async def _give_up(self, job_id: uuid.UUID, claim_owner: str,
                       stop: _GiveUp) -> FinalizeResult:
        def decide(p: CallProjection) -> Event | None:
            mine = p.state is CallState.FINALIZING and p.finalize_owner == claim_owner
            return stop.event if mine else None

        r = await self.db.transition(job_id, decide)
        outcome: Outcome = "host_ended" if r.host_ended else (
            stop.outcome if r.ok else "lost_race")
        return FinalizeResult(outcome=outcome, projection=r.projection, error=stop.event.error)

    async def _charge(self, kind: str, result: UpstreamResult) -> float | None:
        """The pricing hook's charge; a host's own hook runs on the hooks' own threads
        (:data:`HOOK_THREADS` of them, never the loop's default executor, which media
        storage and DNS need), bounded by ``pricing_timeout_s``. Past it, or when every
        hook thread is still busy with an earlier call (hung hooks), the reservation is
        charged at once, logged."""
        if isinstance(self.pricing, BUILTIN):
            return checked_charge(self.pricing, kind, result.usage, result.cost)
        if not _HOOK_SLOTS.acquire(blocking=False):
            log.error("pricing hook: all %d of its threads are still busy with earlier calls "
                      "(hung?): charging the reservation for a %s call", HOOK_THREADS, kind)
            return None

        def run() -> float | None:
            try:
                return checked_charge(self.pricing, kind, result.usage, result.cost)
            finally:
                _HOOK_SLOTS.release()

        timeout = self.config.pricing_timeout_s
        try:
            return await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(_hook_threads(), run), timeout)
        except TimeoutError:
            log.error("pricing hook took over %g s for a %s call: charging the reservation",
                      timeout, kind)
            return None

    async def _complete(self, job_id: uuid.UUID, p: CallProjection,
                        media: tuple[StoredMedia, ...], claim_owner: str) -> FinalizeResult:
        result = p.upstream_result or UpstreamResult()
        cost = await self._charge(p.provider_kind or "", result)
        event = Completed(at=self.clock(), actor=self.owner, media=media, cost=cost,
                          text=result.text, stop_reason=result.stop_reason)
        for _ in range(_MAX_COMPLETE_TRIES):
            ended = host_ended(p, at=event.at, actor=event.actor)
            try:  # the event, the assets and the workflow reopen: one transaction
                r = await self.db.append(job_id, p, ended or event,
                                         assets=media if ended is None else None)
            except WriteConflict:  # a deadlock rolled the transaction back: read, retry
                p = await self.db.load(job_id)
                continue
            if r.ok:
                return FinalizeResult(outcome="host_ended" if ended else "completed",
                                      projection=r.projection)
            p = r.projection  # an admin requeue or a host write landed: still ours?
            if not (p.state is CallState.FINALIZING and p.finalize_owner == claim_owner):
                break
        return FinalizeResult(outcome="lost_race", projection=p)

