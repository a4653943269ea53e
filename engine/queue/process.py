"""What one worker process of a host's queue owns: a psycopg pool, an aiohttp session and
the :class:`~callwarden.calls.runner.CallRunner` over them. The Celery and arq integrations
(:mod:`callwarden.queue.celery`, :mod:`callwarden.queue.arq`) open one per process, when the
process starts, and close it when it stops; every job the process runs shares it.

By default everything comes from the environment, the way ``callwarden worker`` reads it:
``DATABASE_URL`` (required: a worker process never starts an embedded server),
``CALLWARDEN_<PROVIDER>_URL`` and the providers' keys (:meth:`ProviderSettings.from_env`),
the media store (S3 when ``CALLWARDEN_MEDIA_S3_BUCKET`` is set, else
``CALLWARDEN_MEDIA_DIR``; one is required: :func:`~callwarden.config.configured_media`),
``CALLWARDEN_CALL_*`` (:class:`~callwarden.calls.config.CallConfig`),
``CALLWARDEN_PRICING_FILE``, ``CALLWARDEN_CALLBACK_BASE_URL`` and
``CALLWARDEN_DB_OUTAGE_LIMIT_S`` (:class:`~callwarden.queue.outage.OutageRetries`: how a
job is retried through a database outage, and how long a try waits for a connection).

A job whose start its provider account's limits refused (``CallOutcome.result`` is
``waiting``: nothing was written) is handed back to its queue the same way, after
:meth:`ProcessRunner.defer_waiting` (the limit's ``retry_after_s`` plus up to a quarter of
it), and that try is not a delivery either (docs/admission.md).

Each process gets its own owner id, made when the runner is opened: a forked child (Celery's
prefork pool) must not share its parent's :func:`~callwarden.calls.identity.incarnation`, which
is fixed when the module is first imported.

:func:`longest_run_s` is how long one ``CallRunner.run`` can take for the kinds a queue
runs, a create's (or a sync call's) 429 waits (``CallConfig.rate_limited_wait_s``)
included: the queue must not deliver a job again before it (Celery's ``visibility_timeout``
on Redis, arq's ``job_timeout``), or two workers poll the same task — harmless, every write
is fenced, but wasted provider requests; and arq cancels a run past its ``job_timeout``,
which would leave a call cancelled in its 429 sleep ``created`` with no task, for the
reconciler to sweep although nothing was created.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp

from callwarden.calls.callbacks import CallbackUrls
from callwarden.calls.config import CallConfig, load_call_config
from callwarden.calls.own import OwnCalls
from callwarden.calls.pricing import Pricing, pricing_from_env
from callwarden.calls.runner import CallOutcome, CallRunner, Result
from callwarden.config import configured_media, provider_settings
from callwarden.database.boundary import connection
from callwarden.database.db import open_pool
from callwarden.database.outage import LIMIT_ENV, Outage
from callwarden.database.write import cancel_unstarted
from callwarden.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    EventDecodeError,
    JobNotFound,
)
from callwarden.providers.base import ProviderSettings
from callwarden.providers.kinds import KINDS, is_sync_call
from callwarden.providers.storage import MediaStore
from callwarden.queue.outage import OutageRetries
from callwarden.queue.own import OwnBody, run_own
from callwarden.rules.waits import jittered

__all__ = ["MEDIA_PER_RESULT", "ProcessRunner", "RunnerOptions", "log_outcome",
           "longest_run_s", "open_runner", "options_from_env", "outcome_dict"]

log = logging.getLogger("callwarden.queue")

#: Media per result assumed by :func:`longest_run_s` (KIE image models answer up to 4).
MEDIA_PER_RESULT = 4
#: The wait of a waiting outcome that names none (the runner always names one).
WAITING_DEFAULT_S = 1.0


@dataclass(frozen=True, kw_only=True)
class RunnerOptions:
    """Everything a process's runner is built from (:func:`options_from_env` by default).
    ``concurrency``: jobs the process runs at once (the pool holds that many plus two);
    ``outage``: how a job is retried through a database outage (by default from
    ``CALLWARDEN_DB_OUTAGE_LIMIT_S``)."""

    database_url: str
    settings: ProviderSettings
    media: MediaStore
    config: CallConfig = field(default_factory=CallConfig)
    pricing: Pricing | None = None
    callback_base_url: str | None = None
    concurrency: int = 1
    outage: OutageRetries = field(default_factory=OutageRetries.from_env)


def options_from_env(env: Mapping[str, str] | None = None, *,
                     concurrency: int = 1) -> RunnerOptions:
    """:class:`RunnerOptions` from the environment (see the module); a missing
    ``DATABASE_URL`` or a bad setting is a :class:`~callwarden.errors.ConfigError`."""
    env = dict(os.environ if env is None else env)
    url = env.get("DATABASE_URL", "").strip()
    if not url:
        raise ConfigError("DATABASE_URL is not set: a queue's worker process needs the "
                          "database its jobs are in")
    return RunnerOptions(
        database_url=url, settings=provider_settings(env),
        media=configured_media(env, None, "a queue's worker process", flag=None),
        config=load_call_config(env=env), pricing=pricing_from_env(env),
        callback_base_url=env.get("CALLWARDEN_CALLBACK_BASE_URL") or None,
        concurrency=concurrency, outage=OutageRetries.from_env(env))


class ProcessRunner:
    """One process's pool, session and runner (open it with :func:`open_runner`)."""

    def __init__(self, options: RunnerOptions, *, role: str) -> None:
        self.options, self.pid = options, os.getpid()
        self.pool = open_pool(options.database_url, max_size=options.concurrency + 2,
                              check=True, wait_s=options.outage.wait_s)
        self.callbacks = (CallbackUrls(options.callback_base_url)
                          if options.callback_base_url else None)
        self.owner = f"{role}:{uuid.uuid4().hex[:12]}"
        self.outage = Outage(log, f"{role} process {self.pid}",
                             limit_s=options.outage.limit_s)
        self._session: aiohttp.ClientSession | None = None
        self._runner: CallRunner | None = None
        self._own: OwnCalls | None = None

    @property
    def runner(self) -> CallRunner:
        if self._runner is None:
            raise RuntimeError("the process runner is not open (open_runner)")
        return self._runner

    @property
    def own_calls(self) -> OwnCalls:
        """The process's :class:`OwnCalls` (host code making its own requests), on the
        runner's database, under the same owner id and settings."""
        if self._own is None:
            runner, o = self.runner, self.options
            self._own = OwnCalls(runner.db, media=o.media, settings=o.settings,
                                 owner=self.owner, config=o.config, pricing=o.pricing)
        return self._own

    async def open(self) -> None:
        await self.pool.open()  # connects in the background: a database down at start
        self._session = aiohttp.ClientSession()  # is an outage, not a crash
        self._runner = CallRunner(self.pool, self._session, self.options.settings,
                                  self.options.media, owner=self.owner,
                                  config=self.options.config, pricing=self.options.pricing,
                                  callback_url=self.callbacks)
        log.info("callwarden: process %d ready (owner %s)", self.pid, self.owner)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.aclose()
        if self._own is not None:
            await self._own.aclose()
        if self._session is not None:
            await self._session.close()
        await self.pool.close()
        self._runner = self._session = self._own = None
        log.info("callwarden: process %d closed (owner %s)", self.pid, self.owner)

    async def run(self, job_id: uuid.UUID, kind: str, request: Mapping[str, Any], *,
                  operation: str | None = None) -> CallOutcome:
        """``CallRunner.run`` (with the job's callback URL when callbacks are set)."""
        runner = self.runner
        try:
            if self.callbacks is not None:
                async with connection(self.pool) as conn:
                    await self.callbacks.prepare(conn, job_id)
            return await runner.run(job_id, kind, request, operation=operation)
        finally:
            if self.callbacks is not None:
                self.callbacks.forget(job_id)

    async def run_own(self, job_id: uuid.UUID, kind: str, body: OwnBody,
                      args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                      operation: str | None = None) -> CallOutcome:
        """The host's own code for the job's call (:func:`callwarden.queue.own.run_own`)."""
        return await run_own(self.own_calls, job_id, kind, body, args, kwargs,
                             operation=operation)

    async def give_up(self, job_id: uuid.UUID, reason: str) -> CallOutcome:
        """A job delivered too often: cancel (refund) it if no call ever started on it;
        a started call (also one a delivery starts while this runs: the cancel decides
        on what it writes over) is left to the reconciler. Never touches the provider."""
        runner = self.runner
        async with connection(self.pool) as conn:
            p = (await cancel_unstarted(conn, job_id, by=self.owner,
                                        now=runner.clock())).projection
        result = cast(Result, p.state.value) if p.terminal and p.state else "left_for_reconciler"
        return CallOutcome(job_id=job_id, result=result, projection=p,
                           detail=f"given up: {reason}")

    async def keeps(self, job_id: uuid.UUID, exc: DatabaseError) -> bool:
        """Whether a try of ``job_id`` that raised ``exc`` hands the job back to its queue
        (retried on the outage schedule) rather than failing or acking it: always for
        ``DatabaseUnavailable``; for any other database error, while the job's call has
        not started (no ``CallStarted``: read now, and assumed when the database cannot
        say). A job failed or acked with no call is lost: nothing else would run it, and
        its reservation would stay reserved. A started call is the reconciler's."""
        if isinstance(exc, DatabaseUnavailable):
            return True
        try:
            p = await self.runner.db.load(job_id)
        except DatabaseError:
            return True
        except (JobNotFound, EventDecodeError):  # no such job; a log, so a call started
            return False
        return p.state is None

    def retry_after_outage(self, job_id: uuid.UUID, delivery: str, retry: int,
                           exc: BaseException) -> float:
        """A try of ``job_id`` met a database outage (or a database error before its call
        started: :meth:`keeps`), and the queue is to try it again (its ``retry``-th retry
        for an outage): the seconds to defer it by. The process logs the outage once (and
        once more past the limit); the job, one line per retry and one error when it goes
        past the limit, after which it stays queued."""
        what = _what_failed(exc)
        if isinstance(exc, DatabaseUnavailable):
            self.outage.down(exc)
        policy = self.options.outage
        delay = policy.delay_s(retry)
        if retry == policy.within_limit + 1:
            log.error("job %s %s: %s past the outage limit (%s=%g s, %d retries): the job "
                      "stays queued, retried every %g s until the database answers",
                      job_id, delivery, what, LIMIT_ENV, policy.limit_s,
                      policy.within_limit, policy.step_s)
        log.info("job %s %s: %s; outage retry %d in %g s", job_id, delivery, what, retry,
                 delay)
        return delay

    def defer_waiting(self, outcome: CallOutcome, kind: str, delivery: str) -> float:
        """The account's limits refused the job's start (``outcome.result`` is
        ``waiting``; nothing was written) and the queue is to run it again: the seconds to
        defer it by, its ``retry_after_s`` plus up to a quarter of it (:func:`jittered`),
        logged at info with the limit it waits for. Such a try is not a delivery."""
        delay = jittered(outcome.retry_after_s or WAITING_DEFAULT_S)
        log.info("job %s kind=%s %s pid=%d waiting: %s; again in %.2f s (not a delivery)",
                 outcome.job_id, kind, delivery, os.getpid(), outcome.detail, delay)
        return delay

    def left_after_eager_retries(self, job_id: uuid.UUID, delivery: str,
                                 exc: BaseException) -> None:
        """A task run eagerly (no queue to keep it in) spent the retries within the outage
        limit: it fails, and the job is left as it is, which the host must see."""
        policy = self.options.outage
        log.error("job %s %s: %s after the %d retries within the outage limit (%s=%g s) "
                  "of a task run eagerly (task_always_eager or apply), which has no queue to "
                  "keep it in: the task fails and the job is left reserved, with no call "
                  "unless one had started (the reconciler finishes a started call); the host "
                  "must run it again once the database answers, or release its reservation "
                  "(callwarden.cancel)", job_id, delivery, _what_failed(exc),
                  policy.within_limit, LIMIT_ENV, policy.limit_s)

    def database_answered(self) -> None:
        """A job's try reached the database: the process's outage, if any, is over."""
        self.outage.up()


