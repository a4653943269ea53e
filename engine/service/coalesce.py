"""Per-job coalescing of the work a webhook triggers (issue 24, item 6): a callback URL
with no timestamp (KIE in token mode) can be replayed at will, so what a replay may cost
is bounded here, not by the sender.

- :class:`Throttle`: one piece of work per job in flight (single flight) and, when
  ``interval_s`` is set, none started sooner than that after the last one started. Time
  is passed in (the receiver's clock), so the class is pure.
- :func:`finalize_step`: what a signal about a call already in ``upstream_succeeded`` may
  do — finalize, wait for its re-poll time (``reconcile_next_at``), or end it at the
  attempt cap — the reconciler's rule, so a webhook-triggered finalization that fails
  counts towards the same cap.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import datetime
from typing import Literal

from callwarden.projections.fold import CallProjection

__all__ = ["Throttle", "finalize_step"]


class Throttle:
    """Admits one piece of work per job at a time, and (``interval_s`` > 0) at most one
    start per job per ``interval_s``. Holds a timestamp only for jobs started within the
    last interval, so its size is bounded by the rate of distinct jobs signalled."""

    def __init__(self, interval_s: float = 0.0) -> None:
        self.interval_s = interval_s
        self._busy: set[uuid.UUID] = set()
        self._started: OrderedDict[uuid.UUID, float] = OrderedDict()

    def begin(self, job: uuid.UUID, now: float, *, anyway: bool = False) -> bool:
        """Admit ``job``'s work at ``now`` (then :meth:`end` it), or refuse: its work is in
        flight, or (unless ``anyway``) started less than ``interval_s`` ago."""
        self._forget_before(now - self.interval_s)
        if job in self._busy:
            return False
        if not anyway and self.wait_s(job, now) > 0:
            return False
        self._busy.add(job)
        if self.interval_s > 0:
            self._started[job] = now
            self._started.move_to_end(job)
        return True

    def end(self, job: uuid.UUID) -> None:
        self._busy.discard(job)

    def forget(self, job: uuid.UUID) -> None:
        """As if ``job``'s last start never happened (its work failed on our side)."""
        self._started.pop(job, None)

    def wait_s(self, job: uuid.UUID, now: float) -> float:
        """How long until ``job``'s interval is over (0: it is)."""
        last = self._started.get(job)
        return 0.0 if last is None else max(0.0, self.interval_s - (now - last))

    def busy(self, job: uuid.UUID) -> bool:
        return job in self._busy

    def _forget_before(self, cutoff: float) -> None:
        while self._started:
            job, at = next(iter(self._started.items()))
            if at > cutoff:
                return
            del self._started[job]


def finalize_step(p: CallProjection, now: datetime, attempt_cap: int
                  ) -> Literal["finalize", "held", "exhaust"]:
    """For a call found in ``upstream_succeeded`` by a signal: ``exhaust`` at the attempt
    cap, ``held`` before its next attempt is due, else ``finalize``."""
    if p.reconcile_attempts >= attempt_cap:
        return "exhaust"
    if p.reconcile_next_at is not None and now < p.reconcile_next_at:
        return "held"
    return "finalize"
