"""OpenTelemetry spans (the ``otel`` extra): one ``callwarden.transition`` span per event the
log holds and one ``callwarden.provider.request`` span per HTTP attempt, children of the
host's current span; a fenced-out write and a refused one are marked. Without
``opentelemetry`` nothing is hooked and nothing of it is imported.

The spans go to an SDK ``TracerProvider`` with an ``InMemorySpanExporter`` handed to
``callwarden.observe.tracing.use`` for the test (the process-wide provider can be set only
once; OpenTelemetry's own test utilities reset its private globals to get around that,
which a provider passed explicitly does not need). The global provider is exercised in a
fresh process instead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.states import InvalidTransition
from callwarden.events.types import CallStarted, Completed
from callwarden.observe import tracing
from callwarden.observe.tracing import REQUEST_SPAN, TRANSITION_SPAN
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.simulator.model import Fault
from tests.integration.conftest import MakeRunner

ROOT = Path(__file__).parents[2]
KIE_REQ: dict[str, Any] = {"model": "nano-banana-pro", "input": {"prompt": "a cat"}}


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield provider, exporter
    finally:
        tracing.use()  # back to the global provider
        provider.shutdown()


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


async def test_a_call_is_traced_under_the_hosts_span(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator,
        provider: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    sdk, exporter = provider
    job = await create_job(conn)
    sim.sim.faults.arm("kie", "poll", Fault(kind="http_status", status=503, times=1))
    with sdk.get_tracer("host").start_as_current_span("host.handle") as host:
        out = await make_runner().run(job, "kie-standard", KIE_REQ)
    assert out.result == "completed"
    spans = exporter.get_finished_spans()
    host_ctx = host.get_span_context()

    # One transition span per append, in order, covering every event of the log once
    # (the success is appended with its claim: this runner has a callback URL), with its
    # attributes.
    events = await load_events(conn, job)
    transitions = _named(spans, TRANSITION_SPAN)
    counts = [(s.attributes or {}).get("callwarden.events") for s in transitions]
    assert counts == [1, 1, 2, 1]
    ends = [sum(cast(list[int], counts)[:i + 1]) for i in range(len(counts))]
    assert [(s.attributes or {}).get("callwarden.seq") for s in transitions] == ends
    assert ends[-1] == len(events)
    runs = [events[end - n:end] for n, end in zip(cast(list[int], counts), ends, strict=True)]
    for span, run in zip(transitions, runs, strict=True):
        attrs = dict(span.attributes or {})
        event = run[-1]
        assert attrs["callwarden.event"] == "+".join(type(e).__name__ for e in run)
        assert attrs["callwarden.actor"] == event.actor
        assert (attrs["callwarden.job_id"], attrs["callwarden.kind"]) == (str(job),
                                                                          "kie-standard")
        assert (attrs["callwarden.ok"], attrs["callwarden.outcome"]) == (True, "appended")
        assert attrs["callwarden.settlement"] == (
            "committed" if type(event) is Completed else "none")
        assert span.parent is not None
        assert span.parent.span_id == host_ctx.span_id
        assert span.context is not None
        assert span.context.trace_id == host_ctx.trace_id

    # One request span per HTTP attempt the simulator saw: create, a 503 poll retried.
    requests = _named(spans, REQUEST_SPAN)
    assert len(requests) == sim.sim.journal.count("kie")
    seen = [(dict(s.attributes or {})["http.request.method"],
             dict(s.attributes or {})["http.response.status_code"],
             dict(s.attributes or {})["callwarden.attempt"]) for s in requests]
    assert seen[0] == ("POST", 200, 1)  # the create
    assert seen[1:3] == [("GET", 503, 1), ("GET", 200, 2)]  # a poll, retried once
    for span in requests:
        attrs = dict(span.attributes or {})
        assert span.kind is SpanKind.CLIENT
        assert (attrs["callwarden.provider"], attrs["callwarden.job_id"],
                attrs["callwarden.kind"]) == ("kie", str(job), "kie-standard")
        assert str(attrs["url.full"]).startswith("http://127.0.0.1:")
        assert span.parent is not None
        assert span.parent.span_id == host_ctx.span_id
    failed = requests[1]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert all(s.status.status_code is StatusCode.UNSET for s in requests if s is not failed)


async def test_a_fenced_out_write_and_a_refused_one_are_marked(
        conn: Conn, provider: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    _, exporter = provider
    job = await create_job(conn)
    read = await load(conn, job)
    now = datetime.now(UTC)
    assert (await append(conn, job, read, CallStarted(at=now, actor="worker:a",
                                                      kind="kie-standard"))).ok
    lost = await append(conn, job, read, CallStarted(at=now, actor="worker:b",
                                                     kind="kie-standard"))
    assert not lost.ok
    with pytest.raises(InvalidTransition):
        await append(conn, job, lost.projection, Completed(at=now, actor="worker:b"))

    won, fenced, refused = _named(exporter.get_finished_spans(), TRANSITION_SPAN)
    assert dict(won.attributes or {})["callwarden.outcome"] == "appended"
    attrs = dict(fenced.attributes or {})
    assert (attrs["callwarden.ok"], attrs["callwarden.outcome"], attrs["callwarden.actor"],
            attrs["callwarden.settlement"]) == (False, "fenced_out", "worker:b", "none")
    assert "callwarden.seq" not in attrs
    assert fenced.status.status_code is StatusCode.UNSET  # a lost race is not an error
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.events[0].name == "exception"
    assert dict(refused.events[0].attributes or {})["exception.type"] == (
        "callwarden.events.states.InvalidTransition")
    assert "callwarden.outcome" not in dict(refused.attributes or {})


async def test_a_span_not_sampled_costs_a_check_and_records_nothing(conn: Conn) -> None:
    exporter = InMemorySpanExporter()
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    unsampled.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(unsampled)
    try:
        job = await create_job(conn)
        assert (await append(conn, job, await load(conn, job), CallStarted(
            at=datetime.now(UTC), actor="worker:a", kind="kie-standard"))).ok
        with pytest.raises(InvalidTransition):  # still raised through the hook
            await append(conn, job, await load(conn, job), CallStarted(
                at=datetime.now(UTC), actor="worker:a", kind="kie-standard"))
    finally:
        tracing.use()
        unsampled.shutdown()
    assert exporter.get_finished_spans() == ()


def _python(db_url: str, *parts: str) -> str:
    code = "\n".join(textwrap.dedent(part) for part in parts)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CW_TEST_DB": db_url})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


APPEND = """
    import asyncio, os
    from datetime import UTC, datetime
    from callwarden.database.db import connect
    from callwarden.database.jobs import create_job
    from callwarden.database.write import append, load
    from callwarden.events.types import CallStarted

    async def one_append():
        async with await connect(os.environ["CW_TEST_DB"]) as conn:
            job = await create_job(conn)
            r = await append(conn, job, await load(conn, job), CallStarted(
                at=datetime.now(UTC), actor="worker:x", kind="kie-standard"))
            assert r.ok
"""


def test_without_opentelemetry_nothing_is_hooked_or_imported(db_url: str) -> None:
    out = _python(db_url, """
        import sys

        class Hide:  # opentelemetry is not installed, as far as this process can tell
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {name!r}")

        sys.meta_path.insert(0, Hide())
        import callwarden.database.write, callwarden.providers.transport
        import callwarden.calls.runner, callwarden.reconciler.loop, callwarden.service.webhooks
        from callwarden.observe import tracing
        """, APPEND, """
        asyncio.run(one_append())
        print(tracing.ENABLED, callwarden.database.write._trace,
              callwarden.providers.transport._trace,
              sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """)
    assert out == "False None None []"


def test_a_global_provider_set_after_import_gets_the_spans(db_url: str) -> None:
    """The host imports callwarden, then sets its provider (the usual order)."""
    out = _python(db_url, """
        import callwarden.calls.runner
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter)
        """, APPEND, """
        exporter = InMemorySpanExporter()
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(sdk)
        asyncio.run(one_append())
        print([(s.name, s.instrumentation_scope.name, s.attributes["callwarden.event"])
               for s in exporter.get_finished_spans()])
        """)
    assert out == "[('callwarden.transition', 'callwarden', 'CallStarted')]"
