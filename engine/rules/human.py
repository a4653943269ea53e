"""Durations as people read them: ``450 ns``, ``62 µs``, ``12.3 ms``, ``1.2 s``,
``3 min 4 s``, ``2 h 5 min``, ``3 d 4 h`` — never a float's repr (``23.431637549999976``,
``6.2e-05``). The commands' human output (``audit``, ``verify``, ``stats``, ``check``, the
demo's summary and page) prints its seconds through :func:`duration`. Pure."""

from __future__ import annotations

import math

__all__ = ["duration"]


def _pair(big: int, per: int, units: tuple[str, str]) -> str:
    high, low = divmod(big, per)
    return f"{high} {units[0]}" + (f" {low} {units[1]}" if low else "")


def duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it short: three significant digits below a
    minute, then two whole units (minutes and seconds, hours and minutes, days and hours)."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds == 0:
        return "0 s"
    if seconds < 1e-9:
        return "< 1 ns"
    if seconds < 0.9995e-6:
        return f"{seconds * 1e9:.3g} ns"
    if seconds < 0.9995e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 0.9995:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 59.95:
        return f"{seconds:.3g} s"
    if round(seconds) < 3600:
        return _pair(round(seconds), 60, ("min", "s"))
    if round(seconds / 60) < 24 * 60:
        return _pair(round(seconds / 60), 60, ("h", "min"))
    return _pair(round(seconds / 3600), 24, ("d", "h"))
