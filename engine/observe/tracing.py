"""OpenTelemetry spans when the ``callwarden[otel]`` extra is installed (operations.md, "Traces").

Importing this module hooks two spans into the I/O edges, as :mod:`callwarden.observe.metrics`
hooks its counters: ``callwarden.provider.request`` around each HTTP attempt
(:func:`callwarden.providers.transport.trace_requests`) and ``callwarden.transition`` around each
append (:func:`callwarden.database.write.trace_appends`). Both are children of the current span
(the host's) and record the exception that escapes them; they come from the tracer
``callwarden`` of the global provider, or of the one given to :func:`use`. Without
``opentelemetry`` nothing is hooked: an append or a request checks one module attribute.
The actors import this module and name the job of their requests with :func:`call_context`.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from callwarden.database import write
from callwarden.database.write import AppendResult
from callwarden.events.types import Event
from callwarden.projections.fold import CallProjection
from callwarden.providers import transport
from callwarden.providers.raw import RawResponse

try:
    from opentelemetry import trace
except ImportError:  # the extra is absent: nothing is hooked, nothing is imported
    trace = None  # type: ignore[assignment]

__all__ = ["ENABLED", "REQUEST_SPAN", "TRANSITION_SPAN", "call_context", "use"]

ENABLED = trace is not None
REQUEST_SPAN = "callwarden.provider.request"
TRANSITION_SPAN = "callwarden.transition"

_CALL: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "callwarden_call", default=None)
_tracer: trace.Tracer | None = None


def use(provider: trace.TracerProvider | None = None) -> None:
    """Take spans from ``provider``'s tracer (``None``: the global provider's, the default;
    a host that sets its provider later is followed, as the API's proxy tracer does)."""
    global _tracer, _global
    if trace is not None:
        _tracer = (provider or trace).get_tracer("callwarden")
        _global = provider is None


@contextmanager
def call_context(job_id: uuid.UUID, kind: str) -> Iterator[None]:
    """The provider requests made inside are for ``job_id`` of ``kind`` (span attributes)."""
    token = _CALL.set((str(job_id), kind))
    try:
        yield
    finally:
        _CALL.reset(token)


def _ignore(_: object) -> None:
    pass


#: What a hook answers while :func:`_off`: one context, made once, that yields
#: :func:`_ignore` (a request and an append then build no generator of their own).
_NO_SPAN = nullcontext(_ignore)


_global = True  # spans come from the global provider (use() without one)


def _off() -> bool:
    """Spans from the global provider while no SDK is installed on it (the API's proxy or
    no-op provider) would be no-ops: build nothing (a happy call makes eight of them)."""
    return _global and isinstance(trace.get_tracer_provider(),
                                  (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _request(provider: str, method: str, url: str, attempt: int
             ) -> AbstractContextManager[Callable[[RawResponse], None]]:
    return _NO_SPAN if _off() else _request_span(provider, method, url, attempt)


@contextmanager
def _request_span(provider: str, method: str, url: str, attempt: int
                  ) -> Iterator[Callable[[RawResponse], None]]:
    assert _tracer is not None
    u = urlsplit(url)  # no credentials, no query string
    attrs: dict[str, Any] = {
        "callwarden.provider": provider, "callwarden.attempt": attempt,
        "http.request.method": method, "server.address": u.hostname or "",
        "url.full": urlunsplit((u.scheme, u.netloc.rpartition("@")[2], u.path, "", ""))}
    call = _CALL.get()
    if call is not None:
        attrs["callwarden.job_id"], attrs["callwarden.kind"] = call
    span = _tracer.start_span(REQUEST_SPAN, kind=trace.SpanKind.CLIENT, attributes=attrs)
    if not span.is_recording():  # the no-op provider, or not sampled: nothing to carry
        yield _ignore
        return
    with trace.use_span(span, end_on_exit=True):  # records the exception that escapes
        yield lambda raw: span.set_attribute("http.response.status_code", raw.status)


def _transition(job_id: uuid.UUID, current: CallProjection, events: Sequence[Event]
                ) -> AbstractContextManager[Callable[[AppendResult], None]]:
    return _NO_SPAN if _off() else _transition_span(job_id, current, events)


@contextmanager
def _transition_span(job_id: uuid.UUID, current: CallProjection, events: Sequence[Event]
                     ) -> Iterator[Callable[[AppendResult], None]]:
    """One span per append: one event, or a run (``callwarden.event`` names them joined
    by ``+``, ``callwarden.events`` counts them, ``callwarden.seq`` is the last one's)."""
    assert _tracer is not None
    attrs: dict[str, Any] = {
        "callwarden.job_id": str(job_id),
        "callwarden.event": "+".join(type(e).__name__ for e in events),
        "callwarden.events": len(events),
        "callwarden.actor": events[0].actor, "callwarden.expected_version": current.version}
    kind = current.provider_kind or getattr(events[0], "kind", None)
    if kind:
        attrs["callwarden.kind"] = kind
    span = _tracer.start_span(TRANSITION_SPAN, attributes=attrs)
    if not span.is_recording():
        yield _ignore
        return
    with trace.use_span(span, end_on_exit=True):

        def done(result: AppendResult) -> None:
            p = result.projection
            moved = p.settlement if result.ok and result.settlement == "settled" else None
            out: dict[str, Any] = {
                "callwarden.ok": result.ok, "callwarden.settlement": moved or "none",
                "callwarden.outcome": "appended" if result.ok else "fenced_out"}
            if result.ok:
                out["callwarden.seq"] = p.version
            if result.settlement is not None:
                out["callwarden.settlement_result"] = result.settlement
            if not kind and p.provider_kind:
                out["callwarden.kind"] = p.provider_kind
            span.set_attributes(out)

        yield done


if ENABLED:
    use()
    write.trace_appends(_transition)
    transport.trace_requests(_request)
