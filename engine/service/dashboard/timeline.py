"""A job's timeline as a picture (pure): one lane per actor, one dot per event, placed by
time.

Gaps are drawn to scale, except a gap longer than four times the (low) median one and over
a second, which is drawn at that cap with a break mark and labelled with its real length,
so a call that waited an hour for the reconciler still shows its first seconds. No two
markers overlap at any width, and the lane labels get the room the longest needs. The job
page (:mod:`callwarden.service.dashboard.story`) places it above the table of events.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from html import escape

from callwarden.projections.timeline import TimelineRow
from callwarden.service.charts import PALETTE
from callwarden.service.dashboard.format import duration, when

__all__ = ["MIN_STEP", "gap_layout", "lanes_svg"]

_LANE_H, _PAD = 34, 14
MIN_STEP = 30.0   # between two markers: room for a marker (12) and a seq label (4 digits)
_NAME_CHARS = 24   # a lane label longer than this is cut (in full in its tooltip)


def gap_layout(gaps: Sequence[float]) -> tuple[list[float], float | None]:
    """Each gap's drawn length (seconds of the drawing) and the cap (``None``: none is
    capped). A gap over ``max(1 s, 4 × the low median gap)`` is drawn at that cap."""
    positive = [g for g in gaps if g > 0]
    if not positive:
        return [0.0 for _ in gaps], None
    cap = max(1.0, 4 * statistics.median_low(positive))
    if max(positive) <= cap:
        return list(gaps), None
    return [min(g, cap) for g in gaps], cap


def _label_w(text: str, size: float) -> float:
    """A generous estimate of ``text``'s width at ``size`` (user units): wide enough for
    any sans-serif, so what is laid out by it never touches its neighbour."""
    return len(text) * size * 0.62 + 4


def _lane_name(actor: str) -> str:
    return actor if len(actor) <= _NAME_CHARS else actor[:_NAME_CHARS - 1] + "\u2026"


def _steps(gaps: Sequence[float], drawn: Sequence[float], floors: Sequence[float],
           plot: float) -> list[float]:
    """Each gap's length on the drawing: its floor (room for the markers and a label),
    plus its share of what is left of ``plot``, in proportion to its drawn seconds."""
    free = max(0.0, plot - sum(floors))
    total = sum(drawn)
    return [f + (d / total * free if total else free / len(gaps))
            for f, d in zip(floors, drawn, strict=True)]


def lanes_svg(rows: Sequence[TimelineRow], *, width: int = 900) -> str:
    """The timeline picture of ``rows``: one lane per actor (in order of first event).

    No two markers overlap at any width: consecutive events are at least
    :data:`MIN_STEP` apart on the drawing (the picture is scaled as a whole, so what does
    not overlap in its own units overlaps at no size), a shortened gap is wide enough for
    its label, and the drawing grows when the events need more room than ``width``. The
    lane labels get the room the longest needs (a name over :data:`_NAME_CHARS`
    characters is cut, in full in its tooltip)."""
    if not rows:
        return ""
    actors = list(dict.fromkeys(r.actor for r in rows))
    gaps = [r.since_previous_s or 0.0 for r in rows[1:]]
    drawn, cap = gap_layout(gaps)
    name_w = max(60.0, max(_label_w(_lane_name(a), 12) for a in actors)) + 10
    broken = [cap is not None and g > cap for g in gaps]
    floors = [max(MIN_STEP, _label_w(duration(g), 10) + 8) if b else MIN_STEP
              for g, b in zip(gaps, broken, strict=True)]
    width = max(width, round(name_w + 2 * _PAD + sum(floors) + 1))
    plot = width - name_w - 2 * _PAD
    xs = [name_w + _PAD]
    for step in (_steps(gaps, drawn, floors, plot) if gaps else []):
        xs.append(xs[-1] + step)
    height = len(actors) * _LANE_H + 30
    span = (rows[-1].at - rows[0].at).total_seconds()
    label = (f"Timeline of {len(rows)} events by {len(actors)} actor(s) over {duration(span)}"
             + (f"; gaps over {duration(cap)} are shortened" if cap else ""))
    out = [f'<svg class="lanes" role="img" aria-label="{escape(label)}" '
           f'viewBox="0 0 {width} {height}" width="100%" xmlns="http://www.w3.org/2000/svg">'
           f"<title>{escape(label)}</title>"]
    for i, actor in enumerate(actors):
        y = i * _LANE_H + _LANE_H / 2
        out.append(f'<text class="tick lane-name" x="{name_w - 6:.1f}" y="{y + 4:.0f}" '
                   f'text-anchor="end" font-size="12"><title>{escape(actor)}</title>'
                   f'{escape(_lane_name(actor))}</text><line class="lane" x1="{name_w:.1f}" '
                   f'y1="{y:.0f}" x2="{width - 4}" y2="{y:.0f}" stroke="#8884"/>')
    axis = len(actors) * _LANE_H + 4
    for i, g in enumerate(gaps):
        x0, x1 = xs[i], xs[i + 1]
        text = duration(g)
        if broken[i]:
            mid = (x0 + x1) / 2
            out.append(f'<path class="break" d="M{mid - 4:.1f},{axis + 6} l4,-6 l4,6" '
                       f'fill="none" stroke="#c62828"/>')
        if broken[i] or x1 - x0 >= _label_w(text, 10) + 8:
            cls = "gap broken" if broken[i] else "gap"
            out.append(f'<text class="{cls}" x="{(x0 + x1) / 2:.1f}" y="{axis + 20}" '
                       f'text-anchor="middle" font-size="10">{escape(text)}</text>')
    out.append(f'<line class="axis" x1="{xs[0]:.1f}" y1="{axis}" x2="{xs[-1]:.1f}" '
               f'y2="{axis}" stroke="#888"/>')
    for r, x in zip(rows, xs, strict=True):
        lane = actors.index(r.actor)
        y = lane * _LANE_H + _LANE_H / 2
        colour = PALETTE[lane % len(PALETTE)]
        tip = (f"#{r.seq} {r.type} at {when(r.at)} by {r.actor}: "
               f"{r.state_before or '-'} -> {r.state_after}"
               + (f" (+{duration(r.since_previous_s)})" if r.since_previous_s else ""))
        out.append(f'<g class="event"><circle class="s{lane % len(PALETTE)}" cx="{x:.1f}" '
                   f'cy="{y:.0f}" r="6" fill="{colour}"><title>{escape(tip)}</title></circle>'
                   f'<text x="{x:.1f}" y="{y - 9:.0f}" text-anchor="middle" font-size="10">'
                   f"{r.seq}</text></g>")
    out.append("</svg>")
    return "".join(out)
