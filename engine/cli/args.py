"""The flags' own ranges: argparse ``type=`` functions that refuse a number outside its
range, so argparse exits 2 naming the flag before a command starts or connects
(``argument --batch: want an integer >= 1, got '0'``); and a span of time as people write
it (``--window 24h``, ``--older-than 10m``)."""

from __future__ import annotations

import argparse
import math
from datetime import timedelta

from callwarden.projections.stats import parse_window

__all__ = ["count", "nonnegative_float", "port", "positive_float", "positive_int", "window"]


def _int(text: str, low: int, high: int | None, want: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"want {want}, got {text!r}")
    return value


def _float(text: str, *, zero: bool, want: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"want {want}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1, None, "an integer >= 1")


def count(text: str) -> int:
    return _int(text, 0, None, "an integer >= 0")


def port(text: str) -> int:
    return _int(text, 0, 65535, "a port 0..65535 (0: any free port)")


def positive_float(text: str) -> float:
    return _float(text, zero=False, want="a number > 0")


def nonnegative_float(text: str) -> float:
    return _float(text, zero=True, want="a number >= 0")


def window(text: str) -> timedelta:
    """A positive span: ``90m``, ``24h``, ``1d12h``, ``2w`` (s, m, h, d, w)."""
    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
