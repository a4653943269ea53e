"""The one place that sends HTTP: timeouts, bounded jittered retries, error translation.

Clients build requests and parse responses with pure functions; this module only moves
bytes. Each client passes a ``classify`` function that turns a response into a
:class:`~callwarden.providers.errors.ProviderError` (or ``None`` when it is usable). Transient
errors
are retried with full-jitter exponential backoff, bounded in attempts *and* total time,
honouring ``Retry-After``.

A create request is **not idempotent** upstream (no provider takes an idempotency key), so
for ``idempotent=False`` only failures that prove the request was never processed are
retried: HTTP 429 and a connection that could not be opened. A timeout, a reset or a 5xx
after sending is ambiguous and is raised at once for the caller to decide.

**No redirect is ever followed.** Every request here carries the provider's key
(``Authorization``, ``xi-api-key``, ``x-api-key``), and aiohttp strips only
``Authorization`` when a redirect leaves the origin: a followed redirect would hand the
other keys to whoever the ``Location`` names. A 3xx answer is
:class:`~callwarden.providers.errors.MalformedResponse` (no provider API documents one), its
``Location`` named without the query; nothing is sent there.

**An answer is read within a limit.** Every request asks for ``Accept-Encoding:
identity`` (no provider needs compression), and the body is read in chunks up to the
policy's ``max_answer_bytes`` (16 MiB by default), counted once inflated when a server
compresses it anyway: an answer over it — a declared ``Content-Length`` before a byte is
read, or the bytes as they come (a decompression bomb stops at the limit) — is
:class:`~callwarden.providers.errors.MalformedResponse` naming the limit, the connection
closed. Like any malformed answer it is not retried at once: a poll is polled again on its
next tick, a create or a sync call is refused. A client whose answer is itself a file
(ElevenLabs' audio) passes its own, larger ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import aiohttp

from callwarden.providers.base import RetryPolicy
from callwarden.providers.errors import (
    MalformedResponse,
    NotSent,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    TransientError,
)
from callwarden.providers.media_guard import shown_url
from callwarden.providers.raw import RawResponse

__all__ = ["Classify", "RetryPolicy", "Sleep", "TraceRequest", "send", "trace_requests"]


DEFAULT_POLICY = RetryPolicy()


Classify = Callable[[RawResponse], ProviderError | None]
Sleep = Callable[[float], Awaitable[None]]
#: ``(provider, method, url, attempt)`` -> a context around one HTTP attempt, yielding the
#: function called with the response when one came (``callwarden.observe.tracing``: a span).
TraceRequest = Callable[[str, str, str, int],
                        AbstractContextManager[Callable[[RawResponse], None]]]
_trace: TraceRequest | None = None


def trace_requests(hook: TraceRequest | None) -> None:
    """Wrap every HTTP attempt of this process in ``hook`` (``None``: none; the default)."""
    global _trace
    _trace = hook


def _backoff(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    cap = min(policy.max_delay_s, policy.base_delay_s * (2 ** attempt))
    return rng.uniform(0, cap)


def retry_delay(policy: RetryPolicy, attempt: int, err: ProviderError,
                rng: random.Random | None = None) -> float:
    """The wait before retry ``attempt`` (1, 2, ...) after ``err``: full-jitter
    exponential backoff, at least a rate limit's ``Retry-After``."""
    delay = _backoff(policy, attempt, rng or _JITTER)
    if isinstance(err, RateLimited) and err.retry_after is not None:
        delay = max(delay, err.retry_after)
    return delay


def _retryable(err: ProviderError, idempotent: bool) -> bool:
    if isinstance(err, RateLimited):
        return True
    if not idempotent:
        return isinstance(err, _ConnectFailed)
    return isinstance(err, TransientError)


class _ConnectFailed(NotSent):
    """The TCP connection could not be opened: the request was certainly not processed."""


_CHUNK = 64 * 1024


async def _read_capped(resp: aiohttp.ClientResponse, method: str, url: str, *,
                       provider: str, max_bytes: int) -> bytes:
    """The body, read in chunks; :class:`MalformedResponse` (the connection closed) as
    soon as it is known to be over ``max_bytes``."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        resp.close()
        raise MalformedResponse(
            f"{method} {shown_url(url)} answered Content-Length {declared}: more than "
            f"{max_bytes} bytes, the limit for a provider answer (not read)",
            provider=provider, status=resp.status)
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            resp.close()
            inflated = resp.headers.get("Content-Encoding", "").strip()
            raise MalformedResponse(
                f"{method} {shown_url(url)} answered more than {max_bytes} bytes"
                f"{f' once inflated ({inflated[:40]})' if inflated else ''}, the limit for "
                f"a provider answer: the rest was not read", provider=provider,
                status=resp.status)
    return bytes(body)


def _identity(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` asking for an uncompressed answer (any ``Accept-Encoding`` replaced)."""
    out = {k: v for k, v in (headers or {}).items() if k.lower() != "accept-encoding"}
    out["Accept-Encoding"] = "identity"
    return out


