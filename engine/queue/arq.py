"""Run a job's call durably in an arq job (the ``callwarden[arq]`` extra).

::

    # worker.py — run with: arq worker.WorkerSettings
    from callwarden.queue.arq import worker_settings
    WorkerSettings = worker_settings(redis_url="redis://127.0.0.1:6379/0")

    # wherever jobs are enqueued
    from arq import create_pool
    from callwarden.queue.arq import enqueue_call
    redis = await create_pool(RedisSettings.from_dsn(url))
    await enqueue_call(redis, job_id, "kie-standard", {"model": ..., "input": {...}})

An arq worker is one process with one event loop: ``on_startup`` opens its pool, aiohttp
session and runner into ``ctx`` (:data:`CTX_KEY`), ``on_shutdown`` closes them. A function
of your own runs a call with :func:`run_job_call` (``ctx`` gives it the runner); the host's
own provider code for a kind runs as :func:`own_call_function` (:mod:`callwarden.queue.own`),
enqueued with :func:`enqueue_own_call`.

arq delivers a job again when the worker running it died: the job stays in the queue while
it runs, under an "in progress" key that expires ``job_timeout`` + 10 s after the start,
after which any worker takes it (``job_try`` + 1) and the runner resumes the call. So
:func:`worker_settings` sets ``job_timeout`` to
:func:`~callwarden.queue.process.longest_run_s`: a live worker is never overtaken, and arq
never cancels a call that is still inside its budget, nor one whose create (or sync call)
sleeps through the provider's 429s (``CallConfig.rate_limited_wait_s``, counted there): a
run cancelled in that sleep would leave its call ``created`` with no task, swept by the
reconciler although nothing was created.

A try that meets a database outage (a read-only server among them), or any database error
before the job's call started, is deferred (``Retry``) on the schedule of
:class:`~callwarden.queue.outage.OutageRetries` for as long as the outage lasts: the job
is never failed nor given up for it, and runs once the database answers. arq counts those
tries in ``job_try`` too, so this module counts them apart (a Redis counter per arq job,
kept as long as arq keeps its own) and gives a job up only after ``max_deliveries``
*deliveries*: tries that did not meet an outage (a worker that died, a SIGTERM). arq's own
``max_tries`` is set out of reach: past it arq would fail the job without calling the
function at all. Details: docs/embedding.md ("On a queue").

A try whose start the provider account's limits refused (the outcome ``waiting``: nothing
was written, nothing sent upstream) is deferred the same way, ``Retry(defer=)`` after the
limit's ``retry_after_s`` plus up to a quarter of it, for as long as it is refused, and is
not a delivery either: those tries have a Redis counter of their own
(:data:`WAITING_KEY`), so that a job waiting behind a full account never goes past
``max_deliveries``, and the outage schedule (its doubling delays, its limit) counts only
the outage's tries.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from arq.connections import ArqRedis, RedisSettings
from arq.constants import expires_extra_ms, job_key_prefix
from arq.jobs import Job
from arq.typing import StartupShutdown
from arq.worker import Retry, func

from callwarden.calls.config import load_call_config
from callwarden.calls.runner import CallOutcome
from callwarden.config import load_providers
from callwarden.errors import ConfigError, DatabaseError
from callwarden.providers.kinds import get_kind
from callwarden.queue.own import OwnBody, own_task_name, own_task_of
from callwarden.queue.process import (
    ProcessRunner,
    RunnerOptions,
    log_outcome,
    longest_run_s,
    open_runner,
    options_from_env,
    outcome_dict,
)

__all__ = ["CTX_KEY", "MAX_TRIES", "OUTAGE_KEY", "TASK_NAME", "WAITING_KEY", "enqueue_call",
           "enqueue_own_call", "own_call_function", "run_call", "run_job_call", "run_own_call",
           "worker_settings"]

log = logging.getLogger("callwarden.queue.arq")

TASK_NAME = "callwarden.run_call"
CTX_KEY = "callwarden"
_MAX_KEY = "callwarden_max_deliveries"
REDIS_ENV = "CALLWARDEN_REDIS_URL"
#: arq's ``max_tries`` for :data:`TASK_NAME`: out of reach (deliveries are counted here).
MAX_TRIES = sys.maxsize
#: The Redis key counting an arq job's tries that met a database outage.
OUTAGE_KEY = "callwarden:arq:outage-retries:"
#: The Redis key counting an arq job's tries its account's limits refused (waiting).
WAITING_KEY = "callwarden:arq:waiting-retries:"
_KEEP_S = 88_400  # as long as arq keeps its own try counter (arq:retry:<id>)
_own_kinds: dict[str, str] = {}  # own_call_function's name -> its kind


class _OutageRetries:
    """One arq job's tries that were not deliveries, counted in Redis (``ctx["redis"]``;
    without it, none are counted): those that met a database outage (:data:`OUTAGE_KEY`)
    and those its account's limits refused (:data:`WAITING_KEY`)."""

    def __init__(self, ctx: Mapping[str, Any]) -> None:
        self.redis: ArqRedis | None = ctx.get("redis")
        self.arq_id = str(ctx.get("job_id"))
        self.key = OUTAGE_KEY + self.arq_id
        self.waiting_key = WAITING_KEY + self.arq_id

    async def count(self) -> int:
        """Every try that was not a delivery (an outage's, a refused start's)."""
        if self.redis is None:
            return 0
        return sum(int(raw or 0) for raw in await self.redis.mget(self.key, self.waiting_key))

    async def add(self) -> int:
        """One more outage try; how many so far (the outage schedule's retry)."""
        return await self._add(self.key)

    async def add_waiting(self) -> int:
        """One more try refused by the account's limits."""
        return await self._add(self.waiting_key)

    async def _add(self, key: str) -> int:
        """One more; the arq job's data is kept at least a day longer, so that arq never
        drops a job waiting for the database, or for a slot, as expired."""
        if self.redis is None:
            return 1
        count = int(await self.redis.incr(key))
        await self.redis.expire(key, _KEEP_S)
        job_key = job_key_prefix + self.arq_id
        if 0 <= await self.redis.pttl(job_key) < expires_extra_ms:
            await self.redis.pexpire(job_key, expires_extra_ms)
        return count

    async def clear(self) -> None:
        if self.redis is not None:
            await self.redis.delete(self.key, self.waiting_key)


