"""The log is the truth; the ``jobs`` row only caches it. Folding a job's log for a
decision (the reconciler) or a replay (``verify``, ``rebuild``) goes through here, so an
illegal history and a row that disagrees with its log are the same typed error
everywhere: :class:`~callwarden.events.codec.EventDecodeError`, naming the job and seq."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from callwarden.events.codec import EventDecodeError
from callwarden.events.states import InvalidTransition
from callwarden.events.types import Event
from callwarden.projections.fold import CallProjection, fold
from callwarden.projections.timeline import IllegalHistory, steps

__all__ = ["fold_checked", "fold_for_row"]


def fold_checked(job_id: uuid.UUID, events: Sequence[Event]) -> CallProjection:
    """The fold; an illegal sequence becomes :class:`EventDecodeError` naming its seq."""
    try:
        return fold(events)
    except InvalidTransition:
        try:
            for _ in steps(events):
                pass
        except IllegalHistory as exc:
            raise EventDecodeError(job_id, exc.seq, f"cannot replay: {exc.cause}") from exc
        raise


def fold_for_row(job_id: uuid.UUID, events: Sequence[Event], row_version: int
                 ) -> CallProjection:
    """The fold of ``events``, checked against the row's ``call_version``: a row whose
    version is not its log's length (host code bumped it, or rows were copied) is an
    :class:`EventDecodeError` at the first seq they disagree on."""
    folded = fold_checked(job_id, events)
    if folded.version != row_version:
        raise EventDecodeError(job_id, min(folded.version, row_version) + 1,
                               f"row at version {row_version} but the log has "
                               f"{folded.version} events")
    return folded
