"""Run a job's call durably inside a Celery task (the ``callwarden[celery]`` extra).

::

    from celery import Celery
    from callwarden.queue.celery import register

    app = Celery("host", broker="redis://127.0.0.1:6379/0")
    run_call = register(app)   # process hooks, recommended settings, the task
    run_call.delay(str(job_id), "kie-standard", {"model": ..., "input": {...}})

or, in a task of your own (``bind=True``; the same acks and retries)::

    @app.task(base=CallTask, bind=True)
    def generate(self: CallTask, job_id: str) -> dict[str, Any]:
        kind, request = ...  # from your own tables
        return outcome_dict(self.run_call(job_id, kind, request))

The host's own provider code for a kind, driving the call itself, is a task too
(:func:`own_call_task`: ``@own_call_task(app, "replicate-prediction")`` on
``async def body(call, *args)``, dispatched on the call's action by
:mod:`callwarden.queue.own`), with the same settings and process life cycle, and sent
with :func:`enqueue_own_call`.

Each worker *process* owns one event loop (in a daemon thread, for the process's life), one
psycopg pool and one aiohttp session, opened on ``worker_process_init`` — in each prefork
child, after the fork — and closed on ``worker_process_shutdown`` (``worker_shutdown`` for
the solo pool); a process that runs a task without either signal (the threads pool) opens
its own on first use. Nothing is opened in the main process of a prefork worker, and a
runtime inherited across a fork is never used (nor closed: its sockets are the parent's).
A task blocks its thread on ``run_call`` while the call runs on the loop.

:class:`CallTask` sets what a durable call needs (``acks_late``,
``reject_on_worker_lost``, ``acks_on_failure_or_timeout``) and retries a task whose try met
a database outage (:class:`~callwarden.errors.DatabaseUnavailable`, a read-only server
among them), or any database error before the job's call started, with a countdown on
the schedule of :class:`~callwarden.queue.outage.OutageRetries`, for as long as the outage
lasts, whatever ``max_retries`` says: a task is never failed and acked because the database
was unreachable, and runs once it answers. A retry whose publish fails (the broker
unreachable from the pool process) rejects the message with ``requeue=True``, so that it
is put back, or restored after the visibility timeout, never acked. Run eagerly, a task
is retried only within the outage limit, then fails, and an error line names the job left
reserved (docs/embedding.md). :func:`register` also defaults the broker's
``visibility_timeout`` to :func:`~callwarden.queue.process.longest_run_s` plus a margin and
``worker_prefetch_multiplier`` to 1. Why each: docs/embedding.md ("On a queue").

A try whose start the provider account's limits refused (the outcome ``waiting``: nothing
was written, nothing sent upstream) is retried the same way, ``self.retry(countdown=)``
after the limit's ``retry_after_s`` plus up to a quarter of it, for as long as it is
refused, whatever ``max_retries`` says (a publish that fails is rejected with
``requeue=True``, as an outage retry's). Celery counts those retries in
``request.retries`` too, so each carries the number of them so far in a message header of
its own (:data:`WAITING_HEADER`), and the outage schedule counts only the outage's
retries (``request.retries`` minus the waiting ones): a job that waited ten times meets
its first outage with the first delay, not the longest, and is not "past the outage
limit" (arq counts the two apart in Redis). Run eagerly (no queue to wait in), the task
returns the ``waiting`` outcome, with its ``retry_after_s``, for the host to run it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from celery import Celery, Task, signals
from celery.app.defaults import DEFAULTS
from celery.exceptions import Reject
from celery.result import AsyncResult

from callwarden.calls.config import CallConfig, load_call_config
from callwarden.calls.runner import CallOutcome
from callwarden.config import load_providers
from callwarden.errors import ConfigError, DatabaseError
from callwarden.providers.base import ProviderSettings
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

__all__ = ["TASK_NAME", "VISIBILITY_MARGIN_S", "WAITING_HEADER", "CallTask", "check_options",
           "current_runtime", "enqueue_own_call", "own_call_task", "register", "start_process",
           "stop_process", "visibility_timeout_for"]

log = logging.getLogger("callwarden.queue.celery")
T = TypeVar("T")
Options = RunnerOptions | Callable[[], RunnerOptions] | None

TASK_NAME = "callwarden.run_call"
#: Added to the longest run: a prefetched message waits, an ack takes a round trip.
VISIBILITY_MARGIN_S = 60.0
#: The message header counting a task's retries its account's limits caused (``waiting``):
#: Celery's ``request.retries`` counts them with the outage's, whose schedule must not.
WAITING_HEADER = "callwarden_waiting_retries"


class _Loop:
    """One event loop running in a daemon thread for the life of the process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="callwarden-loop",
                                       daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait. An exception raised in this thread while it
        waits (Celery's soft time limit) cancels the coroutine where it is."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class Runtime:
    """What one worker process owns: the loop and the :class:`ProcessRunner` on it."""

    def __init__(self, options: Options) -> None:
        self.pid = os.getpid()
        self._loop = _Loop()
        try:
            self.process: ProcessRunner = self._loop.call(open_runner(options, role="celery"))
        except BaseException:
            self._loop.close()
            raise

    def run(self, job_id: uuid.UUID, kind: str, request: Mapping[str, Any], *,
            operation: str | None = None) -> CallOutcome:
        outcome = self._loop.call(self.process.run(job_id, kind, request,
                                                   operation=operation))
        self.process.database_answered()
        return outcome

    def own(self, job_id: uuid.UUID, kind: str, body: OwnBody, args: Sequence[Any],
            kwargs: Mapping[str, Any], *, operation: str | None = None) -> CallOutcome:
        outcome = self._loop.call(self.process.run_own(job_id, kind, body, args, kwargs,
                                                       operation=operation))
        self.process.database_answered()
        return outcome

    def keeps(self, job_id: uuid.UUID, exc: DatabaseError) -> bool:
        """:meth:`ProcessRunner.keeps` on the loop."""
        return self._loop.call(self.process.keeps(job_id, exc))

    def close(self) -> None:
        try:
            self._loop.call(self.process.close())
        finally:
            self._loop.close()


_lock = threading.Lock()
_runtime: Runtime | None = None
_options: Options = None
_inherited: list[Runtime] = []  # kept, never closed: their sockets are the parent's


def _after_fork_in_child() -> None:
    global _runtime
    if _runtime is not None:
        _inherited.append(_runtime)
        _runtime = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_runtime() -> Runtime:
    """This process's runtime, opened on first use if no signal opened it."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = Runtime(_options)
        return _runtime


def check_options(**_: Any) -> None:
    """``worker_init`` (the worker's main process, before it consumes): the processes'
    options must be readable (``DATABASE_URL``, a media store, the providers...), or the
    worker stops with exit 2 naming what is wrong, rather than take every message, fail it
    in a process with no runtime, and ack it (the job left reserved, with no call)."""
    try:
        _resolve(_options)
    except ConfigError as exc:
        log.critical("callwarden: the worker cannot run calls: %s", exc)
        raise SystemExit(2) from exc  # a BaseException: Celery's signal dispatch keeps it


def _resolve(options: Options) -> RunnerOptions:
    if options is None:
        return options_from_env()
    return options() if callable(options) else options


def start_process(**_: Any) -> None:
    """``worker_process_init``: open this process's runtime (a failure is logged; the
    process's tasks then fail with it, and are acked)."""
    try:
        current_runtime()
    except Exception:
        log.exception("callwarden: could not open the process runtime in pid %d",
                      os.getpid())


def stop_process(**_: Any) -> None:
    """``worker_process_shutdown`` / ``worker_shutdown``: close this process's runtime."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None and runtime.pid == os.getpid():
        runtime.close()


class CallTask(Task):  # type: ignore[type-arg]
    """A task that runs a job's call (:meth:`run_call`), acked the way a durable call
    wants: after it ran (``acks_late``), redelivered when its process died
    (``reject_on_worker_lost``), acked when it raised or timed out
    (``acks_on_failure_or_timeout``: what is left of the call belongs to the reconciler),
    and retried, not failed, for as long as the database is unreachable (or fails before
    the job's call started), and for as long as the account's limits refuse its start."""

    acks_late = True
    reject_on_worker_lost = True
    acks_on_failure_or_timeout = True

    def run_call(self, job_id: uuid.UUID | str, kind: str, request: Mapping[str, Any], *,
                 operation: str | None = None) -> CallOutcome:
        """``CallRunner.run`` on this process's loop; returns when the call is terminal,
        left for the reconciler or out of poll budget. A try that meets a database outage,
        or a database error before the job's call started (:meth:`ProcessRunner.keeps`),
        is retried (``self.retry``, published again with a countdown, then acked; when
        that publish fails, the message is rejected with ``requeue=True``, never acked).
        A try whose start the account's limits refused (the outcome ``waiting``) is
        retried the same way after the limit's ``retry_after_s`` (plus up to 25 %), not
        counted against ``max_retries``."""
        return self._durably(job_id, kind, lambda runtime, job: runtime.run(
            job, kind, request, operation=operation))

    def run_own(self, job_id: uuid.UUID | str, kind: str, body: OwnBody,
                args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                operation: str | None = None) -> CallOutcome:
        """The host's own code for the job's call on this process's loop
        (:func:`callwarden.queue.own.run_own`: dispatched on the call's action, beating
        while the body runs); retried through a database outage as :meth:`run_call`."""
        return self._durably(job_id, kind, lambda runtime, job: runtime.own(
            job, kind, body, args, kwargs or {}, operation=operation))

    def _durably(self, job_id: uuid.UUID | str, kind: str,
                 attempt: Callable[[Runtime, uuid.UUID], CallOutcome]) -> CallOutcome:
        job = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(job_id)
        info = self.request.delivery_info or {}
        delivery = f"task={self.request.id} redelivered={bool(info.get('redelivered'))}"
        try:
            runtime = current_runtime()
        except Exception as exc:  # no runtime in this process: never fail (and ack) it
            log.error("job %s %s: this process has no runtime (%r): the message is "
                      "rejected with requeue=True, not acked", job, delivery, exc)
            raise Reject(exc, requeue=True) from exc
        try:
            outcome = attempt(runtime, job)
        except DatabaseError as exc:
            if not runtime.keeps(job, exc):
                raise  # the call started: what is left of it is the reconciler's
            retried = self._retry_after_outage(runtime.process, job, delivery, exc)
            if retried is None:
                raise
            raise retried from exc
        if outcome.result == "waiting":  # refused by the account's limits: not an attempt
            waited = self._retry_waiting(runtime.process, outcome, kind, delivery)
            if waited is not None:
                raise waited
        log_outcome(outcome, kind, delivery)
        return outcome

    def _retry_waiting(self, process: ProcessRunner, outcome: CallOutcome, kind: str,
                       delivery: str) -> BaseException | None:
        """Publish the task again, deferred until the account's limits may admit it
        (:meth:`ProcessRunner.defer_waiting`), unbounded by ``max_retries``; what to raise
        (``None``: run eagerly, where a retry would run at once, nested, and be refused
        again: the task returns the ``waiting`` outcome instead, for the host to run it
        again after its ``retry_after_s``)."""
        if self.request.is_eager:
            log.warning("job %s kind=%s %s: waiting: %s, in a task run eagerly "
                        "(task_always_eager or apply), which has no queue to wait in: the "
                        "task returns the waiting outcome; run it again in %g s",
                        outcome.job_id, kind, delivery, outcome.detail,
                        outcome.retry_after_s or 0.0)
            return None
        delay = process.defer_waiting(outcome, kind, delivery)
        # this message's own headers as Celery's retry sends them (RabbitMQ's x-death
        # left out), one more waiting retry counted
        kept = self.request.as_execution_options().get("headers") or {}
        headers = {**kept, WAITING_HEADER: self._waited() + 1}
        return self._publish_retry(outcome.job_id, delivery, "waiting retry", delay,
                                   sys.maxsize, None, headers=headers)

    def _waited(self) -> int:
        """This try's retries so far that were waiting ones (:data:`WAITING_HEADER`, which
        each waiting retry publishes one more; 0 on a message without it, as one a host
        sent, or one from a release before it)."""
        request = self.request
        raw = (request.headers or {}).get(WAITING_HEADER, getattr(request, WAITING_HEADER, 0))
        try:
            return max(0, int(raw or 0))
        except (TypeError, ValueError):
            return 0

    def _retry_after_outage(self, process: ProcessRunner, job: uuid.UUID, delivery: str,
                            exc: DatabaseError) -> BaseException | None:
        """Publish the task again, deferred on the outage schedule; what to raise
        (``None``: ``exc`` itself). Unbounded in a worker; eagerly (``apply``,
        ``task_always_eager``: no countdown, the retry runs at once, nested) bounded by the
        retries within the limit, after which the task fails with ``exc`` and the job is
        reported left as it is (an error line naming it).

        Celery's ``retry`` raises ``Reject(requeue=False)`` when its publish fails (the
        broker unreachable from this process), and the worker then acks the message: the
        job would be gone, with no call. Such a reject is raised again with
        ``requeue=True``: the worker puts the message back on the queue, or, when it
        cannot reach the broker either, leaves it unacked, and the broker's visibility
        timeout restores it. Either way it runs again.

        The outage schedule's retry is counted without the waiting retries
        (:data:`WAITING_HEADER`): Celery's ``request.retries`` counts every retry."""
        retry = max(1, self.request.retries - self._waited() + 1)
        if self.request.is_eager and retry > process.options.outage.within_limit:
            process.left_after_eager_retries(job, delivery, exc)
            return None
        delay = process.retry_after_outage(job, delivery, retry, exc)
        bound = process.options.outage.within_limit if self.request.is_eager else sys.maxsize
        return self._publish_retry(job, delivery, f"outage retry {retry}", delay, bound, exc)

    def _publish_retry(self, job: uuid.UUID, delivery: str, what: str, delay: float,
                       bound: int, exc: Exception | None, *,
                       headers: Mapping[str, Any] | None = None) -> BaseException:
        """``self.retry`` with ``countdown=delay`` and ``max_retries=bound`` (and
        ``headers``, the retried message's, when given; else this one's): the exception to
        raise (Celery's ``Retry``, or a ``Reject`` with ``requeue=True`` when the publish
        failed: see :meth:`_retry_after_outage`)."""
        options: dict[str, Any] = {} if headers is None else {"headers": dict(headers)}
        try:
            retried: BaseException = self.retry(exc=exc, countdown=delay, max_retries=bound,
                                                throw=False, **options)
        except Reject as rejected:
            reason = getattr(rejected, "reason", None)  # the stubs name neither
            if getattr(rejected, "requeue", False):
                raise
            log.warning("job %s %s: %s not published (%r): the message is rejected with "
                        "requeue=True, not acked", job, delivery, what, reason)
            return Reject(reason, requeue=True)
        finally:  # Celery keeps the bound on the task object for autoretry_for: not ours
            vars(self).pop("override_max_retries", None)
        return retried


def visibility_timeout_for(config: CallConfig | None = None,
                           settings: ProviderSettings | None = None, *,
                           kinds: Iterable[str] | None = None) -> float:
    """The broker's ``visibility_timeout`` for calls of ``kinds``: the longest run plus
    :data:`VISIBILITY_MARGIN_S` (whole seconds)."""
    return float(int(longest_run_s(config, settings, kinds=kinds) + VISIBILITY_MARGIN_S))


def _configure(app: Celery, needed_s: float, visibility_timeout: float | None) -> None:
    """Default what the host left unset; warn when its visibility timeout is too short."""
    conf = app.conf
    options = dict(conf.broker_transport_options or {})
    options.setdefault("visibility_timeout", visibility_timeout or needed_s)
    chosen = float(options["visibility_timeout"])
    conf.broker_transport_options = options
    if ("worker_prefetch_multiplier" not in (conf.changes or {})
            and conf.worker_prefetch_multiplier == DEFAULTS["worker_prefetch_multiplier"]):
        conf.worker_prefetch_multiplier = 1
    if chosen < needed_s:
        log.warning("callwarden: broker visibility_timeout %gs is shorter than the longest "
                    "call (%gs): a call still running may be delivered to a second worker, "
                    "which resumes it (fenced, never created twice) but polls it too",
                    chosen, needed_s)


def _prepare(app: Celery, options: Options, kinds: Iterable[str] | None,
             visibility_timeout: float | None) -> None:
    """Connect the process hooks (once per process) and default the app's settings for
    calls of ``kinds``: the visibility timeout fits the longest of them."""
    global _options
    if options is not None:
        if _options is not None and _options is not options:
            raise ConfigError("callwarden: two different RunnerOptions for one process's "
                              "runtime (register / own_call_task): pass them once, or to "
                              "each the same object")
        _options = options
    signals.worker_init.connect(check_options, dispatch_uid="callwarden-check", weak=False)
    signals.worker_process_init.connect(start_process, dispatch_uid="callwarden-start",
                                        weak=False)
    for uid, signal in (("process", signals.worker_process_shutdown),
                        ("worker", signals.worker_shutdown)):
        signal.connect(stop_process, dispatch_uid=f"callwarden-stop-{uid}", weak=False)
    config = options.config if isinstance(options, RunnerOptions) else load_call_config(
        env=os.environ)
    settings = options.settings if isinstance(options, RunnerOptions) else None
    needed = visibility_timeout_for(config, settings, kinds=kinds)
    _needed[id(app)] = needed = max(needed, _needed.get(id(app), 0.0))

    @app.on_after_configure.connect(weak=False)
    def _defaults(sender: Celery, **_: Any) -> None:
        _configure(sender, _needed.get(id(sender), needed), visibility_timeout)

    if getattr(app, "configured", False):  # already configured: the signal has fired
        _configure(app, needed, visibility_timeout)


_needed: dict[int, float] = {}  # app -> the longest visibility timeout its tasks need
_own_names: dict[tuple[int, str], tuple[str, OwnBody]] = {}  # (app, task) -> kind, body


def register(app: Celery, *, name: str = TASK_NAME, options: Options = None,
             kinds: Iterable[str] | None = None,
             visibility_timeout: float | None = None) -> CallTask:
    """Connect the process hooks, default the app's settings and register the task
    ``name(job_id, kind, request, operation=None)`` (returns :func:`outcome_dict`).

    ``options``: the processes' :class:`RunnerOptions` (or a function making them, called
    in each process); default: the environment. ``kinds``: the kinds this app runs (the
    visibility timeout fits the longest); ``visibility_timeout``: the host's own (a
    ``broker_transport_options`` value wins over both)."""
    _prepare(app, options, kinds, visibility_timeout)

    def run_call(self: CallTask, job_id: str, kind: str, request: dict[str, Any],
                 operation: str | None = None) -> dict[str, Any]:
        return outcome_dict(self.run_call(job_id, kind, request, operation=operation))

    task: CallTask = app.task(base=CallTask, bind=True, name=name)(run_call)
    return task


def enqueue_own_call(app: Celery, job_id: uuid.UUID | str, kind: str, *args: Any,
                     name: str | None = None, **options: Any) -> AsyncResult[Any]:
    """Send the job's own call of ``kind`` (the :func:`own_call_task` made on ``app`` for
    it; ``name`` picks one when several serve ``kind``) with the body's ``args``:
    ``task.apply_async((str(job_id), *args), **options)`` (``options``: ``apply_async``'s,
    the body's keywords in ``kwargs=``). A kind no own task of ``app`` serves is a
    ``ConfigError`` (import the module that makes it). Celery does not deduplicate: a
    second message is a second delivery, which resumes the call and never creates twice."""
    task_name = own_task_of(kind, name, [n for (a, n), (k, _) in _own_names.items()
                                         if a == id(app) and k == kind])
    task = app.tasks[task_name]
    return task.apply_async((str(job_id), *args), **options)


def own_call_task(app: Celery, kind: str, *, name: str | None = None,
                  operation: str | None = None, options: Options = None,
                  visibility_timeout: float | None = None) -> Callable[[OwnBody], CallTask]:
    """Make ``async def body(call, *args, **kwargs)`` (the host's own provider code for
    ``kind``) a durable task ``name(job_id, *args, **kwargs)`` (default name:
    ``<module>.<body>:<kind>``, :func:`~callwarden.queue.own.own_task_name`; a name already
    given to another kind or body is a ``ConfigError``)::

        @own_call_task(app, "replicate-prediction")
        async def predict(call: OwnCall, prompt: str) -> None:
            if call.action == "create":
                await call.task_created(await my_replicate.create(prompt))
            while (await call.report(await my_replicate.poll(call.task_id))).result \
                    == "still_running":
                await asyncio.sleep(2)

        enqueue_own_call(app, job_id, "replicate-prediction", "a fox")  # or predict.delay

    The task is a :class:`CallTask` (acked late, redelivered when its process dies,
    retried through a database outage); the app gets what :func:`register` sets (the
    process hooks, prefetch 1, a visibility timeout that fits ``kind``'s longest run,
    unless the host set one). In each process, after the fork, the call is opened with the
    process's :class:`~callwarden.calls.own.OwnCalls` and dispatched on its action
    (:mod:`callwarden.queue.own`): the body runs only to create or to resume, beating
    while it runs; a redelivery is never told to create again."""
    load_providers(os.environ)  # the host's own kinds (entry points, CALLWARDEN_PROVIDERS)
    get_kind(kind)  # a kind no provider registered is refused here, at import

    def wrap(body: OwnBody) -> CallTask:
        task_name = name or own_task_name(body, kind)
        held = _own_names.setdefault((id(app), task_name), (kind, body))
        if held != (kind, body):
            raise ConfigError(f"callwarden: task {task_name!r} is already the own call of "
                              f"{held[0]} ({getattr(held[1], '__qualname__', held[1])}): give "
                              f"each kind and body its own name")
        _prepare(app, options, [kind], visibility_timeout)

        def run(self: CallTask, job_id: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return outcome_dict(self.run_own(job_id, kind, body, args, kwargs,
                                             operation=operation))

        run.__doc__ = body.__doc__
        task: CallTask = app.task(base=CallTask, bind=True, name=task_name)(run)
        return task

    return wrap
