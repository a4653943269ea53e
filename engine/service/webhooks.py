"""Webhook receivers: verify, find the job, record the outcome, finalize in the background.

One route per provider scheme in :data:`callwarden.providers.registry.WEBHOOKS` (what a provider's
deliveries look like lives in ``providers/<provider>/webhook.py``; this module knows none):
a signed-body scheme at ``POST /webhooks/<provider>`` (Replicate: Svix, replay key
``webhook-id``; ElevenLabs: ``ElevenLabs-Signature``), a signal scheme at ``POST
/webhooks/<provider>/{job_id}/{token}`` (KIE: its HMAC when a key is configured, else the
job's secret callback token).

Every request is answered from its own facts. Only a missing or wrong signature, a stale
timestamp, an oversized body or a malformed one gets 4xx (providers retry on 4xx, so
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
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from callwarden import config as actor_config
from callwarden.calls.finalize import Finalizer
from callwarden.calls.inline import store_inline
from callwarden.calls.runner import ACTIVE
from callwarden.database.clock import DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.outage import Outage
from callwarden.database.port import WebhookDatabase
from callwarden.database.postgres import as_database
from callwarden.errors import ConfigError, DatabaseError, DatabaseUnavailable
from callwarden.events.states import CallState
from callwarden.observe.metrics import record_webhook
from callwarden.observe.tracing import call_context
from callwarden.providers.errors import ProviderError, SignatureError, StaleSignature, StorageError
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import WEBHOOKS, media_url_test
from callwarden.providers.webhooks import MalformedDelivery, Parsed, WebhookScheme
from callwarden.rules.upstream import upstream_event

__all__ = ["Receiver", "Reject", "TaskPoll", "WebhookConfig", "load_webhook_config"]

log = logging.getLogger("callwarden.webhooks")
T = TypeVar("T")
MiB = 2**20
TaskPoll = Callable[[str, str, float | None], Awaitable[PollOutcome]]
"""``poll(kind, task_id, created_at)``: one status check
(``callwarden.providers.registry.poll_task``
over the service's session); raises ``ProviderError``."""


class WebhookConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Signing secrets by provider (a signed-body receiver without one refuses everything;
    a signal receiver without one relies on per-job tokens), the body limit and how long
    a KIE callback may wait for its poll."""

    secrets: Mapping[str, str] = msgspec.field(default_factory=dict)
    max_body_bytes: int = MiB
    poll_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ConfigError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if not (math.isfinite(self.poll_timeout_s) and self.poll_timeout_s > 0):
            raise ConfigError(f"poll_timeout_s must be a positive number of seconds, got "
                              f"{self.poll_timeout_s}")
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


def load_webhook_config(path: Path | None, env: Mapping[str, str]) -> WebhookConfig:
    """Like every actor's settings (:mod:`callwarden.config`): defaults < ``path``'s
    ``[webhooks]`` (``max_body_bytes``, ``poll_timeout_s``) < ``CALLWARDEN_WEBHOOK_<FIELD>``.
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
    :class:`~callwarden.database.port.WebhookDatabase`)."""

    def __init__(self, db: Pool | WebhookDatabase, finalizer: Finalizer,
                 config: WebhookConfig, *,
                 clock: Callable[[], float] = time.time,
                 now: Callable[[], datetime] | None = None,
                 poll: TaskPoll | None = None, outage: Outage | None = None) -> None:
        self.db: WebhookDatabase = as_database(db)
        self.finalizer, self.config = finalizer, config
        self.outage = outage if outage is not None else Outage(log, "service")
        self.clock = clock
        self.now = now if now is not None else DatabaseClock()
        self.poll = poll
        self.background: set[asyncio.Task[None]] = set()

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
        """Wait for the background finalizations started so far; cancel those still
        running after ``timeout``. Returns how many had to be cancelled."""
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
        """A signal: poll the task and record what the poll says."""
        p = await self.db.load(job_id)
        if p.state not in ACTIVE:
            if p.state is CallState.UPSTREAM_SUCCEEDED:
                self._finalize_later(job_id)
            return "noop", f"job {job_id} is already {p.state}"
        if self.poll is None:
            raise Reply("noted", "no poller configured: left to the workers' polls", 202)
        try:
            async with asyncio.timeout(self.config.poll_timeout_s):
                with call_context(job_id, kind):
                    outcome = await self.poll(kind, task_id,
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
        state = result.projection.state
        if state is CallState.UPSTREAM_SUCCEEDED:
            self._finalize_later(job_id)
        if result.ok:
            return "applied", f"job {job_id} is {state}"
        log.info("webhook %s for job %s: no-op, the call is %s", provider, job_id, state)
        return "noop", f"job {job_id} is already {state}"

    def _finalize_later(self, job_id: uuid.UUID) -> None:
        task = asyncio.get_running_loop().create_task(self._finalize(job_id))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _finalize(self, job_id: uuid.UUID) -> None:
        try:
            done = await self.finalizer.finalize(job_id)
            log.info("webhook finalize of %s: %s", job_id, done.outcome)
        except Exception:  # the reconciler finishes what this could not
            log.exception("webhook finalize of %s failed; left for the reconciler", job_id)


def _parse(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except MalformedDelivery as exc:
        raise Reject(400, "malformed", str(exc)) from None

