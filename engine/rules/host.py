"""The host's decision wins (DESIGN §10): the pure rule every writer applies first.

Host code shares the ``jobs`` row and may complete, fail or cancel a job with plain SQL at
any moment. A call that is still open in callwarden's log while the row's ``status`` is
not ``pending``/``processing`` was ended by the host: whatever an actor meant to record,
:class:`~callwarden.events.types.HostEnded` is recorded instead, so the call ends as the host
decided
and nothing the host wrote is overwritten.
"""

from __future__ import annotations

from datetime import datetime

from callwarden.events.states import OPEN_STATUSES
from callwarden.events.types import HostEnded
from callwarden.projections.fold import CallProjection

__all__ = ["host_ended", "host_status_ended", "job_ended_by_host"]


def job_ended_by_host(p: CallProjection) -> bool:
    """The row's status (as read) says host code ended the job, and callwarden's call is
    not terminal (or there is none). ``NULL`` counts as pending."""
    return not p.terminal and p.status is not None and p.status not in OPEN_STATUSES


def host_status_ended(p: CallProjection) -> bool:
    """The host ended the job while callwarden's call is open: the call must end as the
    host decided (a job with no call is simply the host's; nothing is recorded)."""
    return p.state is not None and job_ended_by_host(p)


def host_ended(p: CallProjection, *, at: datetime, actor: str) -> HostEnded | None:
    """The event recording the host's decision on an open call, or ``None`` when the host
    has not ended it."""
    if not host_status_ended(p):
        return None
    assert p.status is not None
    return HostEnded(at=at, actor=actor, status=p.status)
