"""The interfaces the engine depends on: one async client per async kind, one sync client
per sync kind, and where each provider lives.

The engine imports these protocols, never a concrete client; ``callwarden.providers.registry``
builds
the concrete client for a ``provider_kind``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from callwarden.providers.llm_stop import StopPolicy
from callwarden.providers.outcomes import PollOutcome, SyncOutcome

__all__ = ["DEFAULT_MAX_ANSWER_BYTES", "AsyncKindClient", "Endpoint", "ProviderSettings",
           "RetryPolicy", "SyncKindClient"]


_MAX_ANSWER_VAR = "CALLWARDEN_PROVIDER_MAX_ANSWER_BYTES"
#: The built-in providers, whose clients add ``/v1`` (KIE: ``/api/v1``) to every path.
_BASE_ONLY = ("KIE", "REPLICATE", "ELEVENLABS", "ANTHROPIC")
#: The largest provider answer read by default (once inflated): 16 MiB.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the transport sends one request: bounded, jittered retries, each attempt's
    timeout, and ``max_answer_bytes``, the largest answer body it reads (counted once
    inflated; an answer over it is a ``MalformedResponse``). See
    callwarden.providers.transport."""

    max_attempts: int = 4
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0
    max_total_s: float = 30.0
    timeout_s: float = 30.0
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        if self.max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be >= 1, got {self.max_answer_bytes}")



class AsyncKindClient(Protocol):
    """A polled upstream task of one ``provider_kind``."""

    kind: str

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        """Start an upstream task; return its task id. Not idempotent upstream."""
        ...

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        """One status check of ``task_id``. Never creates anything. ``created_at`` (unix
        seconds): when the task was created, if known — a provider that briefly denies a
        new task (KIE's "recordInfo is null") counts its grace window from it."""
        ...


class SyncKindClient(Protocol):
    """A single-round-trip upstream call of one ``provider_kind``."""

    kind: str

    async def call(self, request: Mapping[str, Any]) -> SyncOutcome:
        """Make the call; return the outcome. Raises ``ProviderError`` on transport or
        protocol errors."""
        ...


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    base_url: str
    api_key: str
    media_base_url: str | None = None


class ProviderSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where each provider lives and how to authenticate. Defaults are the real APIs.
    ``endpoints``: the providers a host registered (by provider name; the built-in four
    have their own fields). ``stop_policy``: per language-model kind (``anthropic-sync``,
    ``kie-llm``), which stop reasons are results (``{"max_tokens": "succeed"}`` accepts
    truncated answers); the defaults and why: :mod:`callwarden.providers.llm_stop`."""

    kie: Endpoint = Endpoint(base_url="https://api.kie.ai", api_key="")
    replicate: Endpoint = Endpoint(base_url="https://api.replicate.com", api_key="")
    elevenlabs: Endpoint = Endpoint(base_url="https://api.elevenlabs.io", api_key="")
    anthropic: Endpoint = Endpoint(base_url="https://api.anthropic.com", api_key="")
    retry: RetryPolicy = RetryPolicy()
    stop_policy: Mapping[str, StopPolicy] = msgspec.field(default_factory=dict)
    endpoints: Mapping[str, Endpoint] = msgspec.field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 hosts: Mapping[str, str] | None = None,
                 names: Mapping[str, tuple[str, str]] | None = None) -> ProviderSettings:
        """Read ``CALLWARDEN_<PROVIDER>_URL`` and ``<PROVIDER>_API_KEY`` (e.g.
        ``KIE_API_KEY``, ``REPLICATE_API_TOKEN``, ``ELEVENLABS_API_KEY``,
        ``ANTHROPIC_API_KEY``; for each of ``hosts``, a host's provider name -> its
        default base URL, ``CALLWARDEN_<NAME>_URL`` and ``<NAME>_API_KEY`` with the
        name upper-cased and ``-`` spelled ``_``), and
        ``CALLWARDEN_PROVIDER_MAX_ANSWER_BYTES`` (the largest answer read, default 16 MiB:
        :class:`RetryPolicy`; a bad value is a ``ValueError``
        naming the variable). ``names``: provider name -> the host's own variables for its
        URL and key (``("ACME_BASE_URL", "ACME_TOKEN")``; ``""``: none), each read when
        callwarden's is unset, so that a provider is configured once, under either
        name (``Provider.url_env`` / ``key_env``)."""
        e = os.environ if env is None else env
        base = cls()
        retry = base.retry
        limit = e.get(_MAX_ANSWER_VAR, "").strip()
        if limit:
            try:
                retry = msgspec.structs.replace(retry, max_answer_bytes=int(limit))
            except ValueError as exc:  # the engine's actors report it as a ConfigError
                raise ValueError(f"{_MAX_ANSWER_VAR}: a number of bytes >= 1, got "
                                 f"{limit!r}") from exc

        def ep(name: str, default: Endpoint, key_var: str) -> Endpoint:
            url_var = f"CALLWARDEN_{name}_URL"
            own_url, own_key = (names or {}).get(name.lower().replace("_", "-"), ("", ""))
            if url_var not in e and own_url in e:
                url_var = own_url
            if key_var not in e and own_key in e:
                key_var = own_key
            url = e.get(url_var, default.base_url).rstrip("/")
            if name in _BASE_ONLY and url.lower().endswith(("/v1", "/api/v1")):
                raise ValueError(f"{url_var}: the provider's base URL, without "
                                 f"its API version (e.g. {default.base_url}), got {url!r}: "
                                 "callwarden adds the version to each path")
            return Endpoint(base_url=url, api_key=e.get(key_var, default.api_key))

        def host(name: str, url: str) -> Endpoint:
            env_name = name.upper().replace("-", "_")
            return ep(env_name, Endpoint(base_url=url, api_key=""), f"{env_name}_API_KEY")

        return cls(
            endpoints={name: host(name, url) for name, url in (hosts or {}).items()},
            kie=ep("KIE", base.kie, "KIE_API_KEY"),
            replicate=ep("REPLICATE", base.replicate, "REPLICATE_API_TOKEN"),
            elevenlabs=ep("ELEVENLABS", base.elevenlabs, "ELEVENLABS_API_KEY"),
            anthropic=ep("ANTHROPIC", base.anthropic, "ANTHROPIC_API_KEY"),
            retry=retry,
        )

    @classmethod
    def for_simulator(cls, base_url: str, api_key: str = "sim-key") -> ProviderSettings:
        """All four providers served by one simulator at ``base_url``, each under its own
        prefix (``/kie``, ``/replicate``, ``/elevenlabs``, ``/anthropic``)."""
        url = base_url.rstrip("/")

        def ep(name: str) -> Endpoint:
            return Endpoint(base_url=f"{url}/{name}", api_key=api_key)

        return cls(kie=ep("kie"), replicate=ep("replicate"), elevenlabs=ep("elevenlabs"),
                   anthropic=ep("anthropic"))
