"""Process counters any actor records into: Prometheus counters and the webhook latency
histogram in :data:`REGISTRY` (our own ``CollectorRegistry``, never the global default).

Importing this module hooks two observers into the store: every append of this process
is counted once, whoever made it (:func:`callwarden.database.write.observe`), and every
loop's database outage as it starts and ends (:func:`callwarden.database.outage.observe`).
The reconciler and the webhook receiver record their own outcomes with
:func:`record_reconcile` and :func:`record_webhook`; a worker or reconciler exposes the
registry on a port of its own with :func:`start_metrics_server`. The gauges read from the
database at scrape time are the service's (:mod:`callwarden.service.metrics`).

Metric names: ``callwarden_transitions_total{kind,event,actor}``,
``callwarden_settlements_total{kind,settlement}``,
``callwarden_reconcile_outcomes_total{kind,outcome}``,
``callwarden_webhook_deliveries_total{provider,outcome}``,
``callwarden_webhook_handling_seconds{provider}`` (histogram),
``callwarden_database_outages_total{role}``, ``callwarden_database_down_seconds{role}``,
``callwarden_database_outage_over_limit{role}``.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from callwarden.database.outage import Outage
from callwarden.database.outage import observe as observe_outages
from callwarden.database.write import AppendResult, observe

__all__ = [
    "REGISTRY",
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
    """Count a :func:`callwarden.database.write.append`/``transition`` result (nothing if
    it lost)."""
    if not result.ok or result.event is None:
        return
    p = result.projection
    settled = p.settlement if result.settlement == "settled" else None
    for event in result.events[:-1]:
        record_transition(p.provider_kind, type(event).__name__, event.actor, None)
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


observe(record_append)  # every append of this process is counted once, whoever made it
observe_outages(record_outage)  # every loop's outage, as it starts and ends
