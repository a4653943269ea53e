"""How a queue keeps a job through a database outage (issue 24, item 1).

A try of a job that met :class:`~callwarden.errors.DatabaseUnavailable` changed nothing
that matters: a transition that failed was not written, and what it did write (say
``CallStarted``) the next try resumes from. Trying it again later is always safe, while
giving it up would need the database too. So the Celery and arq integrations never fail,
ack or give up a job because the database is unreachable: they hand it back to their
queue with a delay (arq ``Retry(defer=)``, Celery ``retry(countdown=)``), for as long as
the outage lasts, and it runs once the database answers. Such retries are not
deliveries: they count towards neither arq's ``max_deliveries`` (a give-up for a job that
kills or breaks its worker) nor Celery's ``max_retries``.

:class:`OutageRetries` is the schedule, derived from the outage limit every actor rides
through (``CALLWARDEN_DB_OUTAGE_LIMIT_S``, 300 s by default): delays double from 1 s up
to a fifth of the limit (60 s at most), so that the first :attr:`~OutageRetries.within_limit`
retries cover the limit (the queue's budget for an outage shorter than it: 10 retries,
303 s of delays, by default); a job still meeting the outage after them is reported once,
as an error, and stays queued, retried every :attr:`~OutageRetries.step_s` until the
database answers. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from callwarden.database.outage import DEFAULT_LIMIT_S, configured_limit_s

__all__ = ["OutageRetries"]

#: How long one try waits for a pooled connection at most (the pool's own default).
MAX_WAIT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class OutageRetries:
    """The delays before each retry of a job that met a database outage.

    ``limit_s``: the outage limit (:func:`~callwarden.database.outage.configured_limit_s`);
    ``first_s``: the first delay; ``max_step_s``: the longest delay, whatever the limit."""

    limit_s: float = DEFAULT_LIMIT_S
    first_s: float = 1.0
    max_step_s: float = 60.0

    def __post_init__(self) -> None:
        if not (self.limit_s > 0 and self.first_s > 0 and self.max_step_s > 0):
            raise ValueError("limit_s, first_s and max_step_s must be > 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OutageRetries:
        """The schedule for ``CALLWARDEN_DB_OUTAGE_LIMIT_S`` (a bad value is a
        :class:`~callwarden.errors.ConfigError` naming it)."""
        return cls(limit_s=configured_limit_s(env))

    @property
    def step_s(self) -> float:
        """The longest delay: a fifth of the limit (at most ``max_step_s``), so a job
        past the limit is retried at least five times per limit's length."""
        return min(self.max_step_s, self.limit_s / 5)

    @property
    def wait_s(self) -> float:
        """How long one try waits for a pooled connection before it meets the outage: a
        tenth of the limit, at most 30 s (the pool's default: unchanged at the default
        limit)."""
        return min(MAX_WAIT_S, self.limit_s / 10)

    def delay_s(self, retry: int) -> float:
        """The delay before retry ``retry`` (1 = the first) of a job."""
        if retry < 1:
            raise ValueError(f"retry counts from 1, got {retry}")
        return min(self.step_s, self.first_s * 2.0 ** min(retry - 1, 32))

    @property
    def within_limit(self) -> int:
        """The retries whose delays add up to the limit (the tries' own waits for a
        connection come on top): an outage shorter than the limit is over before them."""
        retries, total = 0, 0.0
        while total < self.limit_s:
            retries += 1
            total += self.delay_s(retries)
        return retries

    def past_limit(self, retry: int) -> bool:
        """Whether retry ``retry`` comes after the limit's budget is spent."""
        return retry > self.within_limit
