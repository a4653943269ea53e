"""The registry of the 14 ``provider_kind`` values (seed §4, corrected by the reference).

Pure data: which provider serves a kind, whether it is polled (async) or answers in one
round trip (sync), the original design's stale threshold, the provider's result-URL lifetime, the
poll cadence/budget a worker uses, and the hosts its result media are served from (the
only hosts, with the provider's configured endpoint, media is downloaded from:
:mod:`callwarden.providers.media_guard`). Thresholds here are *defaults*: the reconciler's
configuration may override them and validates them against ``result_url_lifetime_s``.

A host adds its own kinds with the provider that serves them
(:func:`callwarden.providers.registry.register` checks each with :func:`check_kind`,
then adds it to :data:`KINDS`): after that, a
host kind is known everywhere a built-in one is (the worker, the reconciler's thresholds,
the media guard, the settings' per-kind maps).
"""

from __future__ import annotations

import math
import re
from typing import Literal

import msgspec

from callwarden.providers.errors import AdapterError, UnknownProviderKind

__all__ = [
    "BUILTIN_PROVIDERS",
    "ELEVENLABS_SYNC_OPERATIONS",
    "KINDS",
    "KindSpec",
    "check_kind",
    "get_kind",
    "is_sync_call",
    "kinds_of",
]

#: The providers callwarden ships clients for (a kind's ``provider`` names any entry of
#: :data:`callwarden.providers.registry.PROVIDERS`).
BuiltinProvider = Literal["kie", "replicate", "elevenlabs", "anthropic"]
BUILTIN_PROVIDERS: tuple[BuiltinProvider, ...] = ("kie", "replicate", "elevenlabs", "anthropic")
Mode = Literal["async", "sync"]

MIN = 60.0
HOUR = 3600.0
KIE_URL_LIFETIME = 24 * HOUR  # docs say 14 d and "typically 24 h": design for 24 h
REPLICATE_URL_LIFETIME = 1 * HOUR  # API outputs deleted after one hour (data_removed)
# UNVERIFIED: no source gives a lifetime for a legacy /v1/dubbing result. The SDK and the
# OpenAPI serve it from the API host (GET /v1/dubbing/{id}/audio/{lang}) and document no
# expiry (the dub stays until DELETE); Dubbing v2's signed URLs last about 1 h. 24 h is a
# conservative bound the stale threshold is validated against (docs/providers.md).
ELEVENLABS_DUB_LIFETIME = 24 * HOUR


class KindSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    provider: str
    mode: Mode
    family: str
    stale_threshold_s: float
    result_url_lifetime_s: float | None  # None: no URL to expire (inline result)
    poll_interval_s: float = 3.0
    poll_budget_s: float = 15 * MIN
    media_hosts: tuple[str, ...] = ()
    #: whether a completed call may carry files to store (a media store is then needed);
    #: ``False`` only for kinds that answer text alone (the language models)
    media_results: bool = True

    @property
    def is_async(self) -> bool:
        return self.mode == "async"


# Where each provider serves result files (reference §1, §11; docs/providers.md).
KIE_MEDIA_HOSTS = ("tempfile.aiquickdraw.com", "*.aiquickdraw.com", "tempfile.redpandaai.co",
                   "*.redpandaai.co")
REPLICATE_MEDIA_HOSTS = ("replicate.delivery", "*.replicate.delivery")
_MEDIA_HOSTS: dict[BuiltinProvider, tuple[str, ...]] = {
    "kie": KIE_MEDIA_HOSTS, "replicate": REPLICATE_MEDIA_HOSTS,
    # ElevenLabs serves dubbed audio from its API host (the configured endpoint).
    "elevenlabs": (), "anthropic": ()}


def _k(name: str, provider: BuiltinProvider, mode: Mode, family: str, threshold_min: float,
       lifetime_s: float | None, interval_s: float = 3.0, budget_min: float = 15) -> KindSpec:
    return KindSpec(
        name=name, provider=provider, mode=mode, family=family,
        media_results=family not in ("llm", "messages"),
        stale_threshold_s=threshold_min * MIN, result_url_lifetime_s=lifetime_s,
        poll_interval_s=interval_s, poll_budget_s=budget_min * MIN,
        media_hosts=_MEDIA_HOSTS[provider] if mode == "async" else (),
    )


