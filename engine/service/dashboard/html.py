"""The dashboard's HTML building blocks (pure): the page frame, tables, links.

Every value shown passes through :func:`html.escape` (attributes too); links to a job
quote its id. The frame loads one stylesheet and one script from ``/static/`` (shipped in
the wheel, no CDN); every page is complete without the script.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from html import escape
from urllib.parse import quote

from callwarden.service.dashboard.format import when

__all__ = ["TOKEN_FORM", "Cell", "job_href", "page", "raw", "table"]

ASSET_VERSION = "3"  # bump when the static files change (they are cached for 5 minutes)


class Cell:
    """Markup already escaped by its producer (a link, a chart): put in a cell as is."""

    __slots__ = ("html",)

    def __init__(self, html: str) -> None:
        self.html = html


def raw(html: str) -> Cell:
    return Cell(html)


#: The admin token's form (the job page's and the call list's): hidden until the page's
#: script shows it, which keeps the token in ``sessionStorage`` and sends it as a header.
TOKEN_FORM = ('<form id="token-form" class="token" hidden><label for="admin-token">Admin '
              'token (kept for this browser session only)</label> <input id="admin-token" '
              'type="password" autocomplete="off"> <button type="submit">Use token</button> '
              '<button type="button" id="forget-token">Forget token</button></form>')


def job_href(job_id: object) -> str:
    return f"/jobs/{quote(str(job_id))}"


def _cell(value: object, cls: str = "") -> str:
    if isinstance(value, Cell):
        return f"<td{cls}>{value.html}</td>"
    if value is None:
        return '<td class="muted">-</td>'
    if isinstance(value, datetime):
        value = when(value)
    return f"<td{cls}>{escape(str(value))}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, link_first: bool = False,
          empty: str = "none", caption: str | None = None, fit: bool = False,
          long: Collection[int] = (), lead: tuple[Cell, Sequence[Cell]] | None = None) -> str:
    """An HTML table in its own scrolling container; with ``link_first`` the first column
    is a job id linking to its page. With ``fit`` it is as wide as its container and its
    cells wrap, those of the ``long`` columns (indices) anywhere in a word, so a long
    URL or name never pushes a column out of view. ``lead``: a column before the others,
    its header cell and one cell per row, whole ``<th>``/``<td>`` elements (the call
    list's checkboxes)."""
    head = ("" if lead is None else lead[0].html) + "".join(
        f'<th scope="col">{escape(h)}</th>' for h in headers)
    body = []
    for n, row in enumerate(rows):
        first = (f'<td><a href="{escape(job_href(row[0]))}">{escape(str(row[0]))}</a></td>'
                 if link_first else _cell(row[0]))
        rest = "".join(_cell(v, ' class="long"' if i in long else "")
                       for i, v in enumerate(row[1:], 1))
        pick = "" if lead is None else lead[1][n].html
        body.append(f"<tr>{pick}{first}{rest}</tr>")
    if not body:
        return f'<p class="muted">{escape(empty)}</p>'
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    cls = "scroll fit" if fit else "scroll"
    return (f'<div class="{cls}" tabindex="0"><table>{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _nav(current: str) -> str:
    links = [("/", "Overview"), ("/jobs", "Calls"), ("/waiting", "Waiting")]
    here = ' aria-current="page"'
    items = "".join(f'<a href="{href}"{here if href == current else ""}>{name}</a>'
                    for href, name in links)
    return (f'<header class="top"><a class="brand" href="/">callwarden</a>'
            f'<nav aria-label="main">{items}</nav>'
            '<form class="search" action="/jobs" method="get" role="search">'
            '<label for="q">Job id or task id</label> <input id="q" name="q" size="36" '
            'autocomplete="off"> <button type="submit">Search</button></form></header>')


def page(title: str, body: str, *, current: str = "") -> str:
    """A complete page: ``body`` is markup its producer escaped."""
    v = ASSET_VERSION
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>{escape(title)} - callwarden</title>"
            f'<link rel="stylesheet" href="/static/callwarden.css?v={v}">'
            f'<script src="/static/callwarden.js?v={v}" defer></script></head>'
            '<body><a class="skip" href="#main">Skip to content</a>'
            f'{_nav(current)}<main id="main" tabindex="-1"><h1>{escape(title)}</h1>'
            f"{body}</main></body></html>")
