"""What an answer from a provider means for the log: the one event that records a poll's or
a sync call's outcome, whoever saw it (the worker, the reconciler, the webhook receiver,
the host's own call)."""

from __future__ import annotations

from datetime import datetime

from callwarden.events.types import Event, Swept, UpstreamFailed, UpstreamResult, UpstreamSucceeded
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Succeeded

__all__ = ["upstream_event"]


def upstream_event(outcome: PollOutcome, actor: str, now: datetime, *,
                   stored_keys: tuple[str, ...] = ()) -> Event | None:
    """The event recording a poll/call outcome (``None`` while still running);
    ``stored_keys``: inline media the worker already stored under the job's keys."""
    if isinstance(outcome, Succeeded):
        return UpstreamSucceeded(at=now, actor=actor, result=UpstreamResult(
            media_urls=outcome.media_urls, text=outcome.text, cost=outcome.cost,
            raw=outcome.raw, stored_keys=stored_keys, usage=outcome.usage,
            stop_reason=outcome.stop_reason))
    if isinstance(outcome, Failed):
        return UpstreamFailed(at=now, actor=actor, error=outcome.error, code=outcome.code)
    if isinstance(outcome, NotFound):
        return Swept(at=now, actor=actor, reason="upstream_task_not_found")
    return None
