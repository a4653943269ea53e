"""The reconciler's settings: defaults from the seed, read from a file and the environment,
validated at start (River's job rescuer: a config with validated defaults).

Precedence (:mod:`callwarden.config`, every actor's pattern): defaults < file (TOML or JSON;
its ``[reconcile]`` table, or the top level of a file with no actor tables) <
environment (``CALLWARDEN_RECONCILE_<FIELD>``, e.g. ``CALLWARDEN_RECONCILE_SCAN_INTERVAL_S``;
a kind's threshold as ``CALLWARDEN_RECONCILE_THRESHOLD_<KIND>`` with ``-`` spelled ``_``,
e.g. ``CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD=600``). Every problem is a
:class:`~callwarden.errors.ConfigError` naming the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Literal

import msgspec

from callwarden.config import load, register
from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.rules.stale import StaleRule

__all__ = ["ENV_PREFIX", "ReconcileConfig", "load_config"]

ENV_PREFIX = "CALLWARDEN_RECONCILE_"


class ReconcileConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``thresholds_s`` overrides the original design's per-kind stale thresholds
    (:data:`callwarden.providers.kinds.KINDS`); kinds not named keep their default.

    ``legacy_cutoff``: a row with no call (no ``provider_call_started_at``) is a legacy row,
    swept after ``legacy_threshold_s``, only if it was created before this time (ISO 8601
    with a zone). Default (``None``): when this database got the call columns (migration
    0002 applied). Newer call-less rows are the host's (pipeline wrappers, queued jobs),
    until ``reserved_without_call_s``: a call-less ``pending``/``processing`` job created
    that long ago that still holds a ``reserved`` reservation (its queue message was lost,
    or its worker died before the call started) is swept and refunded — never reserved
    forever. ``0`` (or ``null`` in JSON and the environment) turns that off; otherwise it
    must be at least ``legacy_threshold_s``.

    Jobs the host ended on its own (docs/reconciler.md, "Jobs ended outside callwarden"):
    a job it ended with no call gets its ``HostEnded`` event if it was created within the
    last ``outside_window_s`` (``0``/``null``: never), so ``verify`` and ``audit`` see it;
    a job it *completed* is the host's to commit, and ``host_left_after_s`` after that was
    recorded a reservation it still left ``reserved`` is committed at the reservation
    (``host_completed_reserved = "commit"``, the default) or left and reported
    (``"leave"``)."""

    thresholds_s: Mapping[str, float] = msgspec.field(default_factory=dict)
    scan_interval_s: float = 30.0
    scan_jitter: float = 0.2
    repoll_interval_s: float = 300.0
    attempt_cap: int = 18
    batch_size: int = 50
    concurrency: int = 8
    heartbeat_timeout_s: float = 60.0
    legacy_threshold_s: float = 3600.0
    claim_lease_s: float = 120.0
    url_buffer_s: float = 600.0
    headroom_s: float = 600.0
    legacy_cutoff: datetime | None = None
    reserved_without_call_s: float | None = 86400.0
    kinds: tuple[str, ...] = ()
    host_left_after_s: float = 300.0
    host_completed_reserved: Literal["commit", "leave"] = "commit"
    outside_window_s: float | None = 7 * 86400.0

    def __post_init__(self) -> None:
        _check_positive(self)
        _check_kinds(self)
        _check_horizon(self)

    def threshold_for(self, kind: str) -> float:
        """The stale threshold of a known ``kind`` (seconds)."""
        return self.thresholds_s.get(kind, KINDS[kind].stale_threshold_s)

    @property
    def deployed(self) -> tuple[str, ...]:
        """The kinds this deployment runs (``kinds``; empty: every known kind): the
        checks that bound one setting by every kind's threshold or URL lifetime (the
        attempt budget, a threshold under its URL lifetime) look at these only."""
        return self.kinds or tuple(KINDS)

    @property
    def thresholds(self) -> dict[str, float]:
        """Every known kind's effective threshold."""
        return {kind: self.threshold_for(kind) for kind in KINDS}

    @property
    def stale(self) -> StaleRule:
        """The staleness rule with these thresholds (every reader of staleness uses it)."""
        return StaleRule(thresholds=self.thresholds, legacy_threshold_s=self.legacy_threshold_s,
                         heartbeat_timeout_s=self.heartbeat_timeout_s)

    @property
    def min_threshold_s(self) -> float:
        return min(self.thresholds.values())

    def horizon_s(self, kind: str | None) -> float:
        """How long a call of ``kind`` may stay open at most: its threshold plus every
        attempt the cap allows (DESIGN §8.6). An unknown kind uses the legacy threshold."""
        threshold = self.threshold_for(kind) if kind in KINDS else self.legacy_threshold_s
        return threshold + self.attempt_cap * self.repoll_interval_s


