"""Webhook receivers: verify, find the job, record the outcome, finalize in the background.

``POST /webhooks/replicate`` (Svix signature, replay protection on ``webhook-id``),
``POST /webhooks/kie/{job_id}/{token}`` (KIE HMAC when a key is configured, else the job's
secret callback token) and ``POST /webhooks/elevenlabs`` (``ElevenLabs-Signature``).

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
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from engine.calls.finalize import Finalizer
from engine.calls.inline import store_inline
from engine.calls.runner import ACTIVE, upstream_event
from engine.errors import DatabaseError, DatabaseUnavailable
from engine.service.metrics import record_webhook
from engine.service.webhook_parse import (
    ELEVENLABS_KINDS,
    REPLICATE_KINDS,
    MalformedDelivery,
    Parsed,
    kie_task_id,
    parse_elevenlabs,
    parse_replicate,
)
from engine.store.clock import DatabaseClock, sync_clock
from engine.store.db import Pool
from engine.store.write import Conn, execute, load, transition
from events.states import CallState
from providers.errors import ProviderError, SignatureError, StorageError
from providers.kinds import KINDS
from providers.outcomes import PollOutcome
from providers.signing import verify_elevenlabs, verify_kie, verify_replicate

__all__ = ["CallbackUrls", "Receiver", "Reject", "TaskPoll", "WebhookConfig",
           "callback_url_for", "ensure_callback_token"]

log = logging.getLogger("callwarden.webhooks")
T = TypeVar("T")
MiB = 2**20
TaskPoll = Callable[[str, str, float | None], Awaitable[PollOutcome]]
"""``poll(kind, task_id, created_at)``: one status check (``providers.registry.poll_task``
over the service's session); raises ``ProviderError``."""


class WebhookConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Secrets (``None``: that receiver refuses everything, except KIE which then relies
    on per-job tokens), the body limit and the signature tolerances."""

    replicate_secret: str | None = None
    kie_hmac_key: str | None = None
    elevenlabs_secret: str | None = None
    max_body_bytes: int = MiB
    tolerance_s: float = 300.0
    elevenlabs_tolerance_s: float = 1800.0
    poll_timeout_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookConfig:
        return cls(replicate_secret=env.get("CALLWARDEN_REPLICATE_WEBHOOK_SECRET") or None,
                   kie_hmac_key=env.get("CALLWARDEN_KIE_WEBHOOK_HMAC_KEY") or None,
                   elevenlabs_secret=env.get("CALLWARDEN_ELEVENLABS_WEBHOOK_SECRET") or None)


# -- callback URLs ---------------------------------------------------------------------------

def callback_url_for(base_url: str, job_id: uuid.UUID, kind: str, token: str | None
                     ) -> str | None:
    """The URL a provider should call back for ``job_id``'s call of ``kind`` (``None``:
    the provider has no per-request callback, or KIE without a token)."""
    spec, root = KINDS.get(kind), base_url.rstrip("/")
    if spec is None or spec.mode != "async":
        return None
    if spec.provider == "kie":
        return f"{root}/webhooks/kie/{job_id}/{token}" if token else None
    if spec.provider == "replicate":
        return f"{root}/webhooks/replicate"
    return None  # ElevenLabs webhooks are configured per workspace, not per request


async def ensure_callback_token(conn: Conn, job_id: uuid.UUID) -> str | None:
    """The job's callback token, created once (a redelivered job keeps its token);
    ``None`` if there is no such job."""
    rows = await execute(conn, "callback_token_ensure", {
        "job_id": job_id, "token": secrets.token_urlsafe(24)})
    return str(rows[0]["callback_token"]) if rows else None


class CallbackUrls:
    """``CallRunner(callback_url=urls)``: call ``await urls.prepare(conn, job_id)`` before
    ``runner.run(job_id, ...)``; a job never prepared gets no callback (it is polled)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._tokens: dict[uuid.UUID, str] = {}

    async def prepare(self, conn: Conn, job_id: uuid.UUID) -> None:
        token = await ensure_callback_token(conn, job_id)
        if token is not None:
            self._tokens[job_id] = token

    def forget(self, job_id: uuid.UUID) -> None:
        self._tokens.pop(job_id, None)

    def __call__(self, job_id: uuid.UUID, kind: str) -> str | None:
        return callback_url_for(self.base_url, job_id, kind, self._tokens.get(job_id))


# -- receiving -------------------------------------------------------------------------------

class Reject(Exception):
    """Answer ``status`` with ``outcome`` (the metric label) and change nothing."""

    def __init__(self, status: int, outcome: str, message: str) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome


