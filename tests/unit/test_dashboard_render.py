"""The dashboard's pure halves: the duration formatter, the SVG charts, the call list's
filters and cursor, the job story's gap layout and provider links, the overview's Limits
card, and the escaping of every value they show."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta
from html import escape
from xml.etree import ElementTree

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.projections.timeline import TimelineRow
from callwarden.reconciler.config import ReconcileConfig
from callwarden.replay.audit import AuditReport
from callwarden.service import charts
from callwarden.service.dashboard.calls import (
    BadFilter,
    Filters,
    calls_page,
    encode_cursor,
    ilike_pattern,
    parse_cursor,
    parse_filters,
)
from callwarden.service.dashboard.format import credits, duration
from callwarden.service.dashboard.links import provider_task_url
from callwarden.service.dashboard.overview import WINDOWS, Overview, overview
from callwarden.service.dashboard.rollup import latency_rows, percentile
from callwarden.service.dashboard.story import job_page
from callwarden.service.dashboard.timeline import gap_layout, lanes_svg

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EVIL = '<script>alert("x")</script>&'


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.0, "0 ms"), (0.35, "350 ms"), (0.9996, "1.0 s"), (6.930969, "6.9 s"),
    (9.96, "10 s"), (42.4, "42 s"), (59.6, "1 min"), (60, "1 min"), (125, "2 min 5 s"),
    (3599.6, "1 h"), (10_860, "3 h 1 min"), (86_400 + 7200, "1 d 2 h"), (-6.93, "-6.9 s")])
def test_durations_read_as_people_say_them(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@given(st.floats(min_value=0, max_value=10**8, allow_nan=False))
def test_a_duration_is_a_number_and_a_unit_or_two(seconds: float) -> None:
    """Invariant: every non-negative duration formats as one or two "<int or one-decimal
    number> <unit>" parts, with no raw float digits."""
    assert re.fullmatch(r"\d+(\.\d)? (ms|s|min|h|d)( \d+ (s|min|h))?", duration(seconds))


def test_credits_drop_float_noise() -> None:
    assert [credits(v) for v in (4.0, 2.5, 0.125, 0.30000000000000004, None)] == [
        "4", "2.5", "0.125", "0.3", "-"]


def parse_svg(markup: str) -> ElementTree.Element:
    return ElementTree.fromstring(markup[:markup.index("</svg>") + 6])


def test_stacked_bars_are_an_accessible_svg_with_tooltips_and_axis_labels() -> None:
    out = charts.stacked_bars(f"calls {EVIL}", ["12:00", "12:05", EVIL],
                              [("completed", [3, 0, 1]), (EVIL, [1, 2, 0])])
    svg = parse_svg(out)  # well-formed XML: every value escaped
    assert (svg.get("role"), svg.get("aria-label")) == ("img", f"calls {EVIL}")
    ns = "{http://www.w3.org/2000/svg}"
    tips = [t.text for t in svg.iter(f"{ns}title")]
    assert tips[0] == f"calls {EVIL}"
    assert "12:00 completed: 3" in tips
    assert f"12:05 {EVIL}: 2" in tips
    assert len(svg.findall(f"{ns}rect")) == 4  # zero values draw nothing
    ticks = [t.text for t in svg.iter(f"{ns}text")]
    assert "5" in ticks
    assert "0" in ticks
    assert "12:00" in ticks
    assert "<script>" not in out


def test_lines_and_hbars_draw_every_value() -> None:
    ns = "{http://www.w3.org/2000/svg}"
    svg = parse_svg(charts.lines("credits", ["a", "b"], [("committed", [1.5, 0]),
                                                         ("refunded", [0, 4])]))
    assert len(svg.findall(f"{ns}polyline")) == 2
    assert len(svg.findall(f"{ns}circle")) == 4
    bars = parse_svg(charts.hbars("who", [("worker", 3), (EVIL, 1)]))
    assert [t.text for t in bars.iter(f"{ns}title")][1:] == ["worker: 3", f"{EVIL}: 1"]


@pytest.mark.parametrize(("value", "top"), [(0, 1), (0.3, 1), (0.03, 0.1), (3, 5),
                                            (7, 10), (10, 10), (11, 20), (4321, 5000)])
def test_axis_maxima_are_round(value: float, top: float) -> None:
    assert charts.nice_max(value) == pytest.approx(top)


def test_error_text_is_matched_literally() -> None:
    assert ilike_pattern("100%_used\\") == "%100\\%\\_used\\\\%"