async def run_job_call(ctx: Mapping[str, Any], job_id: uuid.UUID | str, kind: str,
                       request: Mapping[str, Any], *, operation: str | None = None
                       ) -> CallOutcome:
    """Run (or resume) the job's call with this worker's runner. A job delivered more than
    ``max_deliveries`` times is given up (refunded if no call ever started on it, else
    left to the reconciler). A try that meets a database outage, or a database error
    before the job's call started (:meth:`ProcessRunner.keeps`), is deferred (``Retry``)
    for as long as the outage lasts, and is not a delivery; nor is a try whose start the
    account's limits refused (the outcome ``waiting``), deferred (``Retry``) by the limit's
    ``retry_after_s`` plus up to a quarter of it, for as long as it is refused."""
    return await _durably(ctx, job_id, kind, lambda process, job: process.run(
        job, kind, request, operation=operation))


async def run_own_call(ctx: Mapping[str, Any], job_id: uuid.UUID | str, kind: str,
                       body: OwnBody, args: Sequence[Any] = (),
                       kwargs: Mapping[str, Any] | None = None, *,
                       operation: str | None = None) -> CallOutcome:
    """The host's own code for the job's call with this worker's
    :class:`~callwarden.calls.own.OwnCalls` (:func:`callwarden.queue.own.run_own`),
    given up, deferred (through an outage, and while the account's limits refuse its
    start: the body does not run) and logged as :func:`run_job_call`."""
    return await _durably(ctx, job_id, kind, lambda process, job: process.run_own(
        job, kind, body, args, kwargs, operation=operation))


