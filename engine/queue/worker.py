"""The reference worker: claim jobs from the ``jobs`` table and run their calls.

``run_worker`` keeps up to ``concurrency`` jobs in flight, all run by one shared
:class:`~callwarden.calls.runner.CallRunner` (one aiohttp session, one psycopg pool). Each job:

1. is claimed with a lease of ``visibility_s`` (:mod:`callwarden.queue.claims`); a lease-extension
   task pushes the lease every ``visibility_s / 2`` while the call runs, so only a dead
   worker's jobs are delivered again;
2. runs with ``CallRunner.run`` (which creates, resumes or only reports the call);
3. is acked, whatever the outcome — terminal, left for the reconciler or still running:
   the reconciler owns what is left. One log line per job outcome.

A job the worker cannot read (no or unknown ``provider_kind``) is cancelled, refunded and
acked. A job delivered more than ``max_deliveries`` times (a poison job that kills or
breaks its worker every time) is acked without running again. Either way the cancel is
made only if no call ever started on the job, decided by the cancel itself on what it
writes over (a delivery that records ``CallStarted`` meanwhile wins): a started call is
left to the reconciler. An exception while running a job leaves it leased:
it is delivered again after the visibility timeout, and ``queue_deliveries`` counts it.

On ``stop`` (SIGTERM/SIGINT in the CLI) it stops claiming, waits up to ``grace_s`` for the
calls in flight, then cancels the rest (their leases expire and they are redelivered).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import aiohttp

from callwarden.calls.beat import Beat
from callwarden.calls.callbacks import CallbackUrls
from callwarden.calls.config import CallConfig
from callwarden.calls.pricing import Pricing
from callwarden.calls.runner import CallOutcome, CallRunner
from callwarden.database.boundary import connection
from callwarden.database.db import Pool, open_pool
from callwarden.database.outage import Outage
from callwarden.errors import CallwardenError, DatabaseUnavailable
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import MediaStore
from callwarden.queue.claims import (
    Claimed,
    JobSpec,
    ack,
    claim,
    defer,
    extend,
    parse_job,
    reject,
)
from callwarden.rules.waits import jittered

__all__ = ["Worker", "run_worker"]

log = logging.getLogger("callwarden.worker")
DB_ERRORS = (CallwardenError,)  # the store translates every driver error (pool timeouts too)


async def run_worker(url: str, settings: ProviderSettings, media: MediaStore, *,
                     concurrency: int, visibility_s: float, poll_empty_s: float,
                     stop: asyncio.Event, config: CallConfig | None = None,
                     grace_s: float = 30.0, max_deliveries: int = 5,
                     callback_base_url: str | None = None,
                     pricing: Pricing | None = None) -> int:
    """Run the worker until ``stop`` is set; 0 once in-flight calls are done.
    ``callback_base_url``: where ``callwarden serve`` receives webhooks (then each call
    gets a per-job callback URL with a secret token); unset, calls are only polled.
    ``pricing``: what a completed call is charged (:mod:`callwarden.calls.pricing`)."""
    callbacks = CallbackUrls(callback_base_url) if callback_base_url else None
    async with open_pool(url, max_size=concurrency + 2, check=True) as pool, \
            aiohttp.ClientSession() as session, \
            CallRunner(pool, session, settings, media, config=config,
                       callback_url=callbacks, pricing=pricing) as runner:
        worker = Worker(pool, runner, concurrency=concurrency, visibility_s=visibility_s,
                        poll_empty_s=poll_empty_s, grace_s=grace_s,
                        max_deliveries=max_deliveries, callbacks=callbacks)
        log.info("worker %s started: concurrency=%d visibility=%ss", runner.owner,
                 concurrency, visibility_s)
        await worker.run(stop)
        log.info("worker %s stopped", runner.owner)
    return 0


class Worker:
    """The claim loop of one process incarnation (``runner.owner``)."""

    def __init__(self, pool: Pool, runner: CallRunner, *, concurrency: int,
                 visibility_s: float, poll_empty_s: float, grace_s: float = 30.0,
                 max_deliveries: int = 5, callbacks: CallbackUrls | None = None) -> None:
        if concurrency < 1 or visibility_s <= 0 or poll_empty_s <= 0 or grace_s < 0:
            raise ValueError("concurrency >= 1, visibility_s > 0, poll_empty_s > 0, "
                             "grace_s >= 0")
        self.pool, self.runner, self.owner = pool, runner, runner.owner
        self.concurrency, self.visibility_s = concurrency, visibility_s
        self.poll_empty_s, self.grace_s = poll_empty_s, grace_s
        self.max_deliveries, self.callbacks = max_deliveries, callbacks
        self.outage = Outage(log, f"worker {runner.owner}")
        self._pause = 0.0  # the outage's backoff before the next claim

    async def run(self, stop: asyncio.Event) -> None:
        inflight: set[asyncio.Task[None]] = set()
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                free = self.concurrency - len(inflight)
                claimed = await self._claim(free)
                inflight |= {asyncio.create_task(self._handle(job)) for job in claimed}
                idle = len(claimed) < free  # the queue had fewer jobs than free slots
                wait_s = max(self.poll_empty_s, self._pause) if idle else None
                await asyncio.wait({stopping, *inflight}, return_when=asyncio.FIRST_COMPLETED,
                                   timeout=wait_s)
                inflight = {t for t in inflight if not t.done()}
        finally:
            stopping.cancel()
        await self._drain(inflight)

    async def _claim(self, free: int) -> list[Claimed]:
        if free <= 0:
            return []
        try:
            async with connection(self.pool) as conn:
                claimed = await claim(conn, owner=self.owner, batch=free,
                                      visibility_s=self.visibility_s)
        except DatabaseUnavailable as exc:  # one line per outage, and a backoff
            self._pause = self.outage.down(exc)
            return []
        except DB_ERRORS as exc:
            log.warning("claim failed (will retry): %s", exc)
            return []
        self.outage.up()
        self._pause = 0.0
        return claimed

    async def _drain(self, inflight: set[asyncio.Task[None]]) -> None:
        if not inflight:
            return
        log.info("stopping: waiting up to %ss for %d call(s) in flight", self.grace_s,
                 len(inflight))
        _, late = await asyncio.wait(inflight, timeout=self.grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        if late:
            log.warning("stopping: %d call(s) abandoned; redelivered after their lease",
                        len(late))

    async def _handle(self, job: Claimed) -> None:
        spec = parse_job(job.input_data)
        try:
            if isinstance(spec, str):
                await self._reject(job, spec)
            elif job.deliveries > self.max_deliveries:
                await self._give_up(job)
            else:
                await self._run(job, spec)
        except DatabaseUnavailable as exc:  # the outage is logged once, by the claim loop
            self.outage.down(exc)
            log.info("job %s delivery=%d: database unavailable; left leased for redelivery",
                     job.job_id, job.deliveries)
        except DB_ERRORS:  # not acked: delivered again after the visibility timeout
            log.exception("job %s delivery=%d: database error; left leased for redelivery",
                          job.job_id, job.deliveries)

    async def _run(self, job: Claimed, spec: JobSpec) -> None:
        keeper = Beat(lambda: self._extend_lease(job.job_id), self.visibility_s / 2).start()
        try:
            if self.callbacks is not None:
                async with connection(self.pool) as conn:
                    await self.callbacks.prepare(conn, job.job_id)
            outcome = await self.runner.run(job.job_id, spec.kind, spec.request,
                                            operation=spec.operation)
        except DatabaseUnavailable as exc:  # logged once per outage by the claim loop
            self.outage.down(exc)
            log.info("job %s kind=%s delivery=%d: database unavailable; left leased for "
                     "redelivery", job.job_id, spec.kind, job.deliveries)
            return
        except Exception:  # leased still: delivered again after the visibility timeout
            log.exception("job %s kind=%s delivery=%d: error; left leased for redelivery",
                          job.job_id, spec.kind, job.deliveries)
            return
        finally:
            await keeper.stop()
            if self.callbacks is not None:
                self.callbacks.forget(job.job_id)
        if outcome.result == "waiting":  # refused by the account's limits: not a delivery
            async with connection(self.pool) as conn:
                back = await defer(conn, job.job_id, owner=self.owner,
                                   retry_after_s=jittered(outcome.retry_after_s or 1.0))
            log.info("job %s kind=%s waiting: %s (deferred=%s)", job.job_id, spec.kind,
                     outcome.detail, back)
            return
        acked = await self._ack(job.job_id)
        _log_outcome(job, spec, outcome, acked)

    async def _extend_lease(self, job_id: uuid.UUID) -> bool:
        """One extension of the job's queue lease; ``False`` once it is lost."""
        try:
            async with connection(self.pool) as conn:
                held = await extend(conn, job_id, owner=self.owner,
                                    visibility_s=self.visibility_s)
        except DatabaseUnavailable as exc:
            self.outage.down(exc)
            return True
        except DB_ERRORS as exc:
            log.warning("job %s: lease extension failed: %s", job_id, exc)
            return True
        if not held:
            log.warning("job %s: lease lost (redelivered elsewhere)", job_id)
            return False
        return True

    async def _ack(self, job_id: uuid.UUID) -> bool:
        async with connection(self.pool) as conn:
            return await ack(conn, job_id, owner=self.owner)

    async def _reject(self, job: Claimed, reason: str) -> None:
        """Ack the job; cancel (refund) it only if no call started on it, a decision the
        cancel makes itself, fenced (:func:`~callwarden.queue.claims.reject`)."""
        async with connection(self.pool) as conn:
            result, acked = await reject(conn, job.job_id, owner=self.owner,
                                         now=self.runner.clock())
        state = result.projection.state
        left = "" if result.ok or state is None else ", left to the reconciler"
        log.error("job %s rejected: %s; call %s%s, acked=%s", job.job_id, reason,
                  state.value if state else "none", left, acked)

    async def _give_up(self, job: Claimed) -> None:
        await self._reject(job, f"delivered {job.deliveries} times (max "
                                f"{self.max_deliveries})")


def _log_outcome(job: Claimed, spec: JobSpec, outcome: CallOutcome, acked: bool) -> None:
    state = outcome.projection.state
    log.info("job %s kind=%s delivery=%d result=%s state=%s acked=%s%s", job.job_id,
             spec.kind, job.deliveries, outcome.result, state.value if state else "none",
             acked, f" detail={outcome.detail!r}" if outcome.detail else "")
