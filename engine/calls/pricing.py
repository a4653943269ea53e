"""What a completed call costs the user, in credits: the one pricing hook (pure).

Providers report usage in their own terms (``callwarden.providers.outcomes.Usage``): tokens
(Anthropic, KIE's LLM proxy), predict seconds (Replicate), characters (ElevenLabs), KIE
credits (its LLM proxy's ``credits_consumed``), or nothing at all (KIE task polls carry no
cost). None of that is the host's credits. The finalizer asks one :class:`Pricing` for
the charge when it records ``Completed``; the write path then commits ``min(charge,
reserved)`` (split over the job's reservations) and releases the rest.

- :class:`ChargeReservation` (the default): ``None`` — commit the reservation as made.
- :class:`RateTable`: a host's price list (the original design keeps one in ``model_pricing``)
  as rates per usage unit, matched by kind and (optionally) model; load one from a file
  with :func:`load_pricing`, or build it from the host's rows.
- Anything else with a ``charge`` method: a host's own function.

The charge is checked where it is asked for (:func:`checked_charge`, called by the
finalizer): a pricing function that raises, or answers anything but a finite number ``>= 0``
(NaN, infinity, a negative number, a string), charges the reservation, logged with the
reason — a host's pricing bug never loses a paid result and never charges more than was
reserved. A host's own hook may block (a database, an HTTP price service): the finalizer
runs it in a thread with a timeout (``CallConfig.pricing_timeout_s``, default 5 s; past
it, the reservation), so it never holds the event loop; the built-in ones
(:data:`BUILTIN`) are pure and run inline.

Rates: for each unit one rate applies, the most specific that matches: a rate naming a
model over the kind's generic one, and among model globs the one with the most literal
characters (then the first listed); a unit no model rate prices keeps the generic rate.
The units' charges add up (input plus output tokens). A price list is validated when it is built
(:class:`~callwarden.errors.ConfigError`): a kind callwarden does not know, a unit no
provider reports, a rate or ``per`` that is not a finite number (``per > 0``).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import msgspec

from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS

__all__ = ["BUILTIN", "PRICING_ENV", "UNITS", "ChargeReservation", "Pricing", "Rate", "RateTable",
           "checked_charge", "load_pricing", "pricing_from_env"]

log = logging.getLogger("callwarden.pricing")

#: The units a rate may charge by: the usage keys providers report (docs/pricing.md), and
#: ``call`` (a flat price per call).
UNITS: frozenset[str] = frozenset({
    "call", "input_tokens", "output_tokens", "cache_creation_input_tokens",
    "cache_read_input_tokens", "predict_time_s", "characters", "provider_credits"})

#: The environment variable naming a price list for the CLI processes (worker,
#: reconcile, serve): all three must charge alike, so they read the same file.
PRICING_ENV = "CALLWARDEN_PRICING_FILE"

Usage = dict[str, float | str]


class Pricing(Protocol):
    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> float | None:
        """Credits to commit for a completed call of ``kind`` that reported ``usage``
        (and ``reported_cost`` in the provider's units); ``None``: the reservation."""
        ...


class ChargeReservation:
    """The default: commit what was reserved."""

    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> float | None:
        return None


class Rate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``credits`` per ``per`` units of ``unit`` (a usage key: ``input_tokens``,
    ``output_tokens``, ``predict_time_s``, ``characters``, ``provider_credits``: see
    :data:`UNITS`), for calls of ``kind`` (and of ``model`` when given: a glob matched
    against the model the provider *reports*, e.g. ``claude-sonnet-4-5*`` for its dated
    ids; a rate naming a model wins over one that does not). ``unit = "call"`` charges
    ``credits`` once per call."""

    kind: str
    unit: str
    credits: float
    per: float = 1.0
    model: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"pricing rate for unknown provider_kind {self.kind!r}")
        if self.unit not in UNITS:
            raise ConfigError(f"pricing rate for {self.kind}: unknown unit {self.unit!r}; "
                              f"known: {', '.join(sorted(UNITS))}")
        if not (math.isfinite(self.credits) and self.credits >= 0
                and math.isfinite(self.per) and self.per > 0):
            raise ConfigError(f"pricing rate {self.kind}/{self.unit}: credits must be a "
                              f"finite number >= 0 and per a finite number > 0")


class RateTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A price list; a call whose kind (and model) no rate matches, or whose usage lacks
    every unit its rates name, is charged its reservation (``None``)."""

    rates: tuple[Rate, ...] = ()

    def _rates_for(self, kind: str, model: object) -> list[Rate]:
        """One rate per unit: the most specific that matches (see the module)."""
        best: dict[str, tuple[int, Rate]] = {}
        for rate in self.rates:
            if rate.kind != kind:
                continue
            if rate.model is None:
                rank = 0
            elif isinstance(model, str) and fnmatch.fnmatchcase(model, rate.model):
                rank = 1 + sum(c not in "*?[]" for c in rate.model)
            else:
                continue
            if rate.unit not in best or rank > best[rate.unit][0]:
                best[rate.unit] = (rank, rate)
        return [rate for _, rate in best.values()]

    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> float | None:
        total, matched = 0.0, False
        for rate in self._rates_for(kind, usage.get("model")):
            if rate.unit == "call":
                total += rate.credits
                matched = True
                continue
            amount = usage.get(rate.unit)
            if isinstance(amount, int | float) and math.isfinite(amount) and amount >= 0:
                total += amount / rate.per * rate.credits
                matched = True
        return round(total, 6) if matched and math.isfinite(total) else None


#: The pricing callwarden ships: pure and quick, so the finalizer runs them inline.
BUILTIN: tuple[type, ...] = (ChargeReservation, RateTable)


def load_pricing(path: Path) -> RateTable:
    """A :class:`RateTable` from a TOML or JSON file: ``[[rates]]`` entries with
    ``kind``, ``unit``, ``credits``, optional ``per`` and ``model``."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        return msgspec.convert(data, RateTable)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read pricing {path}: {exc}") from exc
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid pricing {path}: {exc}") from exc


def pricing_from_env(env: Mapping[str, str]) -> Pricing:
    """The price list named by ``CALLWARDEN_PRICING_FILE``, else
    :class:`ChargeReservation`. A file that cannot be read or validated is a
    :class:`~callwarden.errors.ConfigError` at start, never a silent fall back to the default."""
    path = env.get(PRICING_ENV, "").strip()
    return load_pricing(Path(path)) if path else ChargeReservation()


def checked_charge(pricing: Pricing, kind: str, usage: Usage,
                   reported_cost: float | None) -> float | None:
    """``pricing``'s charge for a completed call, or ``None`` (the reservation) when the
    hook raises or answers anything but a finite number ``>= 0`` — logged, never raised:
    the result was paid for upstream and is kept."""
    try:
        charge = pricing.charge(kind, usage, reported_cost)
    except Exception:
        log.exception("pricing hook raised for a %s call: charging the reservation", kind)
        return None
    if charge is None:
        return None
    value = _credits(charge)
    if value is None:
        log.error("pricing hook answered %r for a %s call (not a finite number >= 0 that "
                  "fits a float): charging the reservation", charge, kind)
    return value


def _credits(charge: object) -> float | None:
    """A hook's answer as credits: an int, float, ``Decimal`` (what psycopg returns for a
    ``numeric`` price row) or ``Fraction``, finite and ``>= 0``; ``None`` for anything
    else, an int too large for a float among them (the settlement caps a charge at the
    reservation, which is what ``None`` charges)."""
    if isinstance(charge, bool) or not isinstance(charge, int | float | Decimal | Fraction):
        return None
    try:
        value = float(charge)
    except (OverflowError, ArithmeticError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None
