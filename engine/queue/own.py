"""A host's own call inside a queue task: the host's code makes the provider requests, and
callwarden opens the call, decides what the host may do, and keeps the call alive.

The host writes one *body* per kind, ``async def body(call, *args)``: for an async kind
``call`` is an :class:`~callwarden.calls.own.OwnCall`; it creates the task when
``call.action == "create"`` (``await call.task_created(id)``), then polls
``call.task_id`` and reports each answer (``await call.report(outcome)``) until the
result is no longer ``still_running``. For a sync or streaming kind ``call`` is a
:class:`~callwarden.calls.own_sync.SyncCall` and the body makes its one request.

:func:`run_own` dispatches on the call's action, so that a redelivered task never runs the
host's create again:

- ``create`` and ``resume``: the body runs, with a heartbeat every
  ``CallConfig.heartbeat_every_s`` for as long as it runs (``TaskCreated`` is the first
  beat), so a process killed inside it is taken over after the heartbeat timeout, for at
  most :func:`body_bound_s` (a create's 429 waits included);
- ``finalize``: upstream already succeeded: callwarden finalizes it (the body is not run);
- ``ambiguous`` (a start with no task id: the reconciler sweeps it), ``done`` and
  ``not_started``: nothing runs; the outcome says why.

A start the provider account's limits refuse (:class:`~callwarden.errors.CallWaiting`:
nothing was written, the body does not run) is the outcome ``waiting``, with the limit in
its ``detail`` and ``retry_after_s``: the Celery and arq faces put the job back on its
queue for that long, without counting a delivery.

When the body returns with the call still open (it stopped polling), the call is the
reconciler's. An exception from the body propagates: for an async kind, what the call
recorded so far stands and the reconciler finishes the rest; for a sync kind the call is
failed and refunded (:mod:`callwarden.calls.own_sync`).

The Celery and arq faces are :func:`callwarden.queue.celery.own_call_task` and
:func:`callwarden.queue.arq.own_call_function`, each with an ``enqueue_own_call(queue,
job_id, kind, *args)`` that finds the task this process made for ``kind``
(:func:`own_task_of`): a host never writes a task name, nor arq's job id.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from callwarden.calls.own import CallNotStarted, OwnCalls
from callwarden.calls.runner import CallOutcome, call_outcome
from callwarden.errors import CallWaiting, ConfigError
from callwarden.projections.fold import EMPTY
from callwarden.providers.kinds import get_kind, is_sync_call

__all__ = ["OwnBody", "body_bound_s", "own_task_name", "own_task_of", "run_own",
           "waiting_outcome"]

#: ``async def body(call, *args)``: the host's own provider code for one kind.
OwnBody = Callable[..., Awaitable[object]]

_NOT_RUN = {
    "ambiguous": "ambiguous create (a start with no task id): left for the reconciler",
    "done": "already terminal",
    "not_started": "not started: the host ended the job, or other code holds a task on it",
}


def own_task_name(body: OwnBody, kind: str) -> str:
    """The default queue name of ``body`` run for ``kind``: ``<module>.<name>:<kind>`` (one
    body serving several kinds is one task per kind, each recording its own kind)."""
    return f"{body.__module__}.{getattr(body, '__name__', 'own_call')}:{kind}"


def own_task_of(kind: str, name: str | None, names: Sequence[str]) -> str:
    """The task to enqueue for an own call of ``kind``: the one of ``names`` (the own tasks
    this process made for ``kind``), or ``name`` when it is one of them; else a
    ``ConfigError`` saying why (none made here: the host's module that makes it is not
    imported; several: ``name`` picks one)."""
    if name is not None and name in names:
        return name
    if name is None and len(names) == 1:
        return names[0]
    said = f"{name!r} is not one of them" if name is not None and names else (
        f"{len(names)} serve it ({', '.join(sorted(names))}): pass name=" if names
        else "none was made in this process (import the module that makes it)")
    raise ConfigError(f"callwarden: no own call of {kind} to enqueue: {said}")


def waiting_outcome(job_id: uuid.UUID, exc: CallWaiting) -> CallOutcome:
    """The outcome of a start the account's limits refused: ``waiting``, the limit in
    ``detail``, when to try again in ``retry_after_s`` (as ``CallRunner.run`` answers)."""
    return CallOutcome(job_id=job_id, result="waiting", projection=exc.projection or EMPTY,
                       detail=exc.reason, retry_after_s=exc.retry_after_s)


def body_bound_s(calls: OwnCalls, kind: str, *, creates: bool = True) -> float:
    """How long a body may run: the kind's poll budget plus a create and a last poll with
    their retries (``request_s`` each), and, for a body told to create (``creates``), the
    create's 429 waits, ``CallConfig.rate_limited_wait_s``: a host whose create the
    provider refuses with 429 pauses the account (``Database.slow_down``) and creates again
    after the pause, while the call beats, as ``CallRunner`` does for that long
    (docs/admission.md). With the defaults, ``kie-standard``: 900 + 2 x 60 + 300 = 1,320 s
    to create, 1,020 s to resume. Within :func:`~callwarden.queue.process.longest_run_s`,
    what the queue's visibility timeout (arq's ``job_timeout``) is sized for."""
    request_s = calls.settings.retry.max_total_s + calls.settings.retry.timeout_s
    waits_s = calls.config.rate_limited_wait_s if creates else 0.0
    return calls.config.budget_for(kind) + 2 * request_s + waits_s


async def run_own(calls: OwnCalls, job_id: uuid.UUID, kind: str, body: OwnBody,
                  args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                  operation: str | None = None) -> CallOutcome:
    """Open the job's call of ``kind``, run ``body(call, *args, **kwargs)`` when the call's
    action is the host's to do (see the module), and return how the call stands after it.
    A body still running after :func:`body_bound_s` is cancelled and the call left to the
    reconciler (the queue would deliver the job again soon after)."""
    get_kind(kind)  # an unknown kind is refused before anything is written
    kwargs = kwargs or {}
    if is_sync_call(kind, operation):
        entered = False
        try:
            async with calls.sync_call(job_id, kind, operation=operation) as sync:
                entered = True
                await body(sync, *args, **kwargs)
        except CallNotStarted as exc:
            return call_outcome(job_id, exc.projection or EMPTY, str(exc))
        except CallWaiting as exc:
            if entered:  # the body's own (another job's start): the call failed with it
                raise
            return waiting_outcome(job_id, exc)
        return call_outcome(job_id, await calls.db.load(job_id))
    try:
        call = await calls.start(job_id, kind, operation=operation)
    except CallWaiting as exc:
        return waiting_outcome(job_id, exc)
    if call.action == "finalize":
        return await call.finalize()
    if call.action not in ("create", "resume"):
        return call_outcome(job_id, call.projection, _NOT_RUN[call.action])
    bound = body_bound_s(calls, kind, creates=call.action == "create")
    ran = "returned"
    async with call.beating():
        try:
            async with asyncio.timeout(bound):
                await body(call, *args, **kwargs)
        except TimeoutError:
            ran = (f"ran past {bound:g} s (the kind's poll budget and its requests"
                   f"{', and rate_limited_wait_s' if call.action == 'create' else ''})")
    p = await calls.db.load(job_id)
    return call_outcome(job_id, p, None if p.terminal else
                        f"the body {ran} with the call {p.state.value if p.state else 'open'}"
                        f" ({call.action}): left for the reconciler")
