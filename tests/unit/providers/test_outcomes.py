"""Reported costs and usage figures (pure): what a provider reports is read, never
guessed; an odd figure is dropped (``None``), never an exception and never negative."""

from __future__ import annotations

import pytest

from callwarden.providers.outcomes import finite, reported_cost, reported_number


@pytest.mark.parametrize(("value", "cost"), [
    (0, 0.0), (2, 2.0), (0.25, 0.25), ("12", 12.0), (" 3.5 ", 3.5),
    (None, None), (-1, None), ("-1", None), ("NaN", None), ("inf", None), ("12 chars", None),
    (True, None), ([1], None), ({"a": 1}, None), (10**400, None), ("1e999", None),
])
def test_a_reported_cost_is_a_finite_number_at_least_zero_or_none(
        value: object, cost: float | None) -> None:
    assert reported_cost(value) == cost


@pytest.mark.parametrize(("value", "number"), [
    (5, 5.0), (0.5, 0.5), (-5, None), (float("nan"), None), (float("inf"), None),
    ("5", None), (False, None), (10**400, None),
])
def test_a_usage_figure_is_a_finite_json_number_at_least_zero_or_none(
        value: object, number: float | None) -> None:
    assert reported_number(value) == number


def test_finite_keeps_negative_numbers_but_not_overflowing_ones() -> None:
    assert (finite(-2), finite(10**400), finite(float("-inf"))) == (-2.0, None, None)
