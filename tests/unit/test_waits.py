"""The waits of a refused call (``callwarden.rules.waits``): spread, never shorter than
asked, and the text a call fails with when the provider's 429s outlast its wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from callwarden.rules.waits import jittered, rate_limited_error, rate_limited_pause

SECONDS = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@given(SECONDS)
def test_a_jittered_wait_is_the_wait_plus_at_most_a_quarter(delay: float) -> None:
    """Invariant: never shorter than asked, never more than a quarter longer."""
    assert delay <= jittered(delay) <= delay * 1.25


@given(SECONDS, st.none() | SECONDS)
def test_a_429_waits_the_longer_of_the_pause_and_retry_after(
        paused: float, retry_after: float | None) -> None:
    """Invariant: at least the account's pause, the provider's Retry-After and 50 ms,
    jittered by at most a quarter."""
    longest = max(paused, retry_after or 0.0, 0.05)
    assert longest <= rate_limited_pause(paused, retry_after) <= longest * 1.25


def test_the_error_names_the_account_and_the_wait_that_ran_out() -> None:
    assert rate_limited_error("HTTP 429", None, 300.0) == "HTTP 429"
    assert rate_limited_error("HTTP 429", "kie-main", 300.0) == (
        "HTTP 429 (account kie-main: the provider refused every create for "
        "rate_limited_wait_s, 300 s)")
