"""Finalization, shared by workers, the reconciler and webhooks (the seed's
``finalizeJobWithMedia``): claim -> store media -> complete, exactly once.

1. Claim with this process's owner id and a lease (take over an expired lease).
2. Download each result URL (size-limited) and store it under a deterministic per-job key,
   so a repeat after a crash overwrites the same object.
3. In one transaction: ``Completed`` (commit at the actual cost, never above the
   reservation), the ``assets`` rows, progress 100, and the sole-cause reopen of the
   parent ``workflow_executions`` row (compare-and-set on ``failed``).
A transient storage/download error records ``FinalizeFailed`` (retried later); a result
that is gone records ``UpstreamFailed`` (refund); a job cancelled meanwhile is cancelled
through the engine, which refunds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

import aiohttp
import msgspec
from psycopg_pool import AsyncConnectionPool

from engine.config import CallConfig
from engine.failpoints import failpoint
from engine.store import AppendResult, Conn, append, execute, transition
from events.states import CallState
from events.types import (
    Cancelled,
    Completed,
    Event,
    FinalizeClaimed,
    FinalizeFailed,
    StoredMedia,
    UpstreamFailed,
    UpstreamResult,
)
from projections.fold import CallProjection
from providers.base import ProviderSettings
from providers.errors import MediaExpired, ProviderError, StorageError
from providers.media import download
from providers.registry import media_fetch_for
from providers.storage import MediaStore, ObjectNotFound, media_key

__all__ = ["Clock", "FinalizeResult", "Finalizer"]

Clock = Callable[[], datetime]
Pool = AsyncConnectionPool[Conn]
Outcome = Literal["completed", "not_claimable", "retry_later", "result_gone", "cancelled",
                  "lost_race"]


class FinalizeResult(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    projection: CallProjection
    error: str | None = None


class Finalizer:
    """Runs finalization for one owner (a process incarnation)."""

    def __init__(self, pool: Pool, store: MediaStore, session: aiohttp.ClientSession,
                 settings: ProviderSettings, *, owner: str, clock: Clock,
                 config: CallConfig | None = None) -> None:
        self.pool, self.store, self.session, self.settings = pool, store, session, settings
        self.owner, self.clock, self.config = owner, clock, config or CallConfig()

    async def finalize(self, job_id: uuid.UUID,
                       current: CallProjection | None = None) -> FinalizeResult:
        """Finalize the job's call; ``current`` is the projection the caller holds (it
        saves a read; a stale one only costs a re-read)."""
        claim = await self._claim(job_id, current)
        p = claim.projection
        if not (p.state is CallState.FINALIZING and p.finalize_owner == self.owner):
            return FinalizeResult(outcome="not_claimable", projection=p)
        failpoint("after_claim")
        try:
            media = await self._store_all(job_id, p)
        except MediaExpired as exc:
            return await self._give_up(job_id, "result_gone", UpstreamFailed(
                at=self.clock(), actor=self.owner, error=f"result expired: {exc}",
                code="result_gone"))
        except (ProviderError, StorageError) as exc:
            return await self._give_up(job_id, "retry_later", FinalizeFailed(
                at=self.clock(), actor=self.owner, error=str(exc)))
        failpoint("after_upload")
        return await self._complete(job_id, p, media)

    def _decide_claim(self, p: CallProjection) -> Event | None:
        now = self.clock()
        lease = now + timedelta(seconds=self.config.finalize_lease_s)
        if p.state is CallState.UPSTREAM_SUCCEEDED:
            return FinalizeClaimed(at=now, actor=self.owner, owner=self.owner, lease_until=lease)
        expired = p.finalize_lease_until is not None and now >= p.finalize_lease_until
        if p.state is CallState.FINALIZING and p.finalize_owner != self.owner and expired:
            return FinalizeClaimed(at=now, actor=self.owner, owner=self.owner, lease_until=lease)
        return None

    async def _claim(self, job_id: uuid.UUID,
                     current: CallProjection | None) -> AppendResult:
        async with self.pool.connection() as conn:
            return await transition(conn, job_id, self._decide_claim, current=current)

    async def _store_all(self, job_id: uuid.UUID,
                         p: CallProjection) -> tuple[StoredMedia, ...]:
        result = p.upstream_result or UpstreamResult()
        prestored = result.raw.get("prestored_keys")
        if isinstance(prestored, list):
            return tuple([await self._head(str(k)) for k in prestored])
        fetch = media_fetch_for(p.provider_kind, self.settings)
        out = []
        for index, url in enumerate(result.media_urls):
            got = await download(self.session, url, max_bytes=self.config.media_max_bytes,
                                 timeout_s=self.config.media_timeout_s, headers=fetch.headers,
                                 allowed_types=fetch.allowed_types)
            key = media_key(str(job_id), index, got.content_type)
            obj = await self.store.put(key, got.data, got.content_type)
            out.append(StoredMedia(key=obj.key, url=obj.uri, content_type=obj.content_type,
                                   size=obj.size))
        return tuple(out)

    async def _head(self, key: str) -> StoredMedia:
        try:
            obj = await self.store.head(key)
        except ObjectNotFound as exc:
            raise MediaExpired(f"inline result {key} was never stored") from exc
        return StoredMedia(key=obj.key, url=obj.uri, content_type=obj.content_type,
                           size=obj.size)

    async def _give_up(self, job_id: uuid.UUID, outcome: Outcome,
                       event: FinalizeFailed | UpstreamFailed) -> FinalizeResult:
        def decide(p: CallProjection) -> Event | None:
            mine = p.state is CallState.FINALIZING and p.finalize_owner == self.owner
            return event if mine else None

        async with self.pool.connection() as conn:
            r = await transition(conn, job_id, decide)
        return FinalizeResult(outcome=outcome if r.ok else "lost_race",
                              projection=r.projection,
                              error=getattr(event, "error", None))

    async def _complete(self, job_id: uuid.UUID, p: CallProjection,
                        media: tuple[StoredMedia, ...]) -> FinalizeResult:
        cost = p.upstream_result.cost if p.upstream_result else None
        event = Completed(at=self.clock(), actor=self.owner, media=media, cost=cost)
        async with self.pool.connection() as conn:
            async with conn.transaction():
                r = await append(conn, job_id, p, event)
                if r.ok:
                    await _record_assets(conn, job_id, media)
                    await execute(conn, "reopen_workflow", {"job_id": job_id})
            if r.ok:
                return FinalizeResult(outcome="completed", projection=r.projection)
            if r.projection.status == "cancelled" and not r.projection.terminal:
                return await self._cancel_for_host(conn, job_id)
        return FinalizeResult(outcome="lost_race", projection=r.projection)

    async def _cancel_for_host(self, conn: Conn, job_id: uuid.UUID) -> FinalizeResult:
        """The host set ``status='cancelled'`` on the row: record it, which refunds."""
        def decide(p: CallProjection) -> Event | None:
            return None if p.terminal else Cancelled(at=self.clock(), actor=self.owner,
                                                     by="host")

        r = await transition(conn, job_id, decide)
        return FinalizeResult(outcome="cancelled", projection=r.projection)


async def _record_assets(conn: Conn, job_id: uuid.UUID, media: tuple[StoredMedia, ...]) -> None:
    if not media:
        return
    await execute(conn, "insert_assets", {
        "job_id": job_id, "keys": [m.key for m in media], "urls": [m.url for m in media],
        "types": [m.content_type for m in media], "sizes": [m.size for m in media]})

