"""The provider accounts' limits and the jobs waiting for a slot (pure; docs/admission.md,
issue 42): a start the account's limits refused writes nothing to the job, only its row of
``callwarden.waiting`` (the reason, since when, when to try again, how many refusals), so
such a job has no call yet and the call list cannot show it.

:func:`limits_card`: the overview's card of ``callwarden.limits`` (``limits_show``),
one line per account (its kinds, its calls in flight now over its cap, its other caps,
and how far the provider's 429s slowed or paused it), shown whenever an account is limited.

:func:`waiting_card`: the overview's card, one line per account with jobs waiting (how
many, the oldest wait, the soonest retry, the reasons), shown only when a job waits.
:func:`waiting_page`: the ``/waiting`` page, one row per waiting job, longest waiting
first. The rows are ``metrics_waiting``'s and ``dashboard_waiting``'s (service.sql); a
reason is redacted (:mod:`.redaction`: a host may write the rows itself) and escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from callwarden.service.dashboard.format import duration
from callwarden.service.dashboard.html import table
from callwarden.service.dashboard.redaction import redact_text

__all__ = ["PAGE", "limits_card", "retry_in", "waiting_card", "waiting_page"]

Row = Mapping[str, Any]
PAGE = 200  # waiting jobs on the page (the oldest first)
_REASONS = 3  # an account's reasons shown on the overview (the rest counted)


def retry_in(retry_at: datetime | None, now: datetime) -> str:
    """When a waiting job is tried again: ``"in 2.0 s"``, or ``"due"`` once the time has
    passed (its worker or host has not retried yet)."""
    if retry_at is None:
        return "-"
    left = (retry_at - now).total_seconds()
    return "due" if left <= 0 else f"in {duration(left)}"


def _since(at: datetime | None, now: datetime) -> str:
    return "-" if at is None else duration(max(0.0, (now - at).total_seconds()))


def _reasons(reasons: Sequence[str]) -> str:
    shown = [redact_text(r) for r in reasons[:_REASONS]]
    more = len(reasons) - len(shown)
    return "; ".join(shown) + (f" (+{more} more)" if more > 0 else "")


def _in_flight(a: Row) -> str:
    """``"3 / 5"``: the calls open now over the cap; a slowed account's cap is what it
    admits now (``"3 / 2 of 5"``, as ``callwarden.admit`` floors it)."""
    open_calls, cap = int(a["open_calls"]), a["in_flight"]
    if cap is None:
        return f"{open_calls} (no cap)"
    factor = float(a["rate_factor"])
    if factor < 1:
        return f"{open_calls} / {max(1, math.floor(cap * factor))} of {cap}"
    return f"{open_calls} / {cap}"


def _rate(factor: float) -> str:
    return f"slowed to \u00d7{factor:.2f} by the provider's 429s" if factor < 1 else "full"


def limits_card(accounts: Sequence[Row]) -> str:
    """The overview's Limits card (empty when ``callwarden.limits`` has no row): per
    account its kinds, its calls in flight now over its cap, the per-user cap, the creates
    per window, the share of its caps the provider's 429s left it and the pause left."""
    if not accounts:
        return ""
    rows = [[a["account"], ", ".join(a["kinds"] or ()), _in_flight(a), a["tenant_in_flight"],
             None if a["creates"] is None else f"{a['creates']} per {duration(a['per_s'])}",
             _rate(float(a["rate_factor"])),
             f"{duration(a['paused_s'])} left" if a["paused_s"] else None]
            for a in accounts]
    return ('<section class="card wide" aria-labelledby="limits-h">'
            f'<h2 id="limits-h">Limits: {len(accounts)} provider account(s)</h2>'
            + table(["account", "kinds", "in flight / cap", "per user", "creates", "rate",
                     "paused"], rows, fit=True, long=(1,))
            + '<p class="muted">The caps of callwarden.limits (written by '
              "<code>callwarden limits apply</code> or by SQL): a call holds its account's "
              "slot from its start until it is terminal. A create the provider refused "
              "(429) pauses its account, then halves the caps it admits, one call's worth "
              "given back per wait.</p></section>")


def waiting_card(accounts: Sequence[Row], now: datetime) -> str:
    """The overview's card (empty when no job waits): per account with jobs waiting,
    their count, the oldest wait, the soonest retry and the reasons of the refusals."""
    busy = [a for a in accounts if int(a["jobs"]) > 0]
    if not busy:
        return ""
    total = sum(int(a["jobs"]) for a in busy)
    rows = [[a["account"], int(a["jobs"]), _since(a["oldest"], now),
             retry_in(a["next_retry"], now), _reasons(list(a["reasons"] or []))]
            for a in busy]
    return ('<section class="card wide" aria-labelledby="waiting-h">'
            f'<h2 id="waiting-h">Waiting for a slot: {total} job(s)</h2>'
            + table(["account", "waiting", "oldest", "next retry", "reasons"], rows, fit=True,
                    long=(4,))
            + '<p class="muted">Starts refused by a provider account\'s limits: the jobs '
              'have no call yet and start when a slot frees. '
              '<a href="/waiting">Every waiting job</a></p></section>')


def waiting_page(rows: Sequence[Row], now: datetime, *, limit: int = PAGE) -> str:
    """One row per waiting job (up to ``limit``; ``rows`` may hold one more, which says
    more wait): the job, its user, the account, how long it has waited, when it is tried
    again, the refusals and the latest reason."""
    shown = rows[:limit]
    body = table(["job", "user", "account", "waiting", "retry", "refusals", "reason"], (
        [r["id"], r["user_id"], r["account"], _since(r["since"], now),
         retry_in(r["retry_at"], now), r["refusals"], redact_text(str(r["reason"]))]
        for r in shown), link_first=True, empty="no job waits for a slot")
    count = (f"the {limit} waiting longest shown; more wait" if len(rows) > limit
             else f"{len(shown)} job(s) waiting")
    return ('<p class="muted">Jobs whose start a provider account\'s limits refused '
            "(docs/admission.md): nothing was written to the job; it starts when a slot "
            "frees, at its retry or later. Longest waiting first.</p>"
            f'<p class="muted" role="status">{escape(count)}</p>' + body)