def _signature_reject(exc: SignatureError) -> Reject:
    stale = str(exc).startswith("stale")
    return Reject(401, "stale" if stale else "bad_signature", str(exc))


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise Reject(413, "too_large", f"body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise Reject(413, "too_large", f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


Handler = Callable[[web.Request], Awaitable[tuple[str, str]]]


class Reply(Exception):
    """Answer 2xx with ``outcome`` now (an acknowledged no-op)."""

    def __init__(self, outcome: str, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome


class Receiver:
    """The three receivers over one pool; ``clock`` (unix seconds) checks signature
    timestamps, ``now`` stamps events (default: the database's clock); ``poll`` checks a
    KIE task when a callback signals it (without one, KIE callbacks are acknowledged and
    left to the workers' and the reconciler's polls)."""

    def __init__(self, pool: Pool, finalizer: Finalizer, config: WebhookConfig, *,
                 clock: Callable[[], float] = time.time,
                 now: Callable[[], datetime] | None = None,
                 poll: TaskPoll | None = None) -> None:
        self.pool, self.finalizer, self.config = pool, finalizer, config
        self.clock = clock
        self.now = now if now is not None else DatabaseClock()
        self.poll = poll
        self.background: set[asyncio.Task[None]] = set()

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/webhooks/replicate", self._wrap("replicate", self._replicate)),
                web.post("/webhooks/kie/{job_id}/{token}", self._wrap("kie", self._kie)),
                web.post("/webhooks/elevenlabs", self._wrap("elevenlabs", self._elevenlabs))]

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
                await sync_clock(self.now, self.pool)
                outcome, message = await handler(request)
                status = 200
            except Reply as exc:
                outcome, message, status = exc.outcome, str(exc), exc.status
            except Reject as exc:
                outcome, message, status = exc.outcome, str(exc), exc.status
            except (DatabaseUnavailable, DatabaseError, StorageError) as exc:
                outcome, message, status = "error", f"try again later: {exc}", 503
                headers["Retry-After"] = "30"
            record_webhook(provider, outcome, time.perf_counter() - started)
            if status >= 400:
                log.info("webhook %s refused (%s): %s", provider, outcome, message)
            return web.json_response({"result": outcome, "detail": message}, status=status,
                                     headers=headers)
        return handle

    # -- providers ---------------------------------------------------------------------------

    async def _replicate(self, request: web.Request) -> tuple[str, str]:
        secret = self.config.replicate_secret
        if not secret:
            raise Reject(401, "not_configured", "no Replicate webhook secret configured")
        body = await read_body(request, self.config.max_body_bytes)
        try:
            msg_id = verify_replicate(secret, request.headers, body, now=self.clock(),
                                      tolerance_s=self.config.tolerance_s)
        except SignatureError as exc:
            raise _signature_reject(exc) from None
        parsed = _parse(lambda: parse_replicate(body))
        return await self._deliver("replicate", f"id:{msg_id}", REPLICATE_KINDS, parsed)

    async def _elevenlabs(self, request: web.Request) -> tuple[str, str]:
        secret = self.config.elevenlabs_secret
        if not secret:
            raise Reject(401, "not_configured", "no ElevenLabs webhook secret configured")
        body = await read_body(request, self.config.max_body_bytes)
        header = request.headers.get("ElevenLabs-Signature")
        try:
            replay_key = verify_elevenlabs(secret, header, body, now=self.clock(),
                                           tolerance_s=self.config.elevenlabs_tolerance_s)
        except SignatureError as exc:
            raise _signature_reject(exc) from None
        parsed = _parse(lambda: parse_elevenlabs(body))
        if parsed is None:
            return "ignored", "event type concerns no call"
        return await self._deliver("elevenlabs", f"sig:{replay_key}", ELEVENLABS_KINDS, parsed)

    async def _kie(self, request: web.Request) -> tuple[str, str]:
        body = await read_body(request, self.config.max_body_bytes)
        task_id = _parse(lambda: kie_task_id(body))
        delivery = self._kie_signature(request, task_id)
        job = await self._kie_job(request, authenticated=delivery is not None)
        kind = str(job["provider_kind"] or "")
        # An authentic callback is never answered 4xx (KIE retries those): one that
        # concerns nothing callwarden tracks is acknowledged and changes nothing.
        if not kind.startswith("kie-") or KINDS.get(kind) is None or KINDS[kind].mode != "async":
            raise Reply("ignored", f"job {job['id']} has no KIE task: nothing to do")
        if job["provider_task_id"] is None:
            raise Reply("not_yet_known", "the job's task id is not recorded yet; its "
                        "worker polls it", status=202)
        if job["provider_task_id"] != task_id:  # e.g. a task replaced under "recreate"
            raise Reply("ignored", f"callback about task {task_id}, not the job's current "
                        "task: acknowledged, nothing changed")
        async with self.pool.connection() as conn:
            if delivery is not None and not await _claim_delivery(conn, "kie", delivery,
                                                                  job["id"]):
                return "duplicate", "delivery already processed"
        try:
            return await self._poll_and_record(job["id"], kind, task_id,
                                               job["provider_call_started_at"])
        except (DatabaseUnavailable, DatabaseError):
            if delivery is not None:
                await _forget_delivery(self.pool, "kie", delivery)
            raise

    async def _poll_and_record(self, job_id: uuid.UUID, kind: str, task_id: str,
                               started: datetime | None) -> tuple[str, str]:
        """A KIE callback is a signal: poll the task and record what the poll says."""
        async with self.pool.connection() as conn:
            p = await load(conn, job_id)
        if p.state not in ACTIVE:
            if p.state is CallState.UPSTREAM_SUCCEEDED:
                self._finalize_later(job_id)
            return "noop", f"job {job_id} is already {p.state}"
        if self.poll is None:
            raise Reply("noted", "no poller configured: left to the workers' polls", 202)
        try:
            async with asyncio.timeout(self.config.poll_timeout_s):
                outcome = await self.poll(kind, task_id,
                                          started.timestamp() if started else None)
        except (ProviderError, TimeoutError) as exc:
            raise Reply("noted", f"polling the task failed ({exc}); left to the polls",
                        202) from None
        parsed = Parsed(task_id=task_id, outcome=outcome)
        if parsed.intermediate:
            return "intermediate", "the task is still running upstream"
        async with self.pool.connection() as conn:
            return await self._record(conn, "kie", job_id, parsed)

    def _kie_signature(self, request: web.Request, task_id: str) -> str | None:
        """With an HMAC key: verify and return a replay key (the signature: it covers the
        task and the timestamp, all that is signed). Without: ``None`` (the URL token
        authenticates)."""
        key = self.config.kie_hmac_key
        if not key:
            return None
        try:
            verify_kie(key, task_id, request.headers, now=self.clock(),
                       tolerance_s=self.config.tolerance_s)
        except SignatureError as exc:
            raise _signature_reject(exc) from None
        return f"sig:{request.headers.get('X-Webhook-Signature')}"

    async def _kie_job(self, request: web.Request, *, authenticated: bool) -> dict[str, Any]:
        try:
            job_id = uuid.UUID(request.match_info["job_id"])
        except ValueError:
            raise Reject(404, "unknown_task", "no such job") from None
        async with self.pool.connection() as conn:
            rows = await execute(conn, "webhook_job_by_id", {"job_id": job_id})
        if not rows:
            if authenticated:  # HMAC-verified: KIE's own callback for a job we do not have
                raise Reply("unknown_task", "no such job: acknowledged", status=202)
            raise Reject(401, "unknown_task", "no such job")
        stored, given = rows[0]["callback_token"], request.match_info["token"]
        if stored is None and authenticated:
            return rows[0]  # HMAC-verified; the job never had a token
        if not (isinstance(stored, str)
                and hmac.compare_digest(given.encode(), stored.encode())):
            raise Reject(401, "bad_signature", "callback token does not match the job")
        return rows[0]

    # -- the shared path ---------------------------------------------------------------------

    async def _deliver(self, provider: str, delivery_id: str | None, kinds: tuple[str, ...],
                       parsed: Parsed) -> tuple[str, str]:
        if parsed.intermediate:
            return "intermediate", "intermediate stage acknowledged"
        async with self.pool.connection() as conn:
            rows = await execute(conn, "webhook_find_job", {
                "kinds": list(kinds), "task_id": parsed.task_id})
            if not rows:
                raise Reply("unknown_task", f"no call for task {parsed.task_id} (not ours, "
                            "or not recorded yet: its worker polls it)", status=202)
            job_id = rows[0]["id"]
            if delivery_id is not None and not await _claim_delivery(
                    conn, provider, delivery_id, job_id):
                return "duplicate", "delivery already processed"
            try:
                return await self._record(conn, provider, job_id, parsed)
            except (DatabaseUnavailable, DatabaseError, StorageError):
                if delivery_id is not None:
                    await _forget_delivery(self.pool, provider, delivery_id)
                raise

    async def _record(self, conn: Conn, provider: str, job_id: uuid.UUID,
                      parsed: Parsed) -> tuple[str, str]:
        kind = (await load(conn, job_id)).provider_kind or ""
        outcome, keys = await store_inline(
            self.finalizer.store, job_id, kind, parsed.outcome,
            settings=self.finalizer.settings, config=self.finalizer.config)
        event = upstream_event(outcome, f"webhook:{provider}", self.now(), stored_keys=keys)
        result = await transition(
            conn, job_id, lambda p: event if event is not None and p.state in ACTIVE else None)
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


async def _claim_delivery(conn: Conn, provider: str, delivery_id: str,
                          job_id: uuid.UUID) -> bool:
    """Record the delivery; ``False`` if it was processed already (a duplicate)."""
    rows = await execute(conn, "webhook_record_delivery", {
        "provider": provider, "delivery_id": delivery_id, "job_id": job_id})
    return bool(rows)


async def _forget_delivery(pool: Pool, provider: str, delivery_id: str) -> None:
    try:
        async with pool.connection() as conn:
            await execute(conn, "webhook_forget_delivery", {
                "provider": provider, "delivery_id": delivery_id})
    except (DatabaseUnavailable, DatabaseError):
        log.warning("could not forget delivery %s/%s", provider, delivery_id)
