"""The reconciler: find stuck calls and settle them, from one process or many.

River's job rescuer in our terms: a thin loop (:meth:`Reconciler.run`) around
:meth:`Reconciler.reconcile_once`, which returns :class:`Counts`. One pass:

1. claim a batch in one statement (``FOR UPDATE SKIP LOCKED`` over partial indexes, with a
   lease owned by this process incarnation), so replicas never hold the same call;
2. per call: renew the claim (skip it if it is no longer ours), decide with the pure
   :func:`callwarden.reconciler.decide.decide`, act through the engine's write path — every
   event is appended fenced on the ``call_version`` that was read, so a call that a worker
   settled meanwhile is never overwritten — then release the claim.

A call's outcome is logged; a provider error is stored on the call (attempt + 1, the error
kept, next attempt after the re-poll interval), never dropped. Nothing about one row stops
the others or the loop: a call is decided on the fold of its log, never on what host code
wrote over its projection columns (the next write rewrites them); an unexpected error
while handling a call is recorded on it the same way (attempt + 1); a call whose log
cannot be read or replayed, or disagrees with the row's ``call_version``, is parked until
the next re-poll and counted as ``unreadable``; a database error is counted and the
call's claim simply expires if it cannot be released. A host that ended the job meanwhile
is recorded as such (``HostEnded``), never overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import msgspec

from callwarden.calls.config import CallConfig
from callwarden.calls.failpoints import failpoint
from callwarden.calls.finalize import Finalizer
from callwarden.calls.identity import incarnation
from callwarden.calls.inline import store_inline
from callwarden.calls.pricing import Pricing
from callwarden.database.clock import DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.outage import Outage
from callwarden.database.port import ClaimRequest, Database, Row
from callwarden.database.postgres import as_database
from callwarden.database.write import AppendResult
from callwarden.errors import (
    CallwardenError,
    DatabaseError,
    DatabaseUnavailable,
    JobNotFound,
    TaskAlreadyClaimed,
)
from callwarden.events.codec import EventDecodeError
from callwarden.events.types import Event, Exhausted, HostEnded, ReconcileAttempted, Swept
from callwarden.observe.metrics import record_reconcile
from callwarden.observe.tracing import call_context
from callwarden.projections.columns import ProjectionUnreadable
from callwarden.projections.fold import CallProjection
from callwarden.providers.base import ProviderSettings
from callwarden.providers.closing import AsyncClosing
from callwarden.providers.errors import ProviderError, StorageError
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Running, Succeeded
from callwarden.providers.registry import poll_task
from callwarden.providers.storage import MediaStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.decide import (
    Action,
    Adopt,
    Candidate,
    Exhaust,
    Finalize,
    PollUpstream,
    RecordHostEnded,
    Skip,
    Sweep,
    adopted_event,
    decide,
    next_scan_delay,
)
from callwarden.reconciler.outside import Outside
from callwarden.rules.fold import fold_for_row
from callwarden.rules.host import host_status_ended
from callwarden.rules.upstream import upstream_event

__all__ = ["Counts", "Reconciler", "Signal"]

log = logging.getLogger("callwarden.reconcile")

Clock = Callable[[], datetime]
Signal = Callable[[str, uuid.UUID], Awaitable[None]]
"""Test signal (River's ``testsignal``): awaited at named points of a call's handling
(``claimed``, ``decided``, ``write``, ``released``); never a sleep."""

_FINALIZE_COUNT = {"completed": "completed", "result_gone": "failed", "failed": "failed",
                   "not_claimable": "lost_race", "host_ended": "host_ended",
                   "lost_race": "lost_race", "cancelled": "cancelled"}


class Counts(msgspec.Struct, kw_only=True):
    """What one pass did. ``recovered``: upstream results this pass captured (then
    finalized: ``completed``); ``lost_race``: calls someone else moved first."""

    claimed: int = 0
    recovered: int = 0
    completed: int = 0
    failed: int = 0
    swept: int = 0
    exhausted: int = 0
    still_running: int = 0
    adopted: int = 0
    cancelled: int = 0
    host_ended: int = 0
    ended_outside: int = 0  # jobs the host ended with no call, recorded (outside.py)
    leftovers_settled: int = 0  # reservations a host left, settled by the policy
    skipped: int = 0
    lost_race: int = 0
    errors: int = 0
    unreadable: int = 0
    pass_failed: bool = False  # the claim itself failed: this pass handled nothing
    interrupted: bool = False  # the database went away while the pass handled its rows

    def bump(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)


class Reconciler(AsyncClosing):
    """Reconciles for one process incarnation (``owner``). ``db``: the database (a pool, or a
    :class:`~callwarden.database.port.Database`); ``media``: where media results
    are stored."""

    def __init__(self, db: Pool | Database, session: aiohttp.ClientSession,
                 settings: ProviderSettings, media: MediaStore, *,
                 config: ReconcileConfig | None = None,
                 owner: str | None = None, clock: Clock | None = None,
                 call_config: CallConfig | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 signal: Signal | None = None, pricing: Pricing | None = None) -> None:
        self.db: Database = as_database(db)
        self.session, self.settings = session, settings
        self.config = config or ReconcileConfig()
        self.owner = owner or incarnation("reconciler")
        self.clock = clock if clock is not None else DatabaseClock()
        self.sleep, self.signal = sleep, signal
        self._pass_start = (self.clock(), time.monotonic())
        self._logical = False
        self.outage, self._backoff = Outage(log, f"reconciler {self.owner}"), 0.0
        self.outside = Outside(self.db, self.owner, self.config)
        self.finalizer = Finalizer(self.db, media, settings, owner=self.owner,
                                   clock=self._event_clock, config=call_config,
                                   pricing=pricing)

    def _event_clock(self) -> datetime:
        """Now, during a pass: the clock itself, or — when the pass was given a logical
        ``now`` — that ``now`` advanced by the real time elapsed since it began."""
        if not self._logical:
            return self.clock()
        start, mono = self._pass_start
        return start + timedelta(seconds=time.monotonic() - mono)

    async def _signal(self, point: str, job_id: uuid.UUID) -> None:
        if self.signal is not None:
            await self.signal(point, job_id)

    # -- one pass ---------------------------------------------------------------------

    async def reconcile_once(self, now: datetime | None = None) -> Counts:
        """Claim a batch of stale calls and settle or advance each; see the module doc.
        ``now``: a logical time (tests); by default the database's clock."""
        self._logical = now is not None
        if now is None:
            await self.db.sync_clock(self.clock)
            now = self.clock()
        self._pass_start = (now, time.monotonic())
        counts = Counts()
        try:
            batch = await self.claim(now)
        except DatabaseError as exc:
            if isinstance(exc, DatabaseUnavailable):  # logged once per outage
                self._backoff = self.outage.down(exc)
            else:
                log.warning("claim failed: %s", exc)
            counts.errors += 1
            counts.pass_failed = True
            return counts
        self.outage.up()
        counts.claimed = len(batch)
        if batch:
            failpoint("reconciler_after_claim")
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(item: Row) -> None:
            async with gate:
                await self._handle(item, now, counts)

        async with asyncio.TaskGroup() as group:
            for item in batch:
                group.create_task(one(item))
        if self.outside.due(now):
            await self._outside(now, counts)
        return counts

    async def _outside(self, now: datetime, counts: Counts) -> None:
        """What hosts ended themselves (:mod:`callwarden.reconciler.outside`); a database
        error is counted and left to the next pass."""
        try:
            counts.ended_outside, counts.leftovers_settled = await self.outside.run(now)
        except DatabaseError as exc:
            log.warning("jobs ended by their host: not recorded this pass (%s)", exc)
            counts.errors += 1

    def claim_request(self, now: datetime) -> ClaimRequest:
        """This owner's claim at ``now``."""
        c = self.config
        return ClaimRequest(
            owner=self.owner, now=now, lease_until=now + timedelta(seconds=c.claim_lease_s),
            stale=c.stale,
            cutoff=now - timedelta(seconds=min(c.min_threshold_s, c.heartbeat_timeout_s)),
            horizon_extra_s=c.attempt_cap * c.repoll_interval_s,
            legacy_cutoff=c.legacy_cutoff, batch_size=c.batch_size,
            reserved_before=(now - timedelta(seconds=c.reserved_without_call_s)
                             if c.reserved_without_call_s else None))

    def claim_params(self, now: datetime) -> dict[str, Any]:
        """The parameters of the ``reconcile_claim`` statement at ``now``."""
        return self.claim_request(now).sql_params()

    async def claim(self, now: datetime) -> list[Row]:
        """Claim up to ``batch_size`` stale calls for this owner (one statement); the rows
        as read (each is turned into a :class:`Candidate` on its own, so one unreadable
        row never costs the batch)."""
        return await self.db.claim(self.claim_request(now))

    async def candidate(self, row: Row) -> Candidate:
        """The claimed row as a :class:`Candidate`, its call folded from its log: the log
        is the truth the projection columns only cache, so what host code wrote over them
        is never acted on (the next write rewrites them from the fold). The row and the
        log are read in one snapshot; a row with no events (the host's seed columns) is
        read as it is. ``EventDecodeError`` (the row is parked) when the log cannot be read
        or replayed, or the row's ``call_version`` is not the length of its log."""
        job: uuid.UUID = row["id"]
        current, events = await self.db.candidate_read(job)
        if current is None:
            raise JobNotFound(job)
        now = current
        if not events and now["call_version"] == 0:
            try:
                return Candidate.from_row(row)
            except ProjectionUnreadable as exc:
                log.warning("job %s: %s; reading the call from its log", job, exc)
        folded = fold_for_row(job, events, now["call_version"])
        return Candidate.from_row(row, msgspec.structs.replace(
            folded, status=folded.status if folded.terminal else now["status"],
            settled_reservations=int(now["settled_reservations"] or 0)))

    async def _handle(self, row: Row, now: datetime, counts: Counts) -> None:
        job: uuid.UUID = row["id"]
        park = False
        try:
            await self._signal("claimed", job)
            if not await self._renew(job):
                log.info("job %s: claim lost to another reconciler", job)
                counts.lost_race += 1
                return
            item = await self.candidate(row)
            action = decide(item, now, self.config)
            await self._signal("decided", job)
            await self._act(job, item.call, action, now, counts)
        except EventDecodeError as exc:
            log.error("job %s: cannot be read (%s); parked until the next re-poll", job, exc)
            counts.unreadable += 1
            park = True
        except DatabaseUnavailable as exc:  # an outage: the claim expires, nothing lost
            log.debug("job %s: %s: %s", job, type(exc).__name__, exc)
            self._backoff = self.outage.down(exc)  # one log line per outage
            counts.errors += 1
            counts.interrupted = True
        except Exception as exc:  # any other failure is this row's outcome, not the pass's
            log.exception("job %s: unexpected error", job)
            park = not await self._record_error(job, exc, now, counts)
        finally:
            await self._release(job, park=park)

    async def _record_error(self, job: uuid.UUID, exc: Exception, now: datetime,
                            counts: Counts) -> bool:
        """Attempt + 1 with the error kept; ``False`` if even that could not be written."""
        try:
            p = await self.db.load(job)
            if p.state is None or p.terminal:
                counts.errors += 1
                return False
            await self._attempted(job, p, "error", f"{type(exc).__name__}: {exc}"[:500],
                                  now, counts, count="errors")
            return True
        except Exception:  # the row is parked instead
            log.exception("job %s: could not record the error either", job)
            counts.errors += 1
            return False

    async def _renew(self, job: uuid.UUID) -> bool:
        """Extend the claim from the time of renewal (not from the pass's start)."""
        lease = self._event_clock() + timedelta(seconds=self.config.claim_lease_s)
        return await self.db.renew(job, self.owner, lease)

    async def _release(self, job: uuid.UUID, *, park: bool = False) -> None:
        until = self._event_clock() + timedelta(seconds=self.config.repoll_interval_s)
        with contextlib.suppress(DatabaseError):  # the claim lease expires on its own
            if park:
                await self.db.park(job, self.owner, until)
            else:
                await self.db.release(job, self.owner)
        await self._signal("released", job)

    # -- acting on a decision -----------------------------------------------------------

    async def _act(self, job: uuid.UUID, p: CallProjection, action: Action, now: datetime,
                   counts: Counts) -> None:
        if isinstance(action, Skip):
            log.debug("job %s: left alone (%s)", job, action.reason)
            counts.skipped += 1
        elif isinstance(action, Adopt):
            await self._adopt(job, p, action, now, counts)
        elif isinstance(action, Sweep | Exhaust):
            event, count, what = self._ending(action, now)
            await self._write(job, p, event, counts, count, what)
        elif isinstance(action, Finalize):
            await self._finalize(job, counts, p, final=action.final)
        elif isinstance(action, RecordHostEnded):
            await self._write(job, p, HostEnded(at=now, actor=self.owner, status=action.status),
                              counts, "host_ended", f"ended by the host ({action.status})")
        else:
            await self._poll(job, p, action, now, counts)

    def _ending(self, action: Sweep | Exhaust, now: datetime) -> tuple[Event, str, str]:
        """The terminal event of a sweep or an exhaust, its count and its log line."""
        if isinstance(action, Sweep):
            why = f" ({action.why})" if action.why else ""
            return (Swept(at=now, actor=self.owner, reason=action.reason), "swept",
                    f"swept: {action.reason}{why}")
        return (Exhausted(at=now, actor=self.owner, attempts=action.attempts,
                          last_error=action.last_error), "exhausted",
                f"exhausted after {action.attempts} attempts")

    async def _adopt(self, job: uuid.UUID, p: CallProjection, action: Adopt, now: datetime,
                     counts: Counts) -> None:
        event = adopted_event(action, now, self.owner)
        adopted = f"adopted ({action.kind}, task {action.task_id})"
        if isinstance(action.then, Sweep | Exhaust):
            # Adopted and its end in ONE write: between two writes the row was an adopted,
            # open call with no task, which a worker under ambiguous_create="recreate"
            # would create upstream again (billed by the provider, refunded to the user).
            ending, count, what = self._ending(action.then, now)
            r = await self._write(job, p, [event, ending], counts, "adopted",
                                  f"{adopted}, then {what}")
            if r is not None:
                counts.bump(count)
                record_reconcile(action.kind, count)
            return
        try:
            r = await self._write(job, p, event, counts, "adopted", adopted)
        except TaskAlreadyClaimed:
            # (Citus, where no unique index on jobs stops a host writing a second row with
            # another job's task: that job polls it; this one is ended and refunded)
            await self._adopt(job, p, msgspec.structs.replace(
                action, then=Sweep(why="its upstream task is another job's")), now, counts)
            return
        if r is not None:
            await self._act(job, r.projection, action.then, now, counts)

    async def _write(self, job: uuid.UUID, p: CallProjection, event: Event | list[Event],
                     counts: Counts, count: str, what: str) -> AppendResult | None:
        """Append ``event`` (or a run of them) fenced on the version read (``p``); ``None``
        if the call moved meanwhile (the write is dropped, never retried blindly)."""
        first = event[0] if isinstance(event, list) else event
        r = await self.db.append(job, p, event, before=lambda: self._signal("write", job))
        if not r.ok and not isinstance(first, HostEnded) and host_status_ended(r.projection):
            assert r.projection.status is not None  # the host ended it meanwhile: record it
            await self._write(job, r.projection, HostEnded(
                at=first.at, actor=self.owner, status=r.projection.status), counts,
                "host_ended", f"ended by the host ({r.projection.status})")
            return None
        if not r.ok:
            state = r.projection.state.value if r.projection.state else "none"
            log.info("job %s: %s skipped: the call moved to %s meanwhile", job,
                     type(first).__name__, state)
            counts.lost_race += 1
            record_reconcile(p.provider_kind, "lost_race")
            return None
        log.info("job %s: %s", job, what)
        counts.bump(count)
        record_reconcile(p.provider_kind or r.projection.provider_kind, count)
        return r

    async def _finalize(self, job: uuid.UUID, counts: Counts, p: CallProjection, *,
                        final: bool = False) -> None:
        """Finalize from ``p``, the call as this pass read it from its log (never the
        columns host code may have written over: their media URLs are not the call's)."""
        done = await self.finalizer.finalize(job, p)
        log.info("job %s: finalize -> %s%s", job, done.outcome,
                 f" ({done.error})" if done.error else "")
        if done.outcome == "retry_later" and final:  # past the horizon: it ends here
            p = done.projection
            await self._write(job, p, Exhausted(
                at=self._event_clock(), actor=self.owner, attempts=p.reconcile_attempts,
                last_error=done.error), counts, "exhausted",
                "exhausted: the result could not be stored before the horizon")
        elif done.outcome == "retry_later":  # FinalizeFailed recorded: retry after re-poll
            await self._attempted(job, done.projection, "finalize_failed", done.error,
                                  self._event_clock(), counts, count="errors")
        else:
            counts.bump(_FINALIZE_COUNT[done.outcome])
            record_reconcile(done.projection.provider_kind, _FINALIZE_COUNT[done.outcome])

    async def _poll(self, job: uuid.UUID, p: CallProjection, action: PollUpstream,
                    now: datetime, counts: Counts) -> None:
        with call_context(job, action.kind):
            outcome, error = await self._poll_once(action)
        if action.final and (outcome is None or isinstance(outcome, Running)):
            await self._write(job, p, Exhausted(
                at=now, actor=self.owner, attempts=p.reconcile_attempts,
                last_error=error or p.reconcile_last_error), counts, "exhausted",
                "exhausted: past its horizon without an upstream result")
            return
        if outcome is None or isinstance(outcome, Running):
            kind = "error" if outcome is None else "still_running"
            await self._attempted(job, p, kind, error, now, counts,
                                  count="errors" if outcome is None else kind)
            return
        try:
            outcome, keys = await store_inline(
                self.finalizer.media, job, action.kind, outcome, settings=self.settings,
                config=self.finalizer.config)
        except StorageError as exc:  # re-polled next time: the answer is still there
            await self._attempted(job, p, "error", f"storing an inline result: {exc}", now,
                                  counts, count="errors")
            return
        event = upstream_event(outcome, self.owner, now, stored_keys=keys)
        assert event is not None
        count = {Succeeded: "recovered", Failed: "failed", NotFound: "swept"}[type(outcome)]
        r = await self._write(job, p, event, counts, count,
                              f"upstream {type(outcome).__name__.lower()}")
        if r is not None and isinstance(outcome, Succeeded):
            await self._finalize(job, counts, r.projection)

    async def _poll_once(self, action: PollUpstream) -> tuple[PollOutcome | None, str | None]:
        """ONE poll (no loop): the outcome, or ``None`` and the provider error."""
        created = action.call_started_at.timestamp() if action.call_started_at else None
        try:
            return await poll_task(action.kind, action.task_id, self.session, self.settings,
                                   created_at=created, sleep=self.sleep), None
        except ProviderError as exc:
            return None, f"{type(exc).__name__}: {exc}"

    async def _attempted(self, job: uuid.UUID, p: CallProjection, outcome: str,
                         error: str | None, now: datetime, counts: Counts,
                         count: str) -> None:
        """Attempt + 1 with the outcome (and error) kept; next poll after the re-poll
        interval, so a frequent scan never burns attempts faster."""
        due = now + timedelta(seconds=self.config.repoll_interval_s)
        event = ReconcileAttempted(at=now, actor=self.owner, outcome=outcome, error=error,
                                   next_attempt_at=due)
        what = f"{outcome}{f' ({error})' if error else ''}; next attempt {due.isoformat()}"
        await self._write(job, p, event, counts, count, what)

    async def reconcile_once_through_outage(self) -> Counts:
        """One pass (``--once``), retried with the outage's backoff while the database is
        unavailable — at the claim or while the pass handles its rows — until a pass runs
        through or the outage outlasts its limit (then that pass's counts, with
        ``pass_failed`` or ``interrupted`` set)."""
        while True:
            counts = await self.reconcile_once()
            failed = counts.pass_failed or counts.interrupted
            if not (failed and self.outage.is_down) or self.outage.over_limit:
                return counts
            await self.sleep(self._backoff)

    # -- the loop ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the media connections its finalizer keeps between finalizations
        (:meth:`run` does, when it ends)."""
        await self.finalizer.aclose()

    async def run(self, stop: asyncio.Event, *, rng: random.Random | None = None) -> None:
        """``reconcile_once`` every jittered scan interval until ``stop`` is set; a pass
        in hand is always finished."""
        try:
            await self._run(stop, rng or random.Random())
        finally:
            await self.aclose()

    async def _run(self, stop: asyncio.Event, rng: random.Random) -> None:
        while not stop.is_set():
            delay = next_scan_delay(self.config, rng.random())
            try:
                counts = await self.reconcile_once()
                if counts.claimed:
                    log.info("pass: %s", msgspec.json.encode(counts).decode())
                if self.outage.is_down:  # back off (at least a scan interval) meanwhile
                    delay = max(delay, self._backoff)
            except CallwardenError as exc:
                log.warning("pass failed: %s", exc)
            except Exception:  # a bug must not end the process: the next pass tries again
                log.exception("pass failed unexpectedly")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