async def _once(
    session: aiohttp.ClientSession, method: str, url: str, *, provider: str,
    timeout_s: float, max_bytes: int, kwargs: Mapping[str, Any],
) -> RawResponse:
    try:
        async with session.request(
            method, url, timeout=aiohttp.ClientTimeout(total=timeout_s), **kwargs
        ) as resp:
            body = await _read_capped(resp, method, url, provider=provider,
                                      max_bytes=max_bytes)
            headers = {k.lower(): v for k, v in resp.headers.items()}
            return RawResponse(status=resp.status, headers=headers, body=body,
                               received_at=time.time())
    except TimeoutError as exc:
        raise ProviderTimeout(
            f"{method} {url} timed out after {timeout_s}s", provider=provider
        ) from exc
    except aiohttp.ClientConnectorError as exc:
        raise _ConnectFailed(f"cannot connect for {method} {url}: {exc}",
                             provider=provider) from exc
    except aiohttp.ClientError as exc:
        raise TransientError(f"{method} {url} failed: {exc!r}", provider=provider) from exc


async def _checked(
    session: aiohttp.ClientSession, method: str, url: str, *, provider: str,
    classify: Classify, timeout_s: float, max_bytes: int, kwargs: Mapping[str, Any],
    seen: Callable[[RawResponse], None] | None = None,
) -> RawResponse:
    """One attempt: the response if ``classify`` accepts it, else its error raised."""
    raw = await _once(session, method, url, provider=provider, timeout_s=timeout_s,
                      max_bytes=max_bytes, kwargs=kwargs)
    if seen is not None:
        seen(raw)
    if 300 <= raw.status < 400:
        location = shown_url(raw.headers.get("location", "")) or "nowhere"
        raise MalformedResponse(
            f"{method} {shown_url(url)} answered HTTP {raw.status} redirecting to "
            f"{location}: not followed (a request carrying credentials never is)",
            provider=provider, status=raw.status)
    err = classify(raw)
    if err is not None:
        raise err
    return raw


#: The retries' jitter when the caller brings no generator (one per process: a new
#: ``random.Random()`` per request seeded itself from ``os.urandom`` every time), seeded
#: again in a forked child (prefork workers would otherwise back off in step).
_JITTER = random.Random()
os.register_at_fork(after_in_child=_JITTER.seed)


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    provider: str,
    classify: Classify,
    policy: RetryPolicy = DEFAULT_POLICY,
    idempotent: bool = True,
    sleep: Sleep = asyncio.sleep,
    rng: random.Random | None = None,
    max_bytes: int | None = None,
    **kwargs: Any,
) -> RawResponse:
    """Send one logical request; return a response that ``classify`` accepts.

    ``kwargs`` go to ``aiohttp.ClientSession.request`` (``json=``, ``data=``, ``params=``,
    ``headers=``; ``Accept-Encoding`` is always ``identity``). ``max_bytes``: the largest
    answer read (default: ``policy.max_answer_bytes``). Raises a :class:`ProviderError`
    subclass, never an aiohttp error.
    """
    rng = rng or _JITTER
    limit = policy.max_answer_bytes if max_bytes is None else max_bytes
    kwargs["allow_redirects"] = False  # never: the key would go along (module docstring)
    kwargs["headers"] = _identity(kwargs.get("headers"))
    deadline = time.monotonic() + policy.max_total_s
    attempt = 0
    while True:
        try:
            if _trace is None:
                return await _checked(session, method, url, provider=provider,
                                      classify=classify, timeout_s=policy.timeout_s,
                                      max_bytes=limit, kwargs=kwargs)
            with _trace(provider, method, url, attempt + 1) as seen:
                return await _checked(session, method, url, provider=provider,
                                      classify=classify, timeout_s=policy.timeout_s,
                                      max_bytes=limit, kwargs=kwargs, seen=seen)
        except ProviderError as err:
            attempt += 1
            if attempt >= policy.max_attempts or not _retryable(err, idempotent):
                raise
            delay = _backoff(policy, attempt, rng)
            if isinstance(err, RateLimited) and err.retry_after is not None:
                delay = max(delay, err.retry_after)
            if time.monotonic() + delay > deadline:
                raise
            await sleep(delay)