def test_filters_come_from_the_query_string_and_refuse_bad_values() -> None:
    f = parse_filters({"kind": "kie-veo", "state": "failed", "actor": "admin",
                       "from": "2026-12-01T10:00", "error": " quota "})
    assert (f.kind, f.state, f.actor, f.error) == ("kie-veo", "failed", "admin", "quota")
    assert f.start == datetime(2026, 12, 1, 10, tzinfo=UTC)
    for bad in ({"state": "nope"}, {"actor": "robot"}, {"from": "yesterday"},
                {"cursor": "garbage"}):
        with pytest.raises(BadFilter):
            parse_filters(bad)


def test_the_cursor_round_trips_and_the_next_link_keeps_the_filters() -> None:
    job = uuid.uuid4()
    assert parse_cursor(encode_cursor(T0, job)) == (T0, job)
    rows = [{"id": uuid.uuid4(), "provider_kind": "kie-veo", "call_state": "failed",
             "ended_by": "worker", "provider_task_id": EVIL, "error": EVIL,
             "started_at": T0 - timedelta(seconds=i), "finished_at": T0}
            for i in range(3)]
    page = calls_page(Filters(kind="kie-veo"), rows, limit=2)
    assert page.count("<tr>") == 3  # header and two rows: the third says "more"
    link = re.search(r'href="/jobs\?([^"]+)" *>Next page', page.replace('rel="next" ', ""))
    assert link is not None
    query = link[1].replace("&amp;", "&")
    assert "kind=kie-veo" in query
    assert "cursor=" in query
    assert "offset" not in query
    assert EVIL not in page
    assert "&lt;script&gt;" in page


def test_huge_gaps_are_capped_and_the_rest_kept_to_scale() -> None:
    assert gap_layout([]) == ([], None)
    assert gap_layout([0.5, 1.0]) == ([0.5, 1.0], None)
    drawn, cap = gap_layout([1.0, 2.0, 3600.0])
    assert cap == 8.0
    assert drawn == [1.0, 2.0, 8.0]


def row(seq: int, at: datetime, actor: str, type_: str = "TaskCreated") -> TimelineRow:
    return TimelineRow(seq=seq, type=type_, at=at, since_previous_s=None, actor=actor,
                       state_before="created", state_after="polling", task_id=EVIL,
                       attempts=0, error=EVIL, detail=None)


def test_the_story_has_a_lane_per_actor_and_labels_a_shortened_gap() -> None:
    rows = [row(1, T0, "worker:a"), row(2, T0 + timedelta(seconds=2), "worker:a"),
            row(3, T0 + timedelta(hours=3, seconds=2), EVIL)]
    rows = [rows[0], *(msgspec.structs.replace(r, since_previous_s=(
        r.at - prev.at).total_seconds()) for prev, r in itertools.pairwise(rows))]
    svg = lanes_svg(rows)
    parse_svg(svg)
    assert "3 h" in svg
    assert "shortened" in svg
    assert svg.count('class="lane"') == 2
    report = AuditReport(job_id=str(uuid.uuid4()), status="processing", call_state="polling",
                         call_version=3, provider_kind="replicate-prediction",
                         timeline=rows, reservations=[])
    page = job_page(report, [], [{"seq": 1, "type": EVIL, "version": 1, "actor": EVIL,
                                  "payload": '{"k": "<b>"}', "recorded_at": T0}], admin=True)
    assert "<script>" not in page
    assert "<b>" not in page
    assert 'href="https://replicate.com/p/%3Cscript%3E' in page
    assert 'data-action="force-fail"' in page


def test_only_kinds_with_a_public_task_page_get_a_link() -> None:
    assert provider_task_url("replicate-prediction", "abc") == "https://replicate.com/p/abc"
    assert provider_task_url("kie-standard", "abc") is None
    assert provider_task_url("replicate-prediction", None) is None


def test_the_overview_shows_thresholds_buckets_and_escapes() -> None:
    w = WINDOWS["hour"]
    starts = w.starts(T0)
    assert len(starts) == 12
    assert starts[-1] == T0
    assert starts[1] - starts[0] == w.bucket
    o = Overview(
        now=T0, window=w, stale_rule=ReconcileConfig().stale,
        open_calls=[{"kind": "kie-standard", "state": "polling", "calls": 4}],
        stale_counts=[{"kind": "kie-standard", "stale": 1}],
        terminal=[{"bucket": starts[-1], "type": "Completed", "actor": "worker:a", "calls": 3},
                  {"bucket": starts[-1], "type": "Completed", "actor": "worker:b", "calls": 2},
                  {"bucket": starts[0], "type": "Cancelled", "actor": EVIL, "calls": 1}],
        latency=[{"kind": "kie-standard", "calls": 5, "pcts": [6.930969, 125.0]}],
        settled=[{"bucket": starts[-1], "committed": 8, "released": 2, "refunded": 0}],
        stale=[], exhausted=[], recent=[])
    html = overview(o)
    assert "worker: 5" in html  # roles: the actor's prefix, summed
    assert "10 min" in html  # kie-standard's threshold
    assert "6.9 s" in html
    assert "2 min 5 s" in html
    assert "6.930969" not in html
    assert html.count('role="img"') == 3
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def _overview_with(limits: list[dict[str, object]]) -> str:
    return overview(Overview(
        now=T0, window=WINDOWS["hour"], stale_rule=ReconcileConfig().stale, open_calls=[],
        stale_counts=[], terminal=[], latency=[], settled=[], stale=[], exhausted=[],
        recent=[], limits=limits))


