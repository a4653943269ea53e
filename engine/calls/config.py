"""Settings for the actors that run calls (workers, finalizer), validated on creation.

Loaded like every actor's (:mod:`callwarden.config`): defaults < the config file's ``[calls]``
table < ``CALLWARDEN_CALL_<FIELD>`` (per kind: ``CALLWARDEN_CALL_POLL_INTERVAL_<KIND>``,
``..._POLL_BUDGET_<KIND>``, ``..._AMBIGUOUS_CREATE_<KIND>``; ``CALLWARDEN_MEDIA_ALLOW_HOSTS``
is read too) < a command's flags."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from callwarden.config import load, register
from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS

__all__ = ["ENV_PREFIX", "AmbiguousCreate", "CallConfig", "load_call_config"]

ENV_PREFIX = "CALLWARDEN_CALL_"
MEDIA_ALLOW_ENV = "CALLWARDEN_MEDIA_ALLOW_HOSTS"

AmbiguousCreate = Literal["sweep", "recreate"]


class CallConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``ambiguous_create``: what a worker does with a call left ``created`` without a task
    id by a crash inside the create request — ``"sweep"`` (default: leave it for the
    reconciler to sweep and refund; never pay twice) or ``"recreate"`` (create again,
    accepting the risk of paying the provider twice). Per kind, with a default.

    Finalization leases fit the work: a claim on a result of ``n`` media is leased for
    :meth:`lease_for` ``(n)`` = the larger of ``finalize_lease_s`` and ``n`` × (one
    download's ``media_timeout_s`` + one upload's ``store_timeout_s``) plus
    ``lease_margin_s``; the finalizer gives up ``lease_margin_s`` before its lease ends
    (:meth:`deadline_for`), so nobody can take over a finalization that is still working.
    ``media_allow_hosts``: extra media hosts (names or ``*.suffix``) beyond each kind's
    own (``CALLWARDEN_MEDIA_ALLOW_HOSTS``, comma-separated). ``pricing_timeout_s``: how
    long a host's own pricing hook may take (it runs in a thread, off the event loop);
    past it the call is charged its reservation, logged. ``provider_call_timeout_s``: the
    longest a create or a sync call may run in the provider's code, a host adapter's
    included (the call heartbeats meanwhile, so no reconciler takes it over); past it a
    create is ambiguous (left for the reconciler) and a sync call fails and refunds.
    ``rate_limited_wait_s``: how long a create the provider refuses with 429 keeps trying
    (the kind's ``[limits]`` account paused and slowed meanwhile: docs/admission.md) before
    the call fails and refunds; a kind no limit names fails at the first 429."""

    finalize_lease_s: float = 120.0
    heartbeat_every_s: float = 10.0
    media_max_bytes: int = 200 * 2**20
    media_timeout_s: float = 120.0
    store_timeout_s: float = 60.0
    pricing_timeout_s: float = 5.0
    provider_call_timeout_s: float = 900.0
    rate_limited_wait_s: float = 300.0
    lease_margin_s: float | None = None
    media_allow_hosts: tuple[str, ...] = ()
    ambiguous_create: AmbiguousCreate = "sweep"
    ambiguous_create_by_kind: Mapping[str, AmbiguousCreate] = msgspec.field(
        default_factory=dict)
    poll_interval_s: Mapping[str, float] = msgspec.field(default_factory=dict)
    poll_budget_s: Mapping[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("finalize_lease_s", "heartbeat_every_s", "media_timeout_s",
                     "store_timeout_s", "media_max_bytes", "pricing_timeout_s",
                     "provider_call_timeout_s", "rate_limited_wait_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.margin_s < self.finalize_lease_s:
            raise ConfigError(f"lease_margin_s ({self.margin_s:g}) must be positive "
                              f"and below finalize_lease_s ({self.finalize_lease_s:g})")
        for field in ("ambiguous_create_by_kind", "poll_interval_s", "poll_budget_s"):
            for kind in getattr(self, field):
                if kind not in KINDS:
                    raise ConfigError(f"{field}: unknown provider_kind {kind!r}")
        for field in ("poll_interval_s", "poll_budget_s"):
            for kind, value in getattr(self, field).items():
                if not value > 0:
                    raise ConfigError(f"{field} for {kind} must be positive, got {value}")

    @property
    def margin_s(self) -> float:
        """``lease_margin_s``, or by default 15 s (a quarter of a shorter lease)."""
        if self.lease_margin_s is not None:
            return self.lease_margin_s
        return min(15.0, self.finalize_lease_s / 4)

    def lease_for(self, media: int) -> float:
        """Seconds a finalization claim on ``media`` results is leased for."""
        work = max(media, 1) * (self.media_timeout_s + self.store_timeout_s)
        return max(self.finalize_lease_s, work + self.margin_s)

    def deadline_for(self, media: int) -> float:
        """Seconds the finalizer may work before it gives up (inside its lease)."""
        return self.lease_for(media) - self.margin_s

    def policy_for(self, kind: str) -> AmbiguousCreate:
        return self.ambiguous_create_by_kind.get(kind, self.ambiguous_create)

    def interval_for(self, kind: str) -> float:
        return self.poll_interval_s.get(kind, KINDS[kind].poll_interval_s)

    def budget_for(self, kind: str) -> float:
        return self.poll_budget_s.get(kind, KINDS[kind].poll_budget_s)


register("calls", CallConfig)


def load_call_config(path: Path | None = None, env: Mapping[str, str] | None = None,
                     overrides: Mapping[str, Any] | None = None, *,
                     origins: Mapping[str, str] | None = None) -> CallConfig:
    """Defaults < ``path``'s ``[calls]`` < ``env`` < ``overrides`` (see the module;
    ``origins``: what errors call each override, e.g. its flag)."""
    env = dict(env or {})
    if env.get(MEDIA_ALLOW_ENV) and ENV_PREFIX + "MEDIA_ALLOW_HOSTS" not in env:
        env[ENV_PREFIX + "MEDIA_ALLOW_HOSTS"] = env[MEDIA_ALLOW_ENV]
    return load(CallConfig, path=path, env=env, prefix=ENV_PREFIX, section="calls",
                maps={"POLL_INTERVAL": "poll_interval_s", "POLL_BUDGET": "poll_budget_s",
                      "AMBIGUOUS_CREATE": "ambiguous_create_by_kind"},
                overrides=overrides, origins=origins)
