"""The service's call gauges, read from the database at scrape time, and the text
exposition of ``/metrics`` (the process counters of :mod:`callwarden.observe.metrics`
plus these gauges).

:class:`CallGauges`: calls by kind and state, recently ended calls, stale calls per kind,
reservations left reserved on recently ended calls, jobs waiting without a call. Only the
service runs it: N workers reporting the same global gauge would be N copies of one
number. Names: ``callwarden_calls{kind,state}`` (open calls),
``callwarden_calls_ended_recent{kind,state}`` (calls that ended in the last
``recent_window_s``), ``callwarden_calls_stale{kind}``,
``callwarden_reservations_leaked_recent{kind}``, ``callwarden_jobs_without_call``,
``callwarden_reservations_host_left`` (reservations still held on jobs the host ended
longer than ``host_left_after_s`` ago: its commit or refund never came),
``callwarden_jobs_waiting{account}`` and ``callwarden_waiting_oldest_seconds{account}``
(jobs waiting now for a provider account's slot, and how long the oldest has waited: one
sample per account of ``callwarden.limits``, 0 when none waits; docs/admission.md).

No count of admission refusals is exported: the ``refusals`` of ``callwarden.waiting``
live only while their job waits (the start that admits it deletes its row), so their sum
falls when a job starts and is no counter; a refusal writes nothing else to count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.observe.metrics import REGISTRY
from callwarden.rules.stale import StaleRule

__all__ = ["REGISTRY", "CallGauges", "exposition"]


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _family(name: str, doc: str, labels: list[str],
            rows: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        g.add_metric(values, value)
    return g


class CallGauges:
    """Gauges read from the database at scrape time: open calls by kind and state (partial
    index), calls ended in the last ``recent_window_s`` (events' time index), stale calls
    per kind (by the reconciler's ``stale`` rule), reservations still reserved on calls
    that ended in that window (``verify``'s rule: 0 unless something settled around the
    write path), the host's jobs waiting without a call with credits reserved (older
    than the legacy threshold, newer than the legacy cutoff: never swept, so reported),
    and per provider account the jobs waiting for its slot and the oldest one's wait."""

    def __init__(self, stale: StaleRule, *, recent_window_s: float = 3600.0,
                 legacy_cutoff: datetime | None = None,
                 host_left_after_s: float = 300.0) -> None:
        self.stale, self.recent_window_s = stale, recent_window_s
        self.legacy_cutoff, self.host_left_after_s = legacy_cutoff, host_left_after_s

    async def families(self, conn: Conn, now: datetime) -> list[Metric]:
        open_rows = await execute(conn, "metrics_open_calls", {})
        since = now - timedelta(seconds=self.recent_window_s)
        ended = await execute(conn, "metrics_recent_terminal", {"since": since})
        leaked = await execute(conn, "metrics_leaked_reservations", {"since": since})
        stale = await execute(conn, "metrics_stale_calls", self.stale.sql_params(now))
        waiting = await execute(conn, "audit_stats_jobs_without_call", {
            "older_than": now - timedelta(seconds=self.stale.legacy_threshold_s),
            "legacy_cutoff": self.legacy_cutoff})
        left = await execute(conn, "audit_host_left", {
            "before": now - timedelta(seconds=self.host_left_after_s)})
        slots = await execute(conn, "metrics_waiting", {})
        return [
            _family("callwarden_reservations_host_left",
                    f"Reservations still reserved on jobs the host ended over "
                    f"{self.host_left_after_s:g} s ago (its commit or refund never came)",
                    [], [([], float(left[0]["reservations"]))]),
            _family("callwarden_calls", "Open calls by kind and state", ["kind", "state"],
                    (([r["kind"], r["state"]], r["calls"]) for r in open_rows)),
            _family("callwarden_calls_ended_recent",
                    f"Calls that ended in the last {self.recent_window_s:g} s",
                    ["kind", "state"], (([r["kind"], r["state"]], r["calls"]) for r in ended)),
            _family("callwarden_calls_stale", "Open calls past their kind's stale threshold",
                    ["kind"], self._per_kind(stale, "stale")),
            _family("callwarden_reservations_leaked_recent",
                    f"Reservations still reserved on calls that ended in the last "
                    f"{self.recent_window_s:g} s, not the host's to settle (should be 0)",
                    ["kind"], self._per_kind(leaked, "reservations")),
            _family("callwarden_jobs_without_call",
                    "In-flight jobs with credits reserved and no call, created after the "
                    "legacy cutoff (the host's: never swept)", [],
                    [([], float(waiting[0]["n"]))]),
            _family("callwarden_jobs_waiting",
                    "Jobs waiting now for a slot of a provider account (a start its limits "
                    "refused: no call yet)", ["account"],
                    (([r["account"]], float(r["jobs"])) for r in slots)),
            _family("callwarden_waiting_oldest_seconds",
                    "How long the account's longest-waiting job has waited (0: none waits)",
                    ["account"], (([r["account"]], _waited(r["oldest"], now)) for r in slots)),
        ]

    def _per_kind(self, rows: Iterable[Mapping[str, object]], column: str) -> Iterator[
            tuple[list[str], float]]:
        """One sample per known kind (0 when no row names it), and per other kind a row names."""
        found = {str(r["kind"]): float(str(r[column])) for r in rows}
        for kind in sorted(set(self.stale.thresholds) | set(found)):
            yield [kind], found.get(kind, 0.0)


def _waited(since: datetime | None, now: datetime) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())


def exposition(extra: list[Metric] | None = None) -> bytes:
    """The text exposition of :data:`REGISTRY` plus ``extra`` families."""
    out = generate_latest(REGISTRY)
    if extra:
        snapshot = CollectorRegistry(auto_describe=False)
        snapshot.register(_Snapshot(extra))
        out += generate_latest(snapshot)
    return out
