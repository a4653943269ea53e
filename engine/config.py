"""Settings for the actors that run calls (workers, finalizer), validated on creation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from engine.errors import ConfigError
from providers.kinds import KINDS

__all__ = ["AmbiguousCreate", "CallConfig"]

AmbiguousCreate = Literal["sweep", "recreate"]


class CallConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``ambiguous_create``: what a worker does with a call left ``created`` without a task
    id by a crash inside the create request — ``"sweep"`` (default: leave it for the
    reconciler to sweep and refund; never pay twice) or ``"recreate"`` (create again,
    accepting the risk of paying the provider twice). Per kind, with a default."""

    finalize_lease_s: float = 120.0
    heartbeat_every_s: float = 10.0
    media_max_bytes: int = 200 * 2**20
    media_timeout_s: float = 120.0
    ambiguous_create: AmbiguousCreate = "sweep"
    ambiguous_create_by_kind: Mapping[str, AmbiguousCreate] = msgspec.field(
        default_factory=dict)
    poll_interval_s: Mapping[str, float] = msgspec.field(default_factory=dict)
    poll_budget_s: Mapping[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.finalize_lease_s <= 0 or self.heartbeat_every_s <= 0:
            raise ConfigError("finalize_lease_s and heartbeat_every_s must be positive")
        for name in (*self.ambiguous_create_by_kind, *self.poll_interval_s,
                     *self.poll_budget_s):
            if name not in KINDS:
                raise ConfigError(f"unknown provider_kind {name!r} in call configuration")

    def policy_for(self, kind: str) -> AmbiguousCreate:
        return self.ambiguous_create_by_kind.get(kind, self.ambiguous_create)

    def interval_for(self, kind: str) -> float:
        return self.poll_interval_s.get(kind, KINDS[kind].poll_interval_s)

    def budget_for(self, kind: str) -> float:
        return self.poll_budget_s.get(kind, KINDS[kind].poll_budget_s)