def _what_failed(exc: BaseException) -> str:
    if isinstance(exc, DatabaseUnavailable):
        return "database unavailable"
    return f"database error before its call started ({type(exc).__name__}: {exc})"


async def open_runner(options: RunnerOptions | Callable[[], RunnerOptions] | None = None, *,
                      role: str) -> ProcessRunner:
    """Open this process's runner (``role`` names its owner id: ``celery``, ``arq``)."""
    if options is None:
        options = options_from_env()
    elif callable(options):
        options = options()
    process = ProcessRunner(options, role=role)
    await process.open()
    return process


def longest_run_s(config: CallConfig | None = None, settings: ProviderSettings | None = None,
                  *, kinds: Iterable[str] | None = None, media: int = MEDIA_PER_RESULT) -> float:
    """The longest one ``run`` of a call of ``kinds`` (default: every kind) can take: the
    create (or sync call) with its 429 waits, the poll budget plus one last poll, and
    finalizing ``media`` results (:meth:`CallConfig.deadline_for`).

    The create (or sync call): one request with its retries (``request_s`` =
    ``RetryPolicy.max_total_s + timeout_s``), plus ``CallConfig.rate_limited_wait_s``: a
    request the provider refuses with 429, for a kind a ``[limits]`` account names, is
    made again after the account's pause, and the runner sleeps (heartbeating) only while
    the pause ends within ``rate_limited_wait_s`` of the first request, so every pause and
    every request before the last ends inside it and only the last request comes on top
    (docs/admission.md). Any run may create (``limits`` are in the database, not known
    here): the wait is always counted. With the defaults, ``kie-standard``: 60 + 300 (the
    create) + 900 + 60 (the budget, a last poll) + 720 (4 media) = 2,040 s; a sync kind
    60 + 300 + 720 = 1,080 s; every kind (``kie-lip-sync``, a 3,600 s budget) 4,740 s."""
    config, settings = config or CallConfig(), settings or ProviderSettings()
    request_s = settings.retry.max_total_s + settings.retry.timeout_s
    created_s = request_s + config.rate_limited_wait_s  # the create or sync call, its 429s
    finalize_s = config.deadline_for(media)

    def one(kind: str) -> float:
        polled = 0.0 if is_sync_call(kind) else config.budget_for(kind) + request_s
        return created_s + polled + finalize_s

    return max(one(kind) for kind in (KINDS if kinds is None else kinds))


def outcome_dict(outcome: CallOutcome) -> dict[str, Any]:
    """A JSON-able summary of an outcome (what the queue tasks return; ``retry_after_s``
    is set for a ``waiting`` one)."""
    state = outcome.projection.state
    return {"job_id": str(outcome.job_id), "result": outcome.result,
            "state": state.value if state is not None else None, "detail": outcome.detail,
            "retry_after_s": outcome.retry_after_s}


def log_outcome(outcome: CallOutcome, kind: str, delivery: str) -> None:
    """One line per job outcome (``delivery``: what the queue says about this delivery)."""
    state = outcome.projection.state
    log.info("job %s kind=%s %s pid=%d result=%s state=%s%s", outcome.job_id, kind, delivery,
             os.getpid(), outcome.result, state.value if state else "none",
             f" detail={outcome.detail!r}" if outcome.detail else "")
