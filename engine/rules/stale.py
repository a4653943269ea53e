"""The one staleness rule: when an open call looks abandoned (pure).

A call that has heartbeated is stale once its heartbeat is ``heartbeat_timeout_s`` old.
One that never heartbeated is stale once it is its threshold old, aged from
``provider_call_started_at`` against its kind's threshold (a kind this version does not know
gets ``legacy_threshold_s``); a row with no call start at all is aged from the host's
``started_at`` (else ``created_at``) against ``legacy_threshold_s``.

The same rule is written once more, in SQL, as ``callwarden_is_stale(...)`` (migration
0007), so the reconciler's claim, ``/metrics``, the dashboard and ``callwarden stats`` filter
rows by it in the database; :meth:`StaleRule.sql_params` gives that function its arguments
and a property test checks the two agree on every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

__all__ = ["StaleRule"]


class StaleRule(msgspec.Struct, frozen=True, kw_only=True):
    """``thresholds``: seconds per known kind; the rest as in the module docstring."""

    thresholds: Mapping[str, float]
    legacy_threshold_s: float
    heartbeat_timeout_s: float

    def threshold_for(self, kind: str | None, *, has_call: bool = True) -> float:
        """The age (seconds) after which a call of ``kind`` that never heartbeated is
        stale; ``has_call=False``: a row with no call start (the legacy rule)."""
        if not has_call or kind is None:
            return self.legacy_threshold_s
        return self.thresholds.get(kind, self.legacy_threshold_s)

    def aged_from(self, call_started_at: datetime | None, host_started_at: datetime | None,
                  created_at: datetime | None) -> datetime | None:
        """The time a call's age is counted from."""
        if call_started_at is not None:
            return call_started_at
        return host_started_at if host_started_at is not None else created_at

    def is_stale(self, *, now: datetime, kind: str | None, call_started_at: datetime | None,
                 heartbeat_at: datetime | None, host_started_at: datetime | None = None,
                 created_at: datetime | None = None) -> bool:
        """Whether a call with these columns looks abandoned at ``now``."""
        if heartbeat_at is not None:
            return now - heartbeat_at >= timedelta(seconds=self.heartbeat_timeout_s)
        since = self.aged_from(call_started_at, host_started_at, created_at)
        threshold = self.threshold_for(kind, has_call=call_started_at is not None)
        return since is not None and now - since >= timedelta(seconds=threshold)

    def sql_params(self, now: datetime) -> dict[str, Any]:
        """The named parameters every statement calling ``callwarden_is_stale`` takes:
        ``%(now)s``, ``%(stale_thresholds)s`` (JSON), ``%(stale_legacy_s)s``,
        ``%(stale_heartbeat_s)s``."""
        return {"now": now,
                "stale_thresholds": msgspec.json.encode(dict(self.thresholds)).decode(),
                "stale_legacy_s": self.legacy_threshold_s,
                "stale_heartbeat_s": self.heartbeat_timeout_s}
