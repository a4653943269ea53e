"""Webhook receivers: verify, find the job, record the outcome, finalize in the background.

One route per provider scheme in :data:`callwarden.providers.registry.WEBHOOKS` (what a provider's
deliveries look like lives in ``providers/<provider>/webhook.py``; this module knows none):
a signed-body scheme at ``POST /webhooks/<provider>`` (Replicate: Svix, replay key
``webhook-id``; ElevenLabs: ``ElevenLabs-Signature``), a signal scheme at ``POST
/webhooks/<provider>/{job_id}/{token}`` (KIE: its HMAC when a key is configured, else the
job's secret callback token).

Every request is answered from its own facts. Only a missing or wrong signature, a stale
timestamp, an oversized, compressed (any ``Content-Encoding`` but identity: 415, never
inflated) or malformed body gets 4xx (providers retry on 4xx, so
nothing else may); a database error gets 503 with ``Retry-After`` (the delivery is
forgotten, so the retry applies). Everything authentic is acknowledged with 2xx: a
duplicate delivery (same ``webhook-id``, same signature) changes nothing; a task that is
not (yet) a call of ours, an intermediate stage, or a call already past the outcome are
acknowledged no-ops.

What a delivery is trusted for: Replicate and ElevenLabs sign the body, so its outcome is
recorded. KIE signs only ``taskId.timestamp`` (or nothing, with the per-job URL token): its
body could be forged inside the signature's tolerance window, so a KIE callback is only a
signal — the receiver polls the task (``recordInfo`` and the family's own endpoints) and
records what the poll says. Finalization runs after the answer, in a background task; if
this process dies first, the reconciler finishes it (the call sits in
``upstream_succeeded``).

What a replay may cost (a KIE callback URL in token mode has no timestamp): per job, one
poll or finalization in flight, no webhook-triggered poll sooner than
``signal_interval_s`` after the last one (a signal inside that window is acknowledged
``coalesced``; the worker's and the reconciler's polls cover it), and a call found in
``upstream_succeeded`` is finalized only when its next attempt is due, each failure
recording ``ReconcileAttempted`` (next attempt one re-poll interval later) and the
reconciler's attempt cap ending it ``exhausted`` (:mod:`callwarden.service.coalesce`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec
from aiohttp import web

from callwarden import config as actor_config
from callwarden.calls.finalize import Finalizer
from callwarden.calls.inline import store_inline
from callwarden.calls.runner import ACTIVE
from callwarden.database.clock import DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.outage import Outage
from callwarden.database.port import Database
from callwarden.database.postgres import as_database
from callwarden.errors import ConfigError, DatabaseError, DatabaseUnavailable
from callwarden.events.states import CallState
from callwarden.events.types import Event, Exhausted, ReconcileAttempted
from callwarden.observe.metrics import record_webhook
from callwarden.observe.tracing import call_context
from callwarden.projections.fold import CallProjection
from callwarden.providers.errors import ProviderError, SignatureError, StaleSignature, StorageError
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import WEBHOOKS, media_url_test
from callwarden.providers.webhooks import MalformedDelivery, Parsed, WebhookScheme
from callwarden.reconciler.config import ReconcileConfig
from callwarden.rules.upstream import upstream_event
from callwarden.service.coalesce import Throttle, finalize_step

__all__ = ["Receiver", "Reject", "TaskPoll", "WebhookConfig", "load_webhook_config"]

log = logging.getLogger("callwarden.webhooks")
T = TypeVar("T")
MiB = 2**20
_RECONCILE = ReconcileConfig()
TaskPoll = Callable[[str, str, float | None], Awaitable[PollOutcome]]
"""``poll(kind, task_id, created_at)``: one status check
(``callwarden.providers.registry.poll_task``
over the service's session); raises ``ProviderError``."""


class WebhookConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Signing secrets by provider (a signed-body receiver without one refuses everything;
    a signal receiver without one relies on per-job tokens), the body limit, how long
    a KIE callback may wait for its poll, and how soon after one webhook-triggered poll
    of a job another may start (``signal_interval_s``; 0: only one at a time)."""

    secrets: Mapping[str, str] = msgspec.field(default_factory=dict)
    max_body_bytes: int = MiB
    poll_timeout_s: float = 10.0
    signal_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ConfigError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if not (math.isfinite(self.poll_timeout_s) and self.poll_timeout_s > 0):
            raise ConfigError(f"poll_timeout_s must be a positive number of seconds, got "
                              f"{self.poll_timeout_s}")
        if not (math.isfinite(self.signal_interval_s) and self.signal_interval_s >= 0):
            raise ConfigError(f"signal_interval_s must be a number of seconds >= 0, got "
                              f"{self.signal_interval_s}")
        unknown = sorted(set(self.secrets) - set(WEBHOOKS))
        if unknown:
            raise ConfigError(f"secrets: no webhook scheme for {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(WEBHOOKS))})")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookConfig:
        """Defaults and the secrets in ``env`` (:func:`load_webhook_config` without a file)."""
        return load_webhook_config(None, env)

    @property
    def longest_tolerance_s(self) -> float:
        """How long a replay key must be kept (a replay older is refused as stale)."""
        return max(s.tolerance_s for s in WEBHOOKS.values())


actor_config.register("webhooks", WebhookConfig)


def load_webhook_config(path: Path | None, env: Mapping[str, str]) -> WebhookConfig:
    """Like every actor's settings (:mod:`callwarden.config`): defaults < ``path``'s
    ``[webhooks]`` (``max_body_bytes``, ``poll_timeout_s``, ``signal_interval_s``) <
    ``CALLWARDEN_WEBHOOK_<FIELD>``.
    The secrets come from each scheme's variable, ``CALLWARDEN_<PROVIDER>_WEBHOOK_SECRET``
    (KIE's ``CALLWARDEN_KIE_WEBHOOK_HMAC_KEY``), over any ``secrets`` table in the file."""
    secrets = {name: env[s.secret_env] for name, s in WEBHOOKS.items() if env.get(s.secret_env)}
    return actor_config.load(WebhookConfig, path=path, env=env, prefix="CALLWARDEN_WEBHOOK_",
                section="webhooks", overrides={"secrets": secrets})


# -- receiving -------------------------------------------------------------------------------

class Reject(Exception):
    """Answer ``status`` with ``outcome`` (the metric label) and change nothing."""

    def __init__(self, status: int, outcome: str, message: str) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome


def _signature_reject(exc: SignatureError) -> Reject:
    stale = isinstance(exc, StaleSignature)
    return Reject(401, "stale" if stale else "bad_signature", str(exc))


def _refuse_encoded(request: web.Request) -> None:
    """No provider compresses its deliveries: a body with any ``Content-Encoding`` but
    ``identity`` — in any of the headers, when there are several — is refused (415) before
    a byte of it is read, so a compressed bomb is never inflated here (the service's
    runner also turns aiohttp's inflation off)."""
    encodings = request.headers.getall("Content-Encoding", [])
    if any(e.strip().lower() not in ("", "identity") for e in encodings):
        raise Reject(415, "unsupported_encoding",
                     "compressed bodies are not accepted (Content-Encoding must be identity)")


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise Reject(413, "too_large", f"body over {limit} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise Reject(413, "too_large", f"body over {limit} bytes")
            chunks.append(chunk)
    except web.RequestPayloadError as exc:  # e.g. a Content-Encoding it is not in
        raise Reject(400, "malformed", f"body cannot be read: {exc}") from None
    return b"".join(chunks)


Handler = Callable[[web.Request], Awaitable[tuple[str, str]]]


class _Signal(NamedTuple):
    """What a signal asks for: poll ``task_id`` of ``kind`` for ``provider``'s receiver."""

    provider: str
    kind: str
    task_id: str
    started: datetime | None


class _Flight:
    """A webhook-triggered poll in progress: ``done`` when it ended, ``next`` the poll
    that trails it (started by the first signal that waited for it). A trailing poll is
    trailed by no one at once (the interval applies), so a steady stream of replays costs
    at most two polls per interval."""

    def __init__(self, *, trailing: bool = False) -> None:
        self.done = asyncio.Event()
        self.next: _Flight | None = None
        self.trailing = trailing  # signals that wait for a trailing poll never trail it


class Reply(Exception):
    """Answer 2xx with ``outcome`` now (an acknowledged no-op)."""

    def __init__(self, outcome: str, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome


class Receiver:
    """One receiver per scheme of ``callwarden.providers.registry.WEBHOOKS``, over one pool;
    ``clock`` (unix seconds) checks signature timestamps, ``now`` stamps events (default:
    the database's clock); ``poll`` checks a task when a signal scheme's callback names
    it (without one, such callbacks are acknowledged and left to the workers' and the
    reconciler's polls). ``db``: the database (a pool, or a
    :class:`~callwarden.database.port.Database`). ``attempt_cap`` and
    ``repoll_interval_s``: the reconciler's, which a failed webhook-triggered finalization
    counts towards (default: :class:`~callwarden.reconciler.config.ReconcileConfig`'s)."""

    def __init__(self, db: Pool | Database, finalizer: Finalizer,
                 config: WebhookConfig, *,
                 clock: Callable[[], float] = time.time,
                 now: Callable[[], datetime] | None = None,
                 poll: TaskPoll | None = None, outage: Outage | None = None,
                 attempt_cap: int = _RECONCILE.attempt_cap,
                 repoll_interval_s: float = _RECONCILE.repoll_interval_s,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.db: Database = as_database(db)
        self.finalizer, self.config = finalizer, config
        self.outage = outage if outage is not None else Outage(log, "service")
        self.clock = clock
        self.now = now if now is not None else DatabaseClock()
        self.poll = poll
        self.attempt_cap, self.repoll_interval_s = attempt_cap, repoll_interval_s
        self.background: set[asyncio.Task[None]] = set()
        self.sleep = sleep
        self.polls = Throttle(config.signal_interval_s)  # webhook-triggered polls
        self.finalizing = Throttle()  # webhook-triggered finalizations: single flight
        # A signal coalesced away is not lost: a signal that waited for the poll in flight
        # polls next; one within the interval gets one trailing poll when it is over.
        self._flights: dict[uuid.UUID, _Flight] = {}
        self._pending: dict[uuid.UUID, _Signal] = {}
        self._trailing: set[uuid.UUID] = set()
        self.deferred: set[asyncio.Task[None]] = set()

    def routes(self) -> list[web.RouteDef]:
        """``POST /webhooks/<provider>`` for a signed-body scheme,
        ``/webhooks/<provider>/{job_id}/{token}`` for a signal scheme."""
        out = []
        for name, scheme in WEBHOOKS.items():
            if scheme.trusts_body:
                out.append(web.post(f"/webhooks/{name}", self._wrap(name, self._signed(scheme))))
            else:
                out.append(web.post(f"/webhooks/{name}/{{job_id}}/{{token}}",
                                    self._wrap(name, self._signal(scheme))))
        return out

    async def drain(self, timeout: float = 10.0) -> int:  # noqa: ASYNC109
        """Wait for the background finalizations (and trailing polls) started so far;
        cancel those still running after ``timeout``, and every trailing poll still
        waiting for its interval. Returns how many running ones had to be cancelled."""
        for task in set(self.deferred):
            task.cancel()
        if not self.background:
            return 0
        _, pending = await asyncio.wait(set(self.background), timeout=timeout)
        for task in pending:
            task.cancel()
        return len(pending)

    def _wrap(self, provider: str, handler: Handler) -> Callable[
            [web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            headers: dict[str, str] = {}
            try:
                _refuse_encoded(request)
                await self.db.sync_clock(self.now)
                outcome, message = await handler(request)
                status = 200
            except Reply as exc:
                outcome, message, status = exc.outcome, str(exc), exc.status
            except Reject as exc:
                outcome, message, status = exc.outcome, str(exc), exc.status
            except (DatabaseUnavailable, DatabaseError, StorageError) as exc:
                outcome, message, status = "error", f"try again later: {exc}", 503
                headers["Retry-After"] = "30"
                if isinstance(exc, DatabaseUnavailable):  # one log line per outage
                    self.outage.down(exc)
            else:
                if self.outage.is_down:  # the answer may not have needed the database
                    await self._probe()
            record_webhook(provider, outcome, time.perf_counter() - started)
            if status >= 400:
                log.info("webhook %s refused (%s): %s", provider, outcome, message)
            return web.json_response({"result": outcome, "detail": message}, status=status,
                                     headers=headers)
        return handle

    async def _probe(self) -> None:
        """End the service's outage only if the database answers (a delivery about no
        call is answered without it)."""
        try:
            await self.db.ping()
        except DatabaseError:
            return
        self.outage.up()

    # -- the two kinds of scheme -------------------------------------------------------------

    def _signed(self, scheme: WebhookScheme) -> Handler:
        """The signature covers the body: verify, read the outcome from it, record it."""
        async def handle(request: web.Request) -> tuple[str, str]:
            secret = self.config.secrets.get(scheme.provider)
            if not secret:
                raise Reject(401, "not_configured",
                             f"no {scheme.provider} webhook secret configured")
            body = await read_body(request, self.config.max_body_bytes)
            try:
                replay_key = scheme.verify(secret, None, request.headers, body,
                                           now=self.clock())
            except SignatureError as exc:
                raise _signature_reject(exc) from None
            is_media = media_url_test(scheme.kinds, self.finalizer.settings)
            parsed = _parse(lambda: scheme.parse(body, is_media=is_media))
            if parsed is None:
                return "ignored", "event type concerns no call"
            return await self._deliver(scheme.provider, replay_key, scheme.kinds, parsed)
        return handle

    def _signal(self, scheme: WebhookScheme) -> Handler:
        """The body only names a task: authenticate (the scheme's signature, else the job's
        URL token), then poll the task and record what the poll says."""
        async def handle(request: web.Request) -> tuple[str, str]:
            body = await read_body(request, self.config.max_body_bytes)
            task_id = _parse(lambda: scheme.task_id(body))
            delivery = self._signal_signature(scheme, request, task_id, body)
            job = await self._signal_job(request, authenticated=delivery is not None)
            return await self._signalled(scheme, job, task_id, delivery)
        return handle

    async def _signalled(self, scheme: WebhookScheme, job: Mapping[str, Any], task_id: str,
                         delivery: str | None) -> tuple[str, str]:
        kind = str(job["provider_kind"] or "")
        # An authentic signal is never answered 4xx (providers retry those): one that
        # concerns nothing callwarden tracks is acknowledged and changes nothing.
        if kind not in scheme.kinds:
            raise Reply("ignored", f"job {job['id']} has no {scheme.provider} task: "
                        "nothing to do")
        if job["provider_task_id"] is None:
            raise Reply("not_yet_known", "the job's task id is not recorded yet; its "
                        "worker polls it", status=202)
        if job["provider_task_id"] != task_id:  # e.g. a task replaced under "recreate"
            raise Reply("ignored", f"callback about task {task_id}, not the job's current "
                        "task: acknowledged, nothing changed")
        if delivery is not None and not await self.db.record_delivery(
                scheme.provider, delivery, job["id"]):
            return "duplicate", "delivery already processed"
        try:
            return await self._poll_and_record(scheme.provider, job["id"], kind, task_id,
                                               job["provider_call_started_at"])
        except (DatabaseUnavailable, DatabaseError, StorageError):
            if delivery is not None:
                await self._forget_delivery(scheme.provider, delivery)
            raise

    async def _poll_and_record(self, provider: str, job_id: uuid.UUID, kind: str,
                               task_id: str, started: datetime | None) -> tuple[str, str]:
        """A signal: poll the task and record what the poll says (one poll per job at a
        time, none sooner than ``signal_interval_s`` after the last)."""
        p = await self.db.load(job_id)
        if p.state not in ACTIVE:
            return self._already(provider, job_id, p)
        if self.poll is None:
            raise Reply("noted", "no poller configured: left to the workers' polls", 202)
        signal = _Signal(provider, kind, task_id, started)
        waited = await self._after_flight(job_id)
        trails = waited is not None and not waited.trailing
        if not self.polls.begin(job_id, self.clock(), anyway=trails):
            self._defer(job_id, signal)
            raise Reply("coalesced", f"job {job_id} was polled less than "
                        f"{self.config.signal_interval_s:g} s ago: one trailing poll "
                        "follows when the interval is over")
        return await self._fly(job_id, signal, after=waited if trails else None)

    async def _after_flight(self, job_id: uuid.UUID) -> _Flight | None:
        """Wait for the job's poll in flight, if any. The first signal that waited polls
        next (a trailing poll: what it says may be news, e.g. Suno's ``complete`` right
        after ``first``); every later one waits for that poll and is answered
        ``coalesced``. The flight this signal waited for (``None``: none)."""
        flight = self._flights.get(job_id)
        if flight is None:
            return None
        await flight.done.wait()
        if flight.next is not None:  # another waiter trails it: that poll covers this one
            await flight.next.done.wait()
            raise Reply("coalesced", f"job {job_id} was polled after this signal arrived")
        return flight

    async def _fly(self, job_id: uuid.UUID, signal: _Signal, *,
                   after: _Flight | None = None, trailing: bool = False) -> tuple[str, str]:
        """One poll of the job (admitted by ``self.polls``; ``after``: the flight it
        trails), the one later signals wait for. No await before it is registered."""
        flight = _Flight(trailing=after is not None or trailing)
        if after is not None:
            after.next = flight
        self._flights[job_id] = flight
        assert self.poll is not None
        try:
            return await self._poll_once(self.poll, job_id, signal)
        except (DatabaseUnavailable, DatabaseError, StorageError):
            self.polls.forget(job_id)  # nothing was recorded: the provider's retry polls
            raise
        finally:
            self.polls.end(job_id)
            flight.done.set()
            if self._flights.get(job_id) is flight:
                del self._flights[job_id]

    def _defer(self, job_id: uuid.UUID, signal: _Signal) -> None:
        """Keep ``signal`` for one trailing poll when the job's interval is over."""
        self._pending[job_id] = signal
        if job_id in self._trailing:
            return
        self._trailing.add(job_id)
        delay = self.polls.wait_s(job_id, self.clock())
        task = asyncio.get_running_loop().create_task(self._trailing_poll(job_id, delay))
        self.deferred.add(task)
        task.add_done_callback(self.deferred.discard)

    async def _trailing_poll(self, job_id: uuid.UUID, delay: float) -> None:
        try:
            await self.sleep(delay)
            signal = self._pending.pop(job_id, None)
            self._trailing.discard(job_id)
            if signal is None or job_id in self._flights:  # a poll after them is on its way
                return
            if (await self.db.load(job_id)).state not in ACTIVE:
                return
            if job_id not in self._flights and \
                    self.polls.begin(job_id, self.clock(), anyway=True):
                await self._fly(job_id, signal, trailing=True)
        except Reply:
            pass
        except Exception:  # the workers' and the reconciler's polls cover it
            log.exception("trailing poll of %s failed; left to the polls", job_id)
        finally:
            self._trailing.discard(job_id)

    async def _poll_once(self, poll: TaskPoll, job_id: uuid.UUID, signal: _Signal
                         ) -> tuple[str, str]:
        provider, kind, task_id, started = signal
        try:
            async with asyncio.timeout(self.config.poll_timeout_s):
                with call_context(job_id, kind):
                    outcome = await poll(kind, task_id,
                                         started.timestamp() if started else None)
        except (ProviderError, TimeoutError) as exc:
            raise Reply("noted", f"polling the task failed ({exc}); left to the polls",
                        202) from None
        parsed = Parsed(task_id=task_id, outcome=outcome)
        if parsed.intermediate:
            return "intermediate", "the task is still running upstream"
        return await self._record(provider, job_id, parsed)

    def _signal_signature(self, scheme: WebhookScheme, request: web.Request, task_id: str,
                          body: bytes) -> str | None:
        """With a secret: verify and return the replay key. Without: ``None`` (the URL
        token authenticates)."""
        secret = self.config.secrets.get(scheme.provider)
        if not secret:
            return None
        try:
            return scheme.verify(secret, task_id, request.headers, body, now=self.clock())
        except SignatureError as exc:
            raise _signature_reject(exc) from None

    async def _signal_job(self, request: web.Request, *, authenticated: bool
                          ) -> Mapping[str, Any]:
        try:
            job_id = uuid.UUID(request.match_info["job_id"])
        except ValueError:
            raise Reject(404, "unknown_task", "no such job") from None
        row = await self.db.job_by_id(job_id)
        if row is None:
            if authenticated:  # signature-verified: the provider's own, for a job we lack
                raise Reply("unknown_task", "no such job: acknowledged", status=202)
            raise Reject(401, "unknown_task", "no such job")
        stored, given = row["callback_token"], request.match_info["token"]
        if stored is None and authenticated:
            return row  # signature-verified; the job never had a token
        if not (isinstance(stored, str)
                and hmac.compare_digest(given.encode(), stored.encode())):
            raise Reject(401, "bad_signature", "callback token does not match the job")
        return row

    # -- the shared path ---------------------------------------------------------------------

    async def deliver(self, provider: str, delivery_id: str | None, kinds: tuple[str, ...],
                      parsed: Parsed) -> tuple[str, str]:
        """A verified, parsed delivery (what every signed-body route ends in): find the
        job by its task, dedupe the delivery, record the outcome; ``(outcome, message)``,
        or :class:`Reply` with the answer."""
        if parsed.intermediate:
            return "intermediate", "intermediate stage acknowledged"
        row = await self.db.find_job(kinds, parsed.task_id)
        if row is None:
            raise Reply("unknown_task", f"no call for task {parsed.task_id} (not ours, "
                        "or not recorded yet: its worker polls it)", status=202)
        job_id = row["id"]
        if delivery_id is not None and not await self.db.record_delivery(
                provider, delivery_id, job_id):
            return "duplicate", "delivery already processed"
        try:
            return await self._record(provider, job_id, parsed)
        except (DatabaseUnavailable, DatabaseError, StorageError):
            if delivery_id is not None:
                await self._forget_delivery(provider, delivery_id)
            raise

    _deliver = deliver

    async def _forget_delivery(self, provider: str, delivery_id: str) -> None:
        try:
            await self.db.forget_delivery(provider, delivery_id)
        except (DatabaseUnavailable, DatabaseError):
            log.warning("could not forget delivery %s/%s", provider, delivery_id)

    async def _record(self, provider: str, job_id: uuid.UUID,
                      parsed: Parsed) -> tuple[str, str]:
        kind = (await self.db.load(job_id)).provider_kind or ""
        outcome, keys = await store_inline(
            self.finalizer.media, job_id, kind, parsed.outcome,
            settings=self.finalizer.settings, config=self.finalizer.config)
        event = upstream_event(outcome, f"webhook:{provider}", self.now(), stored_keys=keys)
        result = await self.db.transition(
            job_id, lambda p: event if event is not None and p.state in ACTIVE else None)
        if result.ok:
            if result.projection.state is CallState.UPSTREAM_SUCCEEDED:
                self._finalize_soon(provider, job_id, result.projection, fresh=True)
            return "applied", f"job {job_id} is {result.projection.state}"
        log.info("webhook %s for job %s: no-op, the call is %s", provider, job_id,
                 result.projection.state)
        return self._already(provider, job_id, result.projection)

    def _already(self, provider: str, job_id: uuid.UUID, p: CallProjection
                 ) -> tuple[str, str]:
        """A delivery about a call already past ``polling``: nothing to record; a call
        left in ``upstream_succeeded`` may get a finalization (:func:`finalize_step`)."""
        if p.state is not CallState.UPSTREAM_SUCCEEDED:
            return "noop", f"job {job_id} is already {p.state}"
        step = self._finalize_soon(provider, job_id, p, fresh=False)
        return "noop", f"job {job_id} is already {p.state} (finalization: {step})"

    def _finalize_soon(self, provider: str, job_id: uuid.UUID, p: CallProjection, *,
                       fresh: bool) -> str:
        """Start a background finalization unless one of this job's is in flight or
        :func:`finalize_step` says to wait (a result just recorded, ``fresh``, is tried at
        once); ``exhaust`` ends the call at the attempt cap instead. What was done."""
        step = "finalize" if fresh else finalize_step(p, self.now(), self.attempt_cap)
        if step == "held":
            return "not due before its next attempt"
        if not self.finalizing.begin(job_id, 0.0):
            return "one in flight"
        task = asyncio.get_running_loop().create_task(
            self._finalize(provider, job_id, exhaust=step == "exhaust"))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return step

    async def _finalize(self, provider: str, job_id: uuid.UUID, *, exhaust: bool) -> None:
        actor = f"webhook:{provider}"
        try:
            if exhaust:
                await self._exhaust(job_id, actor)
                return
            done = await self.finalizer.finalize(job_id)
            log.info("webhook finalize of %s: %s", job_id, done.outcome)
            if done.outcome == "retry_later":  # counts towards the cap, as the reconciler's
                await self._attempted(job_id, actor, done.error)
        except Exception:  # the reconciler finishes what this could not
            log.exception("webhook finalize of %s failed; left for the reconciler", job_id)
        finally:
            self.finalizing.end(job_id)

    async def _attempted(self, job_id: uuid.UUID, actor: str, error: str | None) -> None:
        """Attempt + 1, the next one due a re-poll interval from now (the reconciler's
        ``ReconcileAttempted`` after a finalization that will be retried)."""
        now = self.now()
        event = ReconcileAttempted(
            at=now, actor=actor, outcome="finalize_failed", error=error,
            next_attempt_at=now + timedelta(seconds=self.repoll_interval_s))
        await self.db.transition(
            job_id, lambda p: event if p.state is CallState.UPSTREAM_SUCCEEDED else None)

    async def _exhaust(self, job_id: uuid.UUID, actor: str) -> None:
        now = self.now()

        def decide(p: CallProjection) -> Event | None:
            if p.state is not CallState.UPSTREAM_SUCCEEDED or \
                    p.reconcile_attempts < self.attempt_cap:
                return None
            return Exhausted(at=now, actor=actor, attempts=p.reconcile_attempts,
                             last_error=p.reconcile_last_error)

        result = await self.db.transition(job_id, decide)
        if result.ok:
            log.info("job %s: exhausted after %d attempts (webhook)", job_id,
                     result.projection.reconcile_attempts)


def _parse(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except MalformedDelivery as exc:
        raise Reject(400, "malformed", str(exc)) from None

