"""The pricing hook (pure): price lists, their files, and the environment variable."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.calls.pricing import (
    PRICING_ENV,
    ChargeReservation,
    Rate,
    RateTable,
    Usage,
    checked_charge,
    load_pricing,
    pricing_from_env,
)
from callwarden.errors import ConfigError

TABLE = RateTable(rates=(
    Rate(kind="anthropic-sync", unit="input_tokens", credits=1, per=1000),
    Rate(kind="anthropic-sync", unit="output_tokens", credits=5, per=1000),
    Rate(kind="anthropic-sync", model="claude-opus-4-1*", unit="output_tokens", credits=25,
         per=1000),
    Rate(kind="replicate-prediction", unit="predict_time_s", credits=2),
    Rate(kind="kie-standard", unit="call", credits=3),
))


def test_rates_add_up_per_unit() -> None:
    usage: dict[str, float | str] = {"input_tokens": 2000, "output_tokens": 400,
                                     "model": "claude-sonnet-4-6"}
    assert TABLE.charge("anthropic-sync", usage, None) == 2 + 2


@pytest.mark.parametrize("model", ["claude-opus-4-1", "claude-opus-4-1-20250805"])
def test_a_rate_naming_the_model_wins_over_the_generic_ones(model: str) -> None:
    """The model is matched as a glob against the one the provider reports (Anthropic
    answers with dated ids); the unit it does not price (input) keeps the generic rate."""
    usage: dict[str, float | str] = {"input_tokens": 2000, "output_tokens": 400,
                                     "model": model}
    assert TABLE.charge("anthropic-sync", usage, None) == 2 + 10


def test_a_per_call_rate_needs_no_usage() -> None:
    assert TABLE.charge("kie-standard", {}, None) == 3


def test_no_matching_rate_or_unit_charges_the_reservation() -> None:
    assert TABLE.charge("elevenlabs-sync", {"characters": 100}, None) is None
    assert TABLE.charge("replicate-prediction", {"model": "x"}, None) is None
    assert ChargeReservation().charge("kie-standard", {"x": 1}, 5.0) is None


@given(st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "model",
                                        "predict_time_s", "other"]),
                       st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                 st.integers(-10**9, 10**9), st.text(max_size=5))))
def test_a_charge_is_never_negative_or_not_finite(usage: dict[str, float | str]) -> None:
    """Invariant: whatever usage a provider reports (negative, NaN, infinite, strings),
    a price list charges ``None`` (the reservation) or a finite amount >= 0."""
    for kind in ("anthropic-sync", "replicate-prediction", "kie-standard"):
        charge = TABLE.charge(kind, usage, None)
        assert charge is None or (math.isfinite(charge) and charge >= 0)


@pytest.mark.parametrize("rate", [
    {"kind": "kie-nonesuch", "unit": "call", "credits": 1},
    {"kind": "kie-standard", "unit": "call", "credits": -1},
    {"kind": "kie-standard", "unit": "call", "credits": float("inf")},
    {"kind": "kie-standard", "unit": "call", "credits": 1, "per": 0},
    {"kind": "kie-standard", "unit": "call", "credits": 1, "per": float("inf")},
    {"kind": "anthropic-sync", "unit": "output_tokn", "credits": 1},
])
def test_a_bad_rate_is_a_config_error(tmp_path: Path, rate: dict[str, object]) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"rates": [rate]}), encoding="utf-8")
    with pytest.raises(ConfigError):
        load_pricing(path)


def test_price_lists_load_from_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text('[[rates]]\nkind = "kie-standard"\nunit = "call"\ncredits = 3\n',
                    encoding="utf-8")
    js = tmp_path / "p.json"
    js.write_text('{"rates": [{"kind": "kie-standard", "unit": "call", "credits": 3}]}',
                  encoding="utf-8")
    assert load_pricing(toml) == load_pricing(js)
    assert load_pricing(toml).charge("kie-standard", {}, None) == 3


@pytest.mark.parametrize("text", ["not toml [", '[[rates]]\nkind = "kie-standard"\n',
                                  '[[rates]]\nkind = "kie-standard"\nunit = "call"\n'
                                  'credits = 1\nsurprise = 2\n'])
def test_an_unreadable_price_list_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError):
        load_pricing(path)
    with pytest.raises(ConfigError):
        load_pricing(tmp_path / "missing.toml")


def test_the_environment_names_the_price_list(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[rates]]\nkind = "kie-standard"\nunit = "call"\ncredits = 3\n',
                    encoding="utf-8")
    assert isinstance(pricing_from_env({}), ChargeReservation)
    assert isinstance(pricing_from_env({PRICING_ENV: "  "}), ChargeReservation)
    assert pricing_from_env({PRICING_ENV: str(path)}) == load_pricing(path)
    with pytest.raises(ConfigError):
        pricing_from_env({PRICING_ENV: str(tmp_path / "missing.toml")})


class _Answers:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def charge(self, kind: str, usage: dict[str, float | str],
               reported_cost: float | None) -> float | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), -1.0, "3", True,
                                    RuntimeError("the host's price table is down")])
def test_a_pricing_hook_that_fails_or_answers_nonsense_charges_the_reservation(
        answer: object, caplog: pytest.LogCaptureFixture) -> None:
    assert checked_charge(_Answers(answer), "kie-standard", {}, None) is None
    assert "charging the reservation" in caplog.text


@pytest.mark.parametrize(("answer", "charge"), [(None, None), (0, 0.0), (2.5, 2.5)])
def test_a_sound_charge_passes_unchanged(answer: object, charge: float | None) -> None:
    assert checked_charge(_Answers(answer), "kie-standard", {}, None) == charge


def test_a_table_whose_sum_overflows_charges_the_reservation() -> None:
    table = RateTable(rates=(Rate(kind="anthropic-sync", unit="output_tokens",
                                  credits=1e308),))
    assert table.charge("anthropic-sync", {"output_tokens": 10}, None) is None


def test_the_most_specific_model_glob_wins_per_unit() -> None:
    """Overlapping globs are not summed (issue 24.11): claude-opus-4-1* over claude-opus-*,
    whichever is listed first; a unit only the broader glob prices still counts."""
    broad = Rate(kind="anthropic-sync", model="claude-opus-*", unit="output_tokens",
                 credits=50, per=1000)
    narrow = Rate(kind="anthropic-sync", model="claude-opus-4-1*", unit="output_tokens",
                  credits=25, per=1000)
    inputs = Rate(kind="anthropic-sync", model="claude-opus-*", unit="input_tokens",
                  credits=1, per=1000)
    usage: dict[str, float | str] = {"input_tokens": 1000, "output_tokens": 1000,
                                     "model": "claude-opus-4-1-20250805"}
    for rates in ((broad, narrow, inputs), (narrow, inputs, broad)):
        assert RateTable(rates=rates).charge("anthropic-sync", usage, None) == 25 + 1
    usage["model"] = "claude-opus-4-5-20251101"
    assert RateTable(rates=(broad, narrow)).charge("anthropic-sync", usage, None) == 50
    generic = Rate(kind="anthropic-sync", unit="input_tokens", credits=3, per=1000)
    usage["model"] = "claude-sonnet-4-6"  # no model rate: the generic input rate only
    assert RateTable(rates=(broad, narrow, generic)).charge("anthropic-sync", usage,
                                                            None) == 3


def test_the_documented_price_list_matches_what_anthropic_reports(tmp_path: Path) -> None:
    """docs/pricing.md's example, loaded as written, prices a call whose answer reports a
    dated model id (the recorded shape: claude-opus-4-1-20250805) at the opus rate: before
    issue 24.11 its `model = "claude-opus-4-1"` never matched, a 5x under-charge."""
    doc = (Path(__file__).parents[2] / "docs" / "pricing.md").read_text(encoding="utf-8")
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "prices.toml"
    path.write_text(block)
    usage: dict[str, float | str] = {"output_tokens": 1000,
                                     "model": "claude-opus-4-1-20250805"}
    assert load_pricing(path).charge("anthropic-sync", usage, None) == 25


@pytest.mark.parametrize(("answer", "charged"), [
    (Decimal("0.003"), 0.003),  # a numeric price row, as psycopg returns it
    (Fraction(1, 4), 0.25),
    (7, 7.0),
    (10**400, None),  # too large for a float: the reservation (the settlement's cap)
    (Decimal("NaN"), None),
    (Decimal("sNaN"), None),
    (Decimal("-0.5"), None),
    (Decimal("1e400"), None),
    ("0.003", None),
    (True, None),
])
def test_a_hooks_answer_is_credits_or_the_reservation_never_an_exception(
        answer: object, charged: float | None) -> None:
    """Any answer of a host's hook becomes a charge (a finite number >= 0, Decimal and
    Fraction included) or the reservation, and never raises out of the finalization
    (issue 40, item 5: a Decimal was refused, a huge int raised)."""
    assert checked_charge(_Answers(answer), "kie-standard", Usage(), None) == charged
