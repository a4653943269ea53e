"""Charts as SVG, rendered by the server (pure functions, no JavaScript needed).

Every chart is one ``<svg role="img" aria-label="...">`` with a ``<title>``, axis labels,
and a ``<title>`` tooltip on each bar or point; every text passes through
:func:`html.escape`. Colours are presentation attributes (readable without the
stylesheet) that the stylesheet may override by class (``s0``, ``s1``...) for dark mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

__all__ = ["PALETTE", "Series", "hbars", "lines", "nice_max", "stacked_bars"]

PALETTE = ("#2f7d32", "#c62828", "#ef6c00", "#6a1b9a", "#1565c0", "#546e7a", "#00838f")
Series = tuple[str, Sequence[float]]
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 48, 8, 8, 22


def _finite(values: Sequence[float]) -> list[float]:
    """Values a chart can draw: a non-finite or negative one is drawn as 0 (its tooltip
    still says what it was)."""
    return [v if math.isfinite(v) and v > 0 else 0.0 for v in values]


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= ``value`` (1 for 0, for a
    value too small to scale, and for one that is not finite: a host may store
    ``'Infinity'`` in a numeric column, and an axis must never loop on it)."""
    if not math.isfinite(value) or value <= 1e-12:
        return 1.0
    step = 1.0
    while step * 10 <= value:
        step *= 10
    while step > value * 10:  # values below 1
        step /= 10
    for m in (1, 2, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step  # pragma: no cover - the loop always returns


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:.2g}"


def _open(label: str, width: int, height: int) -> str:
    a = escape(label)
    return (f'<svg class="chart" role="img" aria-label="{a}" viewBox="0 0 {width} {height}" '
            f'width="100%" preserveAspectRatio="xMinYMin meet" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{a}</title>')


def _axes(width: int, height: int, top: float, fmt: Callable[[float], str]) -> str:
    x0, y0, y1 = _PAD_L, height - _PAD_B, _PAD_T
    return (f'<line class="axis" x1="{x0}" y1="{y0}" x2="{width - _PAD_R}" y2="{y0}" '
            f'stroke="#888"/><line class="axis" x1="{x0}" y1="{y1}" x2="{x0}" y2="{y0}" '
            f'stroke="#888"/><text class="tick" x="{x0 - 4}" y="{y1 + 8}" '
            f'text-anchor="end" font-size="10">{escape(fmt(top))}</text>'
            f'<text class="tick" x="{x0 - 4}" y="{y0}" text-anchor="end" '
            f'font-size="10">0</text>')


def _x_labels(labels: Sequence[str], width: int, height: int, step: float) -> str:
    every = max(1, len(labels) // 6)
    out = []
    for i, label in enumerate(labels):
        if i % every == 0 or i == len(labels) - 1:
            x = _PAD_L + (i + 0.5) * step
            out.append(f'<text class="tick" x="{x:.1f}" y="{height - 6}" text-anchor="middle" '
                       f'font-size="10">{escape(label)}</text>')
    return "".join(out)


def _legend(names: Sequence[str]) -> str:
    items = "".join(
        f'<li><svg class="swatch" width="10" height="10" aria-hidden="true"><rect '
        f'class="s{i % len(PALETTE)}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"'
        f'/></svg> {escape(n)}</li>' for i, n in enumerate(names))
    return f'<ul class="legend">{items}</ul>' if names else ""


def stacked_bars(label: str, buckets: Sequence[str], series: Sequence[Series], *,
                 width: int = 640, height: int = 180,
                 fmt: Callable[[float], str] = _num) -> str:
    """One bar per bucket, each series stacked on the previous ones; ``series`` values are
    aligned with ``buckets``. A legend follows the SVG."""
    drawn = [(name, _finite(values)) for name, values in series]
    totals = [sum(s[1][i] for s in drawn) for i in range(len(buckets))]
    top = nice_max(max(totals, default=0.0))
    plot_w, plot_h = width - _PAD_L - _PAD_R, height - _PAD_T - _PAD_B
    step = plot_w / max(1, len(buckets))
    bars = []
    for i, bucket in enumerate(buckets):
        base = 0.0
        for k, (name, values) in enumerate(drawn):
            v = values[i]
            if v <= 0:
                continue
            h = v / top * plot_h
            y = _PAD_T + plot_h - (base + v) / top * plot_h
            tip = escape(f"{bucket} {name}: {fmt(v)}")
            bars.append(f'<rect class="s{k % len(PALETTE)}" x="{_PAD_L + i * step + 1:.1f}" '
                        f'y="{y:.1f}" width="{max(1.0, step - 2):.1f}" height="{h:.1f}" '
                        f'fill="{PALETTE[k % len(PALETTE)]}"><title>{tip}</title></rect>')
            base += v
    return (_open(label, width, height) + _axes(width, height, top, fmt) + "".join(bars)
            + _x_labels(buckets, width, height, step) + "</svg>"
            + _legend([n for n, _ in series]))


def lines(label: str, buckets: Sequence[str], series: Sequence[Series], *,
          width: int = 640, height: int = 180, fmt: Callable[[float], str] = _num) -> str:
    """One polyline per series over ``buckets``, a point (with its tooltip) per value."""
    top = nice_max(max((v for _, vs in series for v in _finite(vs)), default=0.0))
    plot_w, plot_h = width - _PAD_L - _PAD_R, height - _PAD_T - _PAD_B
    step = plot_w / max(1, len(buckets))
    out = []
    for k, (name, values) in enumerate(series):
        colour = PALETTE[k % len(PALETTE)]
        pts = [(_PAD_L + (i + 0.5) * step, _PAD_T + plot_h - v / top * plot_h)
               for i, v in enumerate(_finite(values))]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<polyline class="line s{k % len(PALETTE)}" points="{path}" fill="none" '
                   f'stroke="{colour}" stroke-width="2"/>')
        for (x, y), bucket, v in zip(pts, buckets, values, strict=True):
            tip = escape(f"{bucket} {name}: {fmt(v)}")
            out.append(f'<circle class="s{k % len(PALETTE)}" cx="{x:.1f}" cy="{y:.1f}" r="3" '
                       f'fill="{colour}"><title>{tip}</title></circle>')
    return (_open(label, width, height) + _axes(width, height, top, fmt) + "".join(out)
            + _x_labels(buckets, width, height, step) + "</svg>"
            + _legend([n for n, _ in series]))


def hbars(label: str, items: Sequence[tuple[str, float]], *, width: int = 640,
          fmt: Callable[[float], str] = _num) -> str:
    """One horizontal bar per ``(name, value)``, the name left of it, the value right."""
    row, name_w, value_w = 22, 120, 70
    height = max(1, len(items)) * row + 4
    top = nice_max(max(_finite([v for _, v in items]), default=0.0))
    plot_w = width - name_w - value_w
    out = []
    for i, (name, v) in enumerate(items):
        y = 2 + i * row
        w = _finite([v])[0] / top * plot_w
        tip = escape(f"{name}: {fmt(v)}")
        out.append(f'<text class="tick" x="{name_w - 6}" y="{y + 15}" text-anchor="end" '
                   f'font-size="12">{escape(name)}</text><rect class="s{i % len(PALETTE)}" '
                   f'x="{name_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                   f'fill="{PALETTE[i % len(PALETTE)]}"><title>{tip}</title></rect>'
                   f'<text class="tick" x="{name_w + w + 6:.1f}" y="{y + 15}" '
                   f'font-size="12">{escape(fmt(v))}</text>')
    return _open(label, width, height) + "".join(out) + "</svg>"
