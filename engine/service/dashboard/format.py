"""Human formats for the dashboard (pure): durations, times, credits."""

from __future__ import annotations

from datetime import datetime

__all__ = ["credits", "duration", "when"]


def duration(seconds: float | None) -> str:
    """``6.930969`` → ``"6.9 s"``; ``125`` → ``"2 min 5 s"``; ``10_860`` → ``"3 h 1 min"``;
    under a second in ms, over a day in days and hours; ``None`` → ``"-"``."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 0.9995:
        return f"{round(seconds * 1000)} ms"
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        whole, part = divmod(total, 60)
        unit, sub = "min", "s"
    elif total < 86400:
        whole, rest = divmod(total, 3600)
        part, unit, sub = rest // 60, "h", "min"
    else:
        whole, rest = divmod(total, 86400)
        part, unit, sub = rest // 3600, "d", "h"
    return f"{whole} {unit}" + (f" {part} {sub}" if part else "")


def when(at: datetime | None) -> str:
    """An instant as ``2026-12-01 17:35:30 UTC`` (seconds; the zone it was stored in)."""
    if at is None:
        return "-"
    zone = at.tzname() or ""
    return at.strftime("%Y-%m-%d %H:%M:%S") + (f" {zone}" if zone else "")


def credits(value: float | None) -> str:
    """Credits without float noise: ``4``, ``2.5``, ``0.125``; ``None`` → ``"-"``."""
    if value is None:
        return "-"
    return f"{value:.4f}".rstrip("0").rstrip(".") or "0"
