"""A host adapter's answers, checked before the engine acts on them.

The built-in clients map their provider's answers onto the outcome types themselves
(and are tested against recorded shapes); a host's client is code callwarden has never
seen. Whatever it returns passes through here first: a task id that is not a non-empty
string (at most 512 characters), or an outcome that is not one of
:mod:`callwarden.providers.outcomes`' types, is a
:class:`~callwarden.providers.errors.MalformedResponse` naming the provider — never a
``TaskCreated`` with a bogus id, never an ``AttributeError`` deep in the finalizer.
An exception the adapter lets out that is not a
:class:`~callwarden.providers.errors.ProviderError` becomes one: an HTTP error status its
client raised (aiohttp's ``raise_for_status``: ``ClientResponseError``) the error that
status means, as for the built-in clients
(:func:`~callwarden.providers.errors.error_for_status`: 429 ``RateLimited`` with its
``Retry-After``, 408 and 5xx ``TransientError``, 401/403 ``AuthenticationError``, 402
``InsufficientCredits``, any other 4xx ``BadRequest``: a create refused, nothing made
upstream), so a host's client needs no mapping of its own; a
connection or timeout error (any other ``aiohttp.ClientError``, ``OSError``,
``TimeoutError``) a :class:`~callwarden.providers.errors.TransientError` (retried),
anything else (a ``KeyError`` from an answer of an unexpected shape) a
``MalformedResponse``; the original is kept as ``__cause__``.

A poll is idempotent, so a transient answer to one (a 5xx, a timeout, a 429) is retried
here with the built-in clients' bounded, jittered backoff (the settings' retry policy:
attempts, total time, ``Retry-After``), on every path that polls (the runner, the
reconciler, the webhook receiver): a host's adapter gets what the transport gives the
built-in clients, and one 502 never parks a call until the next re-poll. A create is not
retried (it is not idempotent upstream).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp

from callwarden.providers.base import AsyncKindClient, RetryPolicy, SyncKindClient
from callwarden.providers.errors import (
    MalformedResponse,
    ProviderError,
    TransientError,
    error_for_status,
)
from callwarden.providers.media_guard import shown_url
from callwarden.providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
    SyncOutcome,
)
from callwarden.providers.raw import parse_retry_after
from callwarden.providers.transport import retry_delay

__all__ = ["MAX_TASK_ID", "CheckedAsyncClient", "CheckedSyncClient"]

#: The longest task id an adapter may return (the column is text; this keeps it sane).
MAX_TASK_ID = 512


T = TypeVar("T")


async def _guarded(provider: str, what: str, answer: Callable[[], Awaitable[T]]) -> T:
    """``answer()`` awaited; what the host's code raises, calling it or awaiting it, as a
    provider error (a wrong signature is a ``TypeError`` at the call: malformed too)."""
    try:
        return await answer()
    except ProviderError:
        raise
    except aiohttp.ClientResponseError as exc:
        raise _by_status(provider, what, exc) from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TransientError(f"{provider} adapter's {what}: {type(exc).__name__}: {exc}",
                             provider=provider) from exc
    except Exception as exc:
        raise MalformedResponse(f"{provider} adapter's {what} raised "
                                f"{type(exc).__name__}: {exc}", provider=provider) from exc


def _by_status(provider: str, what: str, exc: aiohttp.ClientResponseError) -> ProviderError:
    """An HTTP error status the host's client raised (aiohttp's ``raise_for_status``) as
    the error it means (:func:`~callwarden.providers.errors.error_for_status`, the mapping
    the built-in clients use; a 429's ``Retry-After`` read as they read it, seconds or an
    HTTP date). A ``ClientResponseError`` that carries no error status (aiohttp's
    ``ContentTypeError`` on a 200, ``TooManyRedirects`` on a 3xx) is no refusal: transient,
    as a connection error is (a create may have been made)."""
    asked = exc.request_info
    said = (f"{provider} adapter's {what}: HTTP {exc.status} {exc.message} "
            f"({asked.method} {shown_url(str(asked.real_url))})")
    if exc.status < 400:
        return TransientError(said, provider=provider, status=exc.status)
    after = exc.headers.get("Retry-After") if exc.headers is not None else None
    return error_for_status(exc.status, said, provider=provider,
                            retry_after=parse_retry_after(after, now=time.time()))


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


class CheckedAsyncClient:
    """``client`` (a host's :class:`AsyncKindClient`) with its answers checked."""

    def __init__(self, client: AsyncKindClient, provider: str, *,
                 policy: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.client, self.provider, self.kind = client, provider, client.kind
        self.policy, self.sleep = policy or RetryPolicy(), sleep

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        task_id: object = await _guarded(self.provider, "create()", lambda: self.client.create(
            request, callback_url=callback_url))
        if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > MAX_TASK_ID:
            raise MalformedResponse(
                f"{self.provider} adapter's create() returned {_shown(task_id)}: a task id "
                f"is a non-empty string of at most {MAX_TASK_ID} characters",
                provider=self.provider)
        return task_id

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        deadline = time.monotonic() + self.policy.max_total_s
        attempt = 0
        while True:
            try:
                outcome: object = await _guarded(self.provider, "poll()",
                                                 lambda: self.client.poll(
                                                     task_id, created_at=created_at))
                break
            except TransientError as err:
                attempt += 1
                delay = retry_delay(self.policy, attempt, err)
                if attempt >= self.policy.max_attempts or \
                        time.monotonic() + delay > deadline:
                    raise
                await self.sleep(delay)
        if not isinstance(outcome, Running | Succeeded | Failed | NotFound):
            raise MalformedResponse(
                f"{self.provider} adapter's poll() returned {_shown(outcome)}: expected "
                "Running, Succeeded, Failed or NotFound", provider=self.provider)
        return outcome


class CheckedSyncClient:
    """``client`` (a host's :class:`SyncKindClient`) with its answers checked."""

    def __init__(self, client: SyncKindClient, provider: str) -> None:
        self.client, self.provider, self.kind = client, provider, client.kind

    async def call(self, request: Mapping[str, Any]) -> SyncOutcome:
        outcome: object = await _guarded(self.provider, "call()",
                                         lambda: self.client.call(request))
        if not isinstance(outcome, Succeeded | Failed):
            raise MalformedResponse(
                f"{self.provider} adapter's call() returned {_shown(outcome)}: expected "
                "Succeeded or Failed", provider=self.provider)
        return outcome
