"""Pure statistics helpers: windows, percentiles, recoveries and sweeps."""

from __future__ import annotations

from datetime import timedelta

import pytest

from callwarden.projections.stats import TerminalCount, parse_window, percentile, recoveries, sweeps


@pytest.mark.parametrize(("text", "expected"), [
    ("24h", timedelta(hours=24)), ("90m", timedelta(minutes=90)), ("30s", timedelta(seconds=30)),
    ("1d12h", timedelta(hours=36)), ("2w", timedelta(days=14)), ("0.5h", timedelta(minutes=30)),
])
def test_windows_parse(text: str, expected: timedelta) -> None:
    assert parse_window(text) == expected


@pytest.mark.parametrize("text", ["", "24", "h", "24 hours", "-1h", "0h", "1h junk"])
def test_bad_windows_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="window"):
        parse_window(text)


def test_percentile_interpolates_like_percentile_cont() -> None:
    values = [40.0, 10.0, 30.0, 20.0]
    assert percentile(values, 0.5) == 25.0
    assert percentile(values, 0.0) == 10.0
    assert percentile(values, 1.0) == 40.0
    assert percentile(values, 0.95) == pytest.approx(38.5)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 0.5) is None


def test_percentile_refuses_a_quantile_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="quantile"):
        percentile([1.0], 1.5)


def _c(kind: str, type_: str, by_reconciler: bool, n: int) -> TerminalCount:
    return TerminalCount(kind=kind, type=type_, by_reconciler=by_reconciler, events=n)


def test_recoveries_count_reconciler_terminal_events_by_type() -> None:
    counts = [_c("kie-veo", "Completed", True, 2), _c("kie-suno", "Completed", True, 1),
              _c("kie-veo", "Completed", False, 9), _c("kie-veo", "Swept", True, 3)]
    assert recoveries(counts) == {"Completed": 3, "Swept": 3}


def test_sweeps_count_every_swept_event_by_kind() -> None:
    counts = [_c("kie-llm", "Swept", True, 2), _c("kie-llm", "Swept", False, 1),
              _c("kie-veo", "Exhausted", True, 4)]
    assert sweeps(counts) == {"kie-llm": 3}