KINDS: dict[str, KindSpec] = {
    k.name: k
    for k in (
        _k("kie-standard", "kie", "async", "market", 10, KIE_URL_LIFETIME),
        _k("kie-veo", "kie", "async", "veo", 25, KIE_URL_LIFETIME, 10, 20),
        _k("kie-suno", "kie", "async", "suno", 30, KIE_URL_LIFETIME, 5, 25),
        _k("kie-kontext", "kie", "async", "kontext", 10, KIE_URL_LIFETIME),
        _k("kie-luma", "kie", "async", "luma", 25, KIE_URL_LIFETIME, 30, 20),
        _k("kie-kling3", "kie", "async", "market", 25, KIE_URL_LIFETIME, 5, 20),
        _k("kie-runway", "kie", "async", "runway", 25, KIE_URL_LIFETIME, 5, 20),
        _k("kie-lip-sync", "kie", "async", "market", 75, KIE_URL_LIFETIME, 10, 60),
        _k("kie-llm", "kie", "sync", "llm", 5, None),
        _k("replicate-prediction", "replicate", "async", "prediction", 20,
           REPLICATE_URL_LIFETIME, 2, 15),
        _k("replicate-training", "replicate", "async", "training", 30,
           REPLICATE_URL_LIFETIME, 10, 25),
        # Only dubbing is pollable; voice clone / design / forced alignment are sync
        # (see ELEVENLABS_SYNC_OPERATIONS and is_sync_call).
        _k("elevenlabs-async", "elevenlabs", "async", "dubbing", 15, ELEVENLABS_DUB_LIFETIME,
           5, 12),
        _k("elevenlabs-sync", "elevenlabs", "sync", "speech", 5, None),
        _k("anthropic-sync", "anthropic", "sync", "messages", 5, None),
    )
}

# Operations filed under ``elevenlabs-async`` by the seed that the reference shows are
# synchronous: no id to poll, so they get sweep semantics.
ELEVENLABS_SYNC_OPERATIONS = frozenset({"voice-clone", "voice-design", "forced-alignment"})


_KIND_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _spec_problem(spec: KindSpec) -> str | None:
    if not _KIND_NAME.fullmatch(spec.name):
        return "a kind's name is 1-63 of a-z, 0-9 and '-' (it names settings: THRESHOLD_<KIND>)"
    if spec.mode not in ("async", "sync"):
        return f"mode must be 'async' or 'sync', got {spec.mode!r}"
    for field in ("stale_threshold_s", "poll_interval_s", "poll_budget_s"):
        value = getattr(spec, field)
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            return f"{field} must be a number of seconds > 0, got {value!r}"
    life = spec.result_url_lifetime_s
    if life is not None and not (math.isfinite(life) and life > 0):
        return f"result_url_lifetime_s must be > 0 seconds or None, got {life!r}"
    if life is not None and spec.stale_threshold_s >= life:
        return (f"stale_threshold_s ({spec.stale_threshold_s:g}) must be below "
                f"result_url_lifetime_s ({life:g}): a call recovered later finds its result "
                "gone")
    return None


def check_kind(spec: KindSpec) -> None:
    """``AdapterError`` if ``spec`` is out of range, or if another provider already serves
    a kind of that name (the same provider may declare it again: it replaces its spec)."""
    problem = _spec_problem(spec)
    if problem is not None:
        raise AdapterError(f"kind {spec.name!r}: {problem}")
    known = KINDS.get(spec.name)
    if known is not None and known.provider != spec.provider:
        raise AdapterError(f"kind {spec.name!r} is served by provider {known.provider!r}; "
                           f"provider {spec.provider!r} cannot declare it too")



def kinds_of(provider: str, mode: Mode | None = None) -> tuple[str, ...]:
    """The kinds of ``provider`` (of ``mode`` only, when given), in registry order."""
    return tuple(k for k, s in KINDS.items()
                 if s.provider == provider and (mode is None or s.mode == mode))


def get_kind(name: str) -> KindSpec:
    """The spec of ``name``; :class:`UnknownProviderKind` if no such kind is registered."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownProviderKind(f"unknown provider_kind {name!r}") from None


def is_sync_call(kind: str, operation: str | None = None) -> bool:
    """Whether a call of ``kind`` (and, for ElevenLabs, ``operation``) is a single round
    trip with no task id to poll."""
    spec = get_kind(kind)
    if spec.name == "elevenlabs-async" and operation in ELEVENLABS_SYNC_OPERATIONS:
        return True
    return spec.mode == "sync"
