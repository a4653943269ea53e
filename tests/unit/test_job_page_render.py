"""The job page's pure half (issue 41, item 2): what went in and what came out, escaped;
no secret or token anywhere on it; markers that never overlap and lane labels with room;
the admin actions offered only when the service takes them and the call's state allows
them. The same page in a real browser: tests/acceptance/test_job_page_browser.py."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.events.states import TERMINAL, CallState
from callwarden.projections.timeline import TimelineRow
from callwarden.replay.audit import AuditReport
from callwarden.service.dashboard.redaction import redact_text, redact_value
from callwarden.service.dashboard.story import JobIO, job_page, legal_actions, safe_url
from callwarden.service.dashboard.timeline import MIN_STEP, lanes_svg

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EVIL = '<script>alert("x")</script>'
CALLBACK_TOKEN = "cbTok3nZQ9x8w7v6"
CALLBACK = f"https://hooks.example/webhooks/kie/{uuid.UUID(int=7)}/{CALLBACK_TOKEN}"
API_KEY = "sk-live-0123456789abcdefXYZ"
WEBHOOK_SECRET = "whsec_9f8e7d6c5b4a"
SIGNATURE = "X-Amz-Signature=deadbeefcafe1234"


def report(call_state: str | None, rows: list[TimelineRow] | None = None) -> AuditReport:
    return AuditReport(job_id=str(uuid.UUID(int=7)), status="processing",
                       call_state=call_state, call_version=3, provider_kind="kie-standard",
                       timeline=rows or [], reservations=[])


def row(seq: int, since: float | None, actor: str = "worker:a") -> TimelineRow:
    return TimelineRow(seq=seq, type="TaskCreated", at=T0 + timedelta(seconds=seq),
                       since_previous_s=since, actor=actor, state_before="created",
                       state_after="polling", task_id="t", attempts=0, error=None,
                       detail=None)


def secret_events() -> list[dict[str, object]]:
    """Stored events as a KIE answer and a host's request leave them: the raw answer
    echoes the request, callback URL (its token in the path) included, escaped and not."""
    raw = {"code": 200, "data": {"param": json.dumps({"callBackUrl": CALLBACK}),
                                 "callBackUrl": CALLBACK, "webhookSecret": WEBHOOK_SECRET,
                                 "resultUrls": [f"https://cdn.example/o.png?{SIGNATURE}"]},
           "headers": {"Authorization": f"Bearer {API_KEY}"}}
    return [
        {"seq": 1, "type": "CallStarted", "version": 1, "actor": "worker:a",
         "recorded_at": T0, "payload": json.dumps({"kind": "kie-standard",
                                                   "callback": CALLBACK})},
        {"seq": 2, "type": "UpstreamSucceeded", "version": 1, "actor": "webhook",
         "recorded_at": T0, "payload": json.dumps({"result": {"raw": raw}})},
        {"seq": 3, "type": "FinalizeFailed", "version": 1, "actor": "webhook",
         "recorded_at": T0, "payload": f'not json: {CALLBACK.replace("/", chr(92) + "/")} '
                                       f"api_key={API_KEY}"},
    ]


def test_the_page_shows_what_went_in_and_came_out_escaped() -> None:
    io = JobIO(
        input_data=json.dumps({"provider_kind": "kie-standard", "request": {
            "model": "nano", "input": {"prompt": f"a cat {EVIL}"}}}),
        output_data=json.dumps({"result_urls": ["https://cdn.example/a.png"]}),
        assets=[{"storage_key": "jobs/a.png", "url": "https://cdn.example/a.png",
                 "content_type": "image/png", "size_bytes": 2048},
                {"storage_key": "jobs/b.mp3", "url": "/media/b.mp3",
                 "content_type": "audio/mpeg", "size_bytes": 10},
                {"storage_key": "jobs/c.mp4", "url": "https://cdn.example/c.mp4",
                 "content_type": "video/mp4", "size_bytes": 3 << 20},
                {"storage_key": f"jobs/{EVIL}.bin", "url": "javascript:alert(1)",
                 "content_type": "application/octet-stream", "size_bytes": 1}])
    events = [{"seq": 1, "type": "Completed", "version": 1, "actor": "webhook",
               "recorded_at": T0, "payload": json.dumps({"text": f"said {EVIL}"})}]
    page = job_page(report("completed"), [], events, io=io)
    assert "<script>" not in page
    assert '<blockquote class="prompt">a cat &lt;script&gt;' in page
    assert '<img class="preview" src="https://cdn.example/a.png"' in page
    assert '<audio class="preview" controls preload="metadata" src="/media/b.mp3">' in page
    assert '<video class="preview" controls preload="metadata" src="https://cdn.example/c.mp4"' \
        in page
    assert '<a href="https://cdn.example/a.png"' in page
    assert 'href="javascript:' not in page
    assert 'src="javascript:' not in page
    assert "said &lt;script&gt;" in page  # the text result
    assert "result_urls" in page  # the stored result
    # near the top: before the timeline and the raw events
    assert page.index('class="io"') < page.index("<h2>Timeline</h2>")


def test_no_secret_or_token_reaches_the_page() -> None:
    io = JobIO(input_data=json.dumps({"request": {
        "prompt": "a cat", "callBackUrl": CALLBACK, "api_key": API_KEY}}),
        error_message=f"POST {CALLBACK} failed",
        assets=[{"storage_key": "a.png", "url": f"https://cdn.example/a.png?{SIGNATURE}",
                 "content_type": "image/png", "size_bytes": 1}])
    rows = [row(1, None), TimelineRow(
        seq=2, type="FinalizeFailed", at=T0, since_previous_s=0.0, actor="webhook",
        state_before="polling", state_after="polling", task_id="t", attempts=0,
        error=f"callback {CALLBACK}", detail=f"secret={WEBHOOK_SECRET}")]
    page = job_page(report("polling", rows), [], secret_events(), io=io, admin=True)
    for secret in (CALLBACK_TOKEN, API_KEY, WEBHOOK_SECRET, "deadbeefcafe1234"):
        assert secret not in page, secret
    assert "/webhooks/kie/" in page  # the URL is still shown, without its token
    assert "a cat" in page


def test_redaction_keeps_counts_and_plain_words() -> None:
    assert redact_value({"input_tokens": 12, "prompt": "a key to the city",
                         "storage_key": "a/b.png", "accessToken": "abc"}) == {
        "input_tokens": 12, "prompt": "a key to the city", "storage_key": "a/b.png",
        "accessToken": "[redacted]"}
    assert redact_text(CALLBACK).endswith("/webhooks/kie/" + str(uuid.UUID(int=7))
                                          + "/[redacted]")


def test_only_safe_urls_are_linked() -> None:
    assert safe_url("https://cdn.example/a.png") == "https://cdn.example/a.png"
    assert safe_url("/media/a.png") == "/media/a.png"
    for bad in ("javascript:alert(1)", "//evil.example/x", "https://u:p@h.example/x",
                f"https://h.example/x?{SIGNATURE}", 'https://h.example/"onerror=x'):
        assert safe_url(bad) is None, bad


@pytest.mark.parametrize(("state", "admin", "offered"), [
    ("polling", True, ["force-fail", "requeue-reconcile"]),
    ("upstream_succeeded", True, ["force-fail", "requeue-reconcile"]),
    ("completed", True, []), ("failed", True, []), ("cancelled", True, []),
    (None, True, ["force-fail"]),  # no call yet: it can be cancelled, not requeued
    ("polling", False, []),
])
def test_actions_are_offered_only_when_legal_and_enabled(
        state: str | None, admin: bool, offered: list[str]) -> None:
    page = job_page(report(state), [], [], admin=admin)
    assert re.findall(r'data-action="([\w-]+)"', page) == offered
    assert ('id="admin-token"' in page) == bool(offered)
    if not admin:
        assert "Disabled" in page
    assert legal_actions(state) == (offered if admin else legal_actions(state))


def positions(svg: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r'<circle [^>]*cx="([\d.]+)" cy="([\d.]+)"',
                                                       svg)]


@given(st.lists(st.one_of(st.just(0.0), st.floats(0, 10), st.floats(0, 86400)),
                min_size=1, max_size=60))
def test_markers_never_overlap_whatever_the_gaps(gaps: list[float]) -> None:
    rows = [row(1, None)] + [row(i + 2, g) for i, g in enumerate(gaps)]
    xs = [x for x, _ in positions(lanes_svg(rows))]
    assert all(b - a >= MIN_STEP - 0.01 for a, b in itertools.pairwise(xs))
    width = float(re.search(r'viewBox="0 0 ([\d.]+) ', lanes_svg(rows))[1])  # type: ignore[index]
    assert xs[-1] + 14 <= width


def test_a_long_lane_label_gets_room_or_is_cut_with_a_tooltip() -> None:
    long = "worker:acme-host-7f9c2b1d-east-1-pool-42"
    svg = lanes_svg([row(1, None, "reconciler:r1"), row(2, 1.0, long)])
    first_lane = float(re.search(r'<line class="lane" x1="([\d.]+)"', svg)[1])  # type: ignore[index]
    # room for the 24 characters shown at 12 units, and the full name in its tooltip
    assert first_lane >= 24 * 12 * 0.55
    assert f"<title>{long}</title>" in svg


@pytest.mark.parametrize("state", [None, *CallState])
def test_the_offered_actions_are_those_the_server_takes(state: CallState | None) -> None:
    """The server's force-fail cancels any call not yet ended; its requeue takes an open
    call only (``callwarden.service.operator``): the page offers exactly those."""
    offered = legal_actions(None if state is None else state.value)
    assert ("force-fail" in offered) == (state not in TERMINAL)
    assert ("requeue-reconcile" in offered) == (state is not None and state not in TERMINAL)