def test_the_limits_card_shows_each_cap_and_a_slow_down_escaped() -> None:
    """The overview's Limits card is absent without an account; shown, it escapes the
    account and the kinds (a host may write the rows by SQL), reads an account's calls in
    flight over its cap, the creates per window, and for an account the provider's 429s
    slowed the cap it admits now (floored, at least 1), the rate to two decimals and the
    pause left; an account with no in-flight cap says so rather than showing a cap."""
    assert 'id="limits-h"' not in _overview_with([])
    base = {"tenant_in_flight": None, "creates": None, "per_s": None, "wait_s": 2.0,
            "rate_factor": 1.0, "paused_s": 0.0}
    html = _overview_with([
        {**base, "account": EVIL, "kinds": [EVIL, "kie-veo"], "in_flight": 5,
         "tenant_in_flight": 2, "creates": 20, "per_s": 10.0, "open_calls": 4},
        {**base, "account": "slowed", "kinds": ["kie-suno"], "in_flight": 5,
         "rate_factor": 0.25, "paused_s": 12.4, "open_calls": 3},
        {**base, "account": "rate-only", "kinds": ["replicate-prediction"],
         "in_flight": None, "creates": 2, "per_s": 60.0, "open_calls": 7}])
    card = html[html.index('id="limits-h"'):]
    card = card[:card.index("</section>")]
    assert "Limits: 3 provider account(s)" in card
    assert "<script>" not in card
    assert f"<td>{escape(EVIL)}</td>" in card
    assert f'<td class="long">{escape(EVIL)}, kie-veo</td>' in card
    for cell in ("4 / 5", "20 per 10 s", "full", "3 / 1 of 5",
                 "slowed to \u00d70.25 by the provider&#x27;s 429s", "12 s left",
                 "7 (no cap)", "2 per 1 min"):
        assert f"<td>{cell}</td>" in card, (cell, card)


def test_percentiles_interpolate_as_percentile_cont() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(v) for v in range(101)], 0.95) == pytest.approx(95.0)
    rows = [{"kind": "b", "seconds": [3]}, {"kind": "a", "seconds": [1]},
            {"kind": "b", "seconds": [1]}]
    assert latency_rows(rows) == [{"kind": "a", "calls": 1, "pcts": [1.0, 1.0]},
                                  {"kind": "b", "calls": 2, "pcts": [2.0, 2.9]}]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 5e-324, -3.0])
def test_a_value_a_chart_cannot_scale_never_hangs_or_breaks_the_svg(value: float) -> None:
    """A host may store 'Infinity' in a numeric column (and a tiny or negative value is
    possible): the axis is 1, the value drawn as 0 (its label still says what it is), the
    SVG still well-formed with finite coordinates (found by
    review: ``nice_max(inf)`` looped forever and blocked the service's event loop)."""
    assert charts.nice_max(value) == 1.0
    for svg in (charts.stacked_bars("c", ["a", "b"], [("s", [value, 2.0])]),
                charts.lines("c", ["a", "b"], [("s", [value, 2.0])]),
                charts.hbars("c", [("w", value), ("x", 2.0)])):
        ElementTree.fromstring(svg.split("<ul", 1)[0])
        coordinates = re.findall(r'(?:x|y|width|height|points|cx|cy)="([^"]*)"', svg)
        assert not [c for c in coordinates if "inf" in c.lower() or "nan" in c.lower()]


@pytest.mark.parametrize("query", [
    {"from": "0001-01-01T00:00+01:00"}, {"to": "9999-12-31T23:59:59-01:00"},
    {"cursor": f"0001-01-01T00:00+01:00_{uuid.UUID(int=1)}"}, {"error": "a\x00b"},
    {"kind": "\x00"},
])
def test_a_time_out_of_the_calendar_or_a_nul_is_a_bad_filter(query: dict[str, str]) -> None:
    """What would raise OverflowError while rendering, or reach Postgres as a NUL (a
    DataError), is refused as a bad filter (a 400), not a 500."""
    with pytest.raises(BadFilter):
        parse_filters(query)
