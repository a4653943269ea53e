"""The demo's offline HTML report: jobs per state over time and the time-to-terminal
distribution (reconciler recoveries highlighted), as inline SVG, and the summary as people
read it (durations as ``23.4 s``, credits as ``80``). Pure: data in, text out."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import msgspec

from callwarden.demo.summary import DemoSummary
from callwarden.rules.human import duration

__all__ = ["Sample", "render_report"]

W, H, PAD = 720, 260, 40
COLORS = {
    "none": "#bbbbbb", "created": "#8fb3ff", "polling": "#3b6fe0",
    "upstream_succeeded": "#9b59b6", "finalizing": "#c39bd3", "completed": "#2e9e4f",
    "failed": "#d9534f", "swept": "#f0ad4e", "exhausted": "#8a6d3b", "cancelled": "#555555",
}


class Sample(msgspec.Struct, frozen=True):
    t: float
    counts: dict[str, int]


def _x(t: float, t_max: float) -> float:
    return PAD + (W - 2 * PAD) * (t / t_max if t_max else 0.0)


def _y(n: float, n_max: float) -> float:
    return H - PAD - (H - 2 * PAD) * (n / n_max if n_max else 0.0)


def _states_svg(samples: Sequence[Sample]) -> str:
    if not samples:
        return "<p>no samples</p>"
    t_max = max(s.t for s in samples) or 1.0
    n_max = max((max(s.counts.values(), default=0) for s in samples), default=1) or 1
    lines = []
    for state, color in COLORS.items():
        pts = " ".join(f"{_x(s.t, t_max):.1f},{_y(s.counts.get(state, 0), n_max):.1f}"
                       for s in samples)
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                     f'points="{pts}"><title>{state}</title></polyline>')
    legend = "".join(f'<span style="color:{c}">&#9632; {s}</span> ' for s, c in COLORS.items())
    return (f'<svg width="{W}" height="{H}" role="img" aria-label="jobs per state">'
            f'{_axes(t_max, n_max, "seconds", "jobs")}{"".join(lines)}</svg><p>{legend}</p>')


def _axes(x_max: float, y_max: float, x_label: str, y_label: str) -> str:
    return (f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#000"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#000"/>'
            f'<text x="{W - PAD}" y="{H - 10}" text-anchor="end">{x_label} (max '
            f'{x_max:.1f})</text><text x="5" y="{PAD - 10}">{y_label} (max {y_max:g})</text>')


def _histogram_svg(latencies: Sequence[tuple[float, bool]], bins: int = 30) -> str:
    if not latencies:
        return "<p>no terminal jobs</p>"
    top = max(s for s, _ in latencies) or 1.0
    counts = [[0, 0] for _ in range(bins)]
    for s, by_reconciler in latencies:
        counts[min(bins - 1, int(s / top * bins))][int(by_reconciler)] += 1
    n_max = max(a + b for a, b in counts) or 1
    bw = (W - 2 * PAD) / bins
    rects = []
    for i, (direct, recovered) in enumerate(counts):
        x = PAD + i * bw
        for n, base, color in ((direct, 0, "#3b6fe0"), (recovered, direct, "#f0ad4e")):
            if n:
                y0, y1 = _y(base + n, n_max), _y(base, n_max)
                rects.append(f'<rect x="{x:.1f}" y="{y0:.1f}" width="{bw - 1:.1f}" '
                             f'height="{y1 - y0:.1f}" fill="{color}"/>')
    return (f'<svg width="{W}" height="{H}" role="img" aria-label="time to terminal">'
            f'{_axes(top, n_max, "seconds to terminal", "jobs")}{"".join(rects)}</svg>'
            '<p><span style="color:#3b6fe0">&#9632; settled by a worker or webhook</span> '
            '<span style="color:#f0ad4e">&#9632; recovered by the reconciler</span></p>')


_LABELS = {"p50_s": "time to terminal p50", "p95_s": "time to terminal p95"}


def _shown(key: str, value: object) -> str:
    """A summary value as text: seconds as a duration, numbers without float noise."""
    if value is None or value in ({}, []):
        return "-"
    if key.endswith("_s") and isinstance(value, int | float) and not isinstance(value, bool):
        return duration(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{_label(str(k))} {_shown(str(k), v)}" for k, v in value.items())
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return str(value)


def _label(key: str) -> str:
    return _LABELS.get(key, key.removesuffix("_s").replace("_", " "))


def _summary_rows(summary: DemoSummary) -> str:
    data: Mapping[str, object] = msgspec.to_builtins(summary)
    return "".join(f"<tr><th>{html.escape(_label(k))}</th>"
                   f"<td>{html.escape(_shown(k, v))}</td></tr>" for k, v in data.items())


def render_report(summary: DemoSummary, samples: Sequence[Sample],
                  latencies: Sequence[tuple[float, bool]]) -> str:
    verdict = "all invariants hold" if summary.ok else "; ".join(summary.violations)
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>callwarden demo report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:780px}}
th{{text-align:left;padding-right:1em}}</style></head><body>
<h1>callwarden demo</h1><p><strong>{html.escape(verdict)}</strong></p>
<h2>Jobs per state over time</h2>{_states_svg(samples)}
<h2>Time to terminal</h2>{_histogram_svg(latencies)}
<h2>Summary</h2><table>{_summary_rows(summary)}</table></body></html>"""