async def _durably(ctx: Mapping[str, Any], job_id: uuid.UUID | str, kind: str,
                   attempt: Callable[[ProcessRunner, uuid.UUID], Awaitable[CallOutcome]]
                   ) -> CallOutcome:
    process: ProcessRunner = ctx[CTX_KEY]
    job = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(job_id)
    tries = int(ctx.get("job_try") or 1)
    outages = _OutageRetries(ctx)
    deliveries = tries - await outages.count()
    delivery = f"arq_job={outages.arq_id} try={tries}"
    try:
        if deliveries > int(ctx.get(_MAX_KEY, 5)):
            outcome = await process.give_up(job, f"delivered {deliveries} times "
                                                 f"({tries} tries)")
        else:
            outcome = await attempt(process, job)
    except DatabaseError as exc:
        if not await process.keeps(job, exc):
            await outages.clear()  # the call started: the reconciler finishes it
            raise
        retry = await outages.add()
        raise Retry(defer=process.retry_after_outage(job, delivery, retry, exc)) from exc
    except Exception:
        await outages.clear()  # arq fails the job: a new one under this id starts afresh
        raise
    process.database_answered()
    if outcome.result == "waiting":  # refused by the account's limits: not a delivery
        delay = process.defer_waiting(outcome, kind, delivery)
        await outages.add_waiting()
        raise Retry(defer=delay)
    await outages.clear()
    log_outcome(outcome, kind, delivery)
    return outcome


async def run_call(ctx: dict[str, Any], job_id: str, kind: str, request: dict[str, Any],
                   operation: str | None = None) -> dict[str, Any]:
    """The arq function :data:`TASK_NAME`: :func:`run_job_call`, as a JSON-able dict."""
    return outcome_dict(await run_job_call(ctx, job_id, kind, request, operation=operation))


async def enqueue_call(redis: ArqRedis, job_id: uuid.UUID | str, kind: str,
                       request: Mapping[str, Any], *, operation: str | None = None,
                       **options: Any) -> Job | None:
    """Enqueue :data:`TASK_NAME` under the arq job id ``callwarden:<job id>``: while that
    job is queued, running, or its result kept, enqueueing it again returns ``None``."""
    return await redis.enqueue_job(TASK_NAME, str(job_id), kind, dict(request), operation,
                                   _job_id=f"callwarden:{job_id}", **options)


async def enqueue_own_call(redis: ArqRedis, job_id: uuid.UUID | str, kind: str, *args: Any,
                           name: str | None = None, **options: Any) -> Job | None:
    """Enqueue the job's own call of ``kind`` (the :func:`own_call_function` this process
    made for it; ``name`` picks one when several serve ``kind``) with the body's ``args``,
    under the arq job id ``callwarden:<job id>``, as :func:`enqueue_call`: while that job
    is queued, running, or its result kept, enqueueing it again returns ``None``.
    ``options``: ``enqueue_job``'s (``_defer_by``, ``_queue_name``, ...; a keyword without
    ``_`` is the body's, as arq passes it). A kind no own function of this process serves
    is a ``ConfigError`` (import the module that makes it)."""
    task_name = own_task_of(kind, name, [n for n, k in _own_kinds.items() if k == kind])
    return await redis.enqueue_job(task_name, str(job_id), *args,
                                   _job_id=f"callwarden:{job_id}", **options)


def own_call_function(kind: str, body: OwnBody, *, name: str | None = None,
                      operation: str | None = None, timeout: float | None = None) -> Any:
    """An arq function ``name(ctx, job_id, *args, **kwargs)`` (default name:
    ``<module>.<body>:<kind>``, :func:`~callwarden.queue.own.own_task_name`) running
    ``async def body(call, *args, **kwargs)``, the host's own provider code for ``kind``,
    durably: pass it in :func:`worker_settings`' ``functions``::

        async def predict(call: OwnCall, prompt: str) -> None: ...   # as for Celery

        WorkerSettings = worker_settings(functions=[own_call_function(
            "replicate-prediction", predict)], kinds=["replicate-prediction"])
        await enqueue_own_call(redis, job_id, "replicate-prediction", "a fox")

    The call is opened with the worker's :class:`~callwarden.calls.own.OwnCalls` and
    dispatched on its action (:mod:`callwarden.queue.own`): the body runs only to create or
    to resume, beating while it runs; a job arq delivers again (its worker died) is never
    told to create again. Deliveries are counted and database outages deferred as for
    :data:`TASK_NAME`, so arq's own ``max_tries`` is set out of reach. ``timeout``: default
    the worker's ``job_timeout``, which :func:`worker_settings` fits to the longest run of
    its ``kinds`` and of every own function's kind (one worker has one redelivery delay:
    arq takes a dead worker's job again the longest function timeout + 10 s after its
    start)."""
    load_providers(os.environ)  # the host's own kinds (entry points, CALLWARDEN_PROVIDERS)
    get_kind(kind)  # a kind no provider registered is refused here, at import
    task_name = name or own_task_name(body, kind)
    _own_kinds[task_name] = kind

    async def run(ctx: dict[str, Any], job_id: str, *args: Any, **kwargs: Any
                  ) -> dict[str, Any]:
        return outcome_dict(await run_own_call(ctx, job_id, kind, body, args, kwargs,
                                               operation=operation))

    return func(run, name=task_name, timeout=timeout, max_tries=MAX_TRIES)


