"""How long a refused call waits before it asks again, spread (the calls one refusal stopped
together, by a full account or a provider's 429, do not all come back at the same instant),
and what a call says when the provider's 429s outlast its wait."""

from __future__ import annotations

import random

__all__ = ["jittered", "rate_limited_error", "rate_limited_pause"]


def jittered(delay_s: float) -> float:
    """``delay_s`` plus up to a quarter of it."""
    return delay_s * (1 + random.random() / 4)


def rate_limited_pause(paused_s: float, retry_after_s: float | None) -> float:
    """How long a create the provider answered 429 waits before creating again: its
    account's pause (``callwarden.slow_down``), or the provider's ``Retry-After`` when that
    is longer, at least 50 ms, :func:`jittered`."""
    return jittered(max(paused_s, retry_after_s or 0.0, 0.05))


def rate_limited_error(error: str, account: str | None, wait_s: float) -> str:
    """The error a call fails with when the provider's 429 ends it: the provider's text, and
    for a limited ``account`` the wait (``rate_limited_wait_s``) that ran out."""
    return error if account is None else (
        f"{error} (account {account}: the provider refused every create for "
        f"rate_limited_wait_s, {wait_s:g} s)")
