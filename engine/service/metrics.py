"""Prometheus metrics: process counters (any process) and call gauges (the service).

Counters and the webhook latency histogram live in :data:`REGISTRY`, our own
``CollectorRegistry`` (never the global default). Any actor records into it through the
helpers (:func:`record_transition`, :func:`record_append`, :func:`record_reconcile`,
:func:`record_webhook`); a worker or reconciler exposes it on a port of its own with
:func:`start_metrics_server`. The gauges computed from the database (calls by kind and
state, recently ended calls, stale calls per kind, reservations left reserved on recently
ended calls) are read at scrape time by :class:`CallGauges`, which only the service runs:
N workers reporting the same global gauge would be N copies of one number.

Metric names: ``callwarden_transitions_total{kind,event,actor}``,
``callwarden_settlements_total{kind,settlement}``,
``callwarden_reconcile_outcomes_total{kind,outcome}``,
``callwarden_webhook_deliveries_total{provider,outcome}``,
``callwarden_webhook_handling_seconds{provider}`` (histogram), and at scrape time
``callwarden_calls{kind,state}`` (open calls), ``callwarden_calls_ended_recent{kind,state}``
(calls that ended in the last ``recent_window_s``), ``callwarden_calls_stale{kind}``,
``callwarden_reservations_leaked_recent{kind}``, ``callwarden_jobs_without_call``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from callwarden.reconciler.stale import StaleRule
from callwarden.store.db import Conn
from callwarden.store.outage import Outage
from callwarden.store.outage import observe as observe_outages
from callwarden.store.write import AppendResult, execute, observe

__all__ = [
    "REGISTRY",
    "CallGauges",
    "exposition",
    "record_append",
    "record_outage",
    "record_reconcile",
    "record_transition",
    "record_webhook",
    "start_metrics_server",
]

REGISTRY = CollectorRegistry(auto_describe=True)

TRANSITIONS = Counter("callwarden_transitions", "Events appended by this process",
                      ["kind", "event", "actor"], registry=REGISTRY)
SETTLEMENTS = Counter("callwarden_settlements", "Reservations settled by this process",
                      ["kind", "settlement"], registry=REGISTRY)
RECONCILE = Counter("callwarden_reconcile_outcomes", "Reconcile outcomes by kind",
                    ["kind", "outcome"], registry=REGISTRY)
WEBHOOKS = Counter("callwarden_webhook_deliveries", "Webhook deliveries by result",
                   ["provider", "outcome"], registry=REGISTRY)
WEBHOOK_SECONDS = Histogram(
    "callwarden_webhook_handling_seconds", "Time to answer a webhook delivery",
    ["provider"], registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))


OUTAGES = Counter("callwarden_database_outages", "Database outages this process's loops "
                  "rode through (counted when each started)", ["role"], registry=REGISTRY)
DB_DOWN = Gauge("callwarden_database_down_seconds", "How long the database has been "
                "unreachable for this process's loops (0: reachable)", ["role"],
                registry=REGISTRY)
DB_OVER_LIMIT = Gauge("callwarden_database_outage_over_limit", "1 while an outage has "
                      "lasted longer than its limit (Outage.limit_s)", ["role"],
                      registry=REGISTRY)
_LIVE: dict[str, set[Outage]] = {}


def record_outage(outage: Outage, started: bool) -> None:
    """Count an outage when it starts; keep the gauges of its role live until it ends."""
    role = outage.what.split(" ", 1)[0] or "unknown"
    live = _LIVE.setdefault(role, set())
    if started:
        OUTAGES.labels(role).inc()
        live.add(outage)
        DB_DOWN.labels(role).set_function(
            lambda: max((o.down_for_s for o in live), default=0.0))
        DB_OVER_LIMIT.labels(role).set_function(
            lambda: float(any(o.over_limit for o in live)))
    else:
        live.discard(outage)


def _role(actor: str) -> str:
    """``worker:3f9c...`` -> ``worker``: bounded label values."""
    return actor.split(":", 1)[0] or "unknown"


def record_transition(kind: str | None, event: str, actor: str,
                      settlement: str | None = None) -> None:
    """Count one appended event (and the settlement it made, if any)."""
    TRANSITIONS.labels(kind or "-", event, _role(actor)).inc()
    if settlement is not None:
        SETTLEMENTS.labels(kind or "-", settlement).inc()


def record_append(result: AppendResult) -> None:
    """Count an :func:`callwarden.store.write.append`/``transition`` result (nothing if it lost)."""
    if not result.ok or result.event is None:
        return
    p = result.projection
    settled = p.settlement if result.settlement == "settled" else None
    record_transition(p.provider_kind, type(result.event).__name__, result.event.actor,
                      settled)


def record_reconcile(kind: str | None, outcome: str) -> None:
    """For the reconciler: one call handled with ``outcome`` (polled, finalized, swept...)."""
    RECONCILE.labels(kind or "-", outcome).inc()


def record_webhook(provider: str, outcome: str, seconds: float) -> None:
    WEBHOOKS.labels(provider, outcome).inc()
    WEBHOOK_SECONDS.labels(provider).observe(seconds)


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer, int]:
    """Serve :data:`REGISTRY` at ``http://addr:port/metrics`` from a daemon thread (for
    worker and reconciler processes); returns the server and the bound port (``port=0``
    picks a free one). Stop it with ``server.shutdown()``."""
    server, _thread = start_http_server(port, addr, registry=REGISTRY)
    assert isinstance(_thread, threading.Thread)
    return server, int(server.server_port)


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
    write path), and the host's jobs waiting without a call with credits reserved (older
    than the legacy threshold, newer than the legacy cutoff: never swept, so reported)."""

    def __init__(self, stale: StaleRule, *, recent_window_s: float = 3600.0,
                 legacy_cutoff: datetime | None = None) -> None:
        self.stale, self.recent_window_s = stale, recent_window_s
        self.legacy_cutoff = legacy_cutoff

    async def families(self, conn: Conn, now: datetime) -> list[Metric]:
        open_rows = await execute(conn, "metrics_open_calls", {})
        since = now - timedelta(seconds=self.recent_window_s)
        ended = await execute(conn, "metrics_recent_terminal", {"since": since})
        leaked = await execute(conn, "metrics_leaked_reservations", {"since": since})
        stale = await execute(conn, "metrics_stale_calls", self.stale.sql_params(now))
        waiting = await execute(conn, "audit_stats_jobs_without_call", {
            "older_than": now - timedelta(seconds=self.stale.legacy_threshold_s),
            "legacy_cutoff": self.legacy_cutoff})
        return [
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
        ]

    def _per_kind(self, rows: Iterable[Mapping[str, object]], column: str) -> Iterator[
            tuple[list[str], float]]:
        """One sample per known kind (0 when no row names it), and per other kind a row names."""
        found = {str(r["kind"]): float(str(r[column])) for r in rows}
        for kind in sorted(set(self.stale.thresholds) | set(found)):
            yield [kind], found.get(kind, 0.0)


def exposition(extra: list[Metric] | None = None) -> bytes:
    """The text exposition of :data:`REGISTRY` plus ``extra`` families."""
    out = generate_latest(REGISTRY)
    if extra:
        snapshot = CollectorRegistry(auto_describe=False)
        snapshot.register(_Snapshot(extra))
        out += generate_latest(snapshot)
    return out


observe(record_append)  # every append of this process is counted once, whoever made it
observe_outages(record_outage)  # every loop's outage, as it starts and ends