def _log_to_stderr(level: int) -> None:
    """arq's own log config covers only ``arq``: give callwarden's lines a handler too,
    unless the host set up logging."""
    ours = logging.getLogger("callwarden")
    if not ours.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(level)


def _hooks(options: RunnerOptions | None, concurrency: int, max_deliveries: int,
           log_level: int | None, on_startup: StartupShutdown | None,
           on_shutdown: StartupShutdown | None) -> tuple[StartupShutdown, StartupShutdown]:
    async def startup(ctx: dict[Any, Any]) -> None:
        if log_level is not None:
            _log_to_stderr(log_level)
        made = options or options_from_env(concurrency=concurrency)
        ctx[CTX_KEY] = await open_runner(made, role="arq")
        ctx[_MAX_KEY] = max_deliveries
        if on_startup is not None:
            await on_startup(ctx)

    async def shutdown(ctx: dict[Any, Any]) -> None:
        try:
            if on_shutdown is not None:
                await on_shutdown(ctx)
        finally:
            process: ProcessRunner | None = ctx.pop(CTX_KEY, None)
            if process is not None:
                await process.close()

    return startup, shutdown


def worker_settings(*, redis_url: str | None = None, functions: Sequence[Any] = (),
                    options: RunnerOptions | None = None, kinds: Iterable[str] | None = None,
                    job_timeout: float | None = None, max_jobs: int = 10,
                    max_deliveries: int = 5, grace_s: int = 30,
                    on_startup: StartupShutdown | None = None,
                    on_shutdown: StartupShutdown | None = None,
                    log_level: int | None = logging.INFO, **extra: Any) -> dict[str, Any]:
    """arq ``WorkerSettings`` (a dict, as ``arq module.WorkerSettings`` accepts) running
    :func:`run_call` beside your ``functions``.

    ``redis_url``: default ``CALLWARDEN_REDIS_URL``, else ``redis://localhost:6379``.
    ``options``: the runner's (default: the environment, at start). ``job_timeout``:
    default :func:`longest_run_s` for ``kinds`` (a shorter one is warned about: arq
    cancels a call past it, which the reconciler then finishes). ``max_deliveries``:
    deliveries before a job is given up (tries that met a database outage are not
    deliveries: such a job is deferred until the database answers; nor are tries the
    account's limits refused: such a job is deferred until a slot frees). ``grace_s``: on
    SIGTERM, how long calls in flight may take to finish before they are cancelled (and
    run again by another worker). ``extra``: any other arq setting (yours win)."""
    config = options.config if options is not None else load_call_config(env=os.environ)
    names = [TASK_NAME, *(getattr(f, "name", getattr(f, "__name__", "")) for f in functions)]
    own = [_own_kinds[n] for n in names if n in _own_kinds]
    needed = longest_run_s(config, options.settings if options else None,
                           kinds=None if kinds is None else [*kinds, *own])
    timeout = needed if job_timeout is None else job_timeout
    if timeout < needed:
        log.warning("callwarden: arq job_timeout %gs is shorter than the longest call (%gs):"
                    " a call still running when it passes is cancelled and left to the "
                    "reconciler", timeout, needed)
    startup, shutdown = _hooks(options, max_jobs, max_deliveries, log_level, on_startup,
                               on_shutdown)
    url = redis_url or os.environ.get(REDIS_ENV) or "redis://localhost:6379"
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"callwarden: arq functions named twice: {', '.join(twice)} (a "
                          f"body run for several kinds needs one name per kind)")
    return {
        "functions": [func(run_call, name=TASK_NAME, timeout=timeout, max_tries=MAX_TRIES),
                      *functions],
        "redis_settings": RedisSettings.from_dsn(url),
        "on_startup": startup, "on_shutdown": shutdown,
        "job_timeout": timeout, "max_jobs": max_jobs, "job_completion_wait": grace_s,
        **extra,
    }