_TEN_YEARS_S = 10 * 365 * 86400.0
_POSITIVE = ("scan_interval_s", "repoll_interval_s", "attempt_cap", "batch_size",
             "concurrency", "heartbeat_timeout_s", "legacy_threshold_s", "claim_lease_s",
             "host_left_after_s")


def _check_positive(c: ReconcileConfig) -> None:
    for name in _POSITIVE:
        if getattr(c, name) <= 0:
            raise ConfigError(f"reconcile {name} must be positive, got {getattr(c, name)}")
    for name in ("url_buffer_s", "headroom_s"):
        if getattr(c, name) < 0:
            raise ConfigError(f"reconcile {name} must not be negative")
    if not 0 <= c.scan_jitter < 1:
        raise ConfigError(f"reconcile scan_jitter must be in [0, 1), got {c.scan_jitter}")
    if c.reserved_without_call_s and not (
            c.legacy_threshold_s <= c.reserved_without_call_s <= _TEN_YEARS_S):
        raise ConfigError(
            f"reconcile reserved_without_call_s ({c.reserved_without_call_s:g} s) must be at "
            f"least legacy_threshold_s ({c.legacy_threshold_s:g} s) and at most ten years, "
            "or 0 (never)")
    if c.outside_window_s and not 0 < c.outside_window_s <= _TEN_YEARS_S:
        raise ConfigError(
            f"reconcile outside_window_s ({c.outside_window_s:g} s) must be positive and at "
            "most ten years, or 0 (never)")
    if c.legacy_cutoff is not None and c.legacy_cutoff.tzinfo is None:
        raise ConfigError("reconcile legacy_cutoff needs a time zone (e.g. 2026-05-19T00:00:00Z)")


def _check_kinds(c: ReconcileConfig) -> None:
    unknown = [kind for kind in c.kinds if kind not in KINDS]
    if unknown:
        raise ConfigError(f"reconcile kinds names unknown provider_kind {unknown[0]!r} "
                          f"(known: {', '.join(sorted(KINDS))})")
    for kind, value in c.thresholds_s.items():
        if kind not in KINDS:
            raise ConfigError(f"reconcile threshold for unknown provider_kind {kind!r} "
                              f"(known: {', '.join(sorted(KINDS))})")
        if value <= 0:
            raise ConfigError(f"reconcile threshold for {kind} must be positive, got {value}")
    for kind in c.deployed:
        lifetime = KINDS[kind].result_url_lifetime_s
        if lifetime is not None and c.threshold_for(kind) >= lifetime - c.url_buffer_s:
            raise ConfigError(
                f"reconcile threshold for {kind} ({c.threshold_for(kind):g} s) must be below "
                f"its result-URL lifetime ({lifetime:g} s) minus the buffer "
                f"({c.url_buffer_s:g} s): a later recovery would find the result gone")


def _check_horizon(c: ReconcileConfig) -> None:
    longest, kind = max((c.threshold_for(kind), kind) for kind in c.deployed)
    budget = c.attempt_cap * c.repoll_interval_s
    if budget < longest + c.headroom_s:
        raise ConfigError(
            f"reconcile attempt_cap x repoll_interval_s ({c.attempt_cap} x "
            f"{c.repoll_interval_s:g} s = {budget:g} s) must leave {c.headroom_s:g} s of "
            f"headroom over the longest threshold ({longest:g} s, {kind})"
            + ("" if c.kinds else "; set kinds to the kinds this deployment runs to be "
               "bounded by those alone"))


register("reconcile", ReconcileConfig)


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None
                ) -> ReconcileConfig:
    """Defaults, then ``path``'s ``[reconcile]`` table, then ``env`` (pass ``os.environ``);
    validated (:func:`callwarden.config.load`)."""
    return load(ReconcileConfig, path=path, env=env or {}, prefix=ENV_PREFIX,
                section="reconcile", maps={"THRESHOLD": "thresholds_s"})
