"""Does the stored projection tell the truth? Pure comparison of a ``jobs`` row (as a
projection) and its reservation with the fold of the job's events."""

from __future__ import annotations

from typing import Any

import msgspec

from callwarden.events.states import HOST_SETTLES, OPEN_STATUSES
from callwarden.projections.fold import OBSERVED_FIELDS, CallProjection

__all__ = ["OPTIONAL_FIELDS", "SEED_FIELDS", "Mismatch", "compare", "compare_settlement"]

# Fields the fold leaves to the host when it has nothing to say (None = "not set"): the
# host's own columns (provider_cost: the original design's host writes it when it
# completes a job itself). (The media are read from call_output, callwarden's own since
# migration 0006: media on a call its log never completed are a lie, not the host's.)
OPTIONAL_FIELDS = frozenset({"status", "error_message", "provider_cost"})
# The original design's columns: the host's own until a call owns them (CallStarted or Adopted set
# provider_kind); a log that never did (a cancel of a job whose call never started) leaves
# them as the host wrote them.
SEED_FIELDS = frozenset({"provider_kind", "provider_task_id", "provider_call_started_at",
                         "reconcile_attempts", "reconcile_last_error"})
_FIELDS = tuple(f for f in CallProjection.__struct_fields__ if f not in OBSERVED_FIELDS)


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    column: str
    projected: Any
    folded: Any


def compare(job_id: object, stored: CallProjection, folded: CallProjection) -> list[Mismatch]:
    """Every field where the stored projection differs from the fold."""
    out = []
    owned = folded.provider_kind is not None
    host_ended = not folded.terminal and stored.status not in (None, *OPEN_STATUSES)
    for f in _FIELDS:
        want = getattr(folded, f)
        if (want is None and f in OPTIONAL_FIELDS) or (not owned and f in SEED_FIELDS):
            continue
        if f == "status" and host_ended:
            continue  # the host ended the job; HostEnded will record it
        have = getattr(stored, f)
        if have != want:
            out.append(Mismatch(job_id=str(job_id), column=f, projected=have, folded=want))
    return out


def compare_settlement(job_id: object, statuses: list[str], folded: CallProjection,
                       settled_by: list[int | None] | None = None) -> list[Mismatch]:
    """The job's ``usage_logs`` rows against the fold. ``statuses[i]`` is a row's status,
    ``settled_by[i]`` the seq of the call event that settled it (``None``: host code did,
    or nobody yet). A reservation callwarden settled must have been settled by the
    terminal event, as its state prescribes; a terminal call may leave none ``reserved``;
    one the host settled is the host's (the original design's "no reserved log: proceed without
    commit")."""
    if folded.state is None:
        return []
    by = settled_by if settled_by is not None else [None] * len(statuses)
    out = []
    for status, seq in zip(statuses, by, strict=True):
        if seq is not None:
            want = folded.settlement if folded.terminal and seq == folded.version else None
            if status != want:
                out.append(Mismatch(job_id=str(job_id), column="usage_logs.status",
                                    projected=f"{status} (by seq {seq})",
                                    folded=want or "not settled by the log"))
        elif status == "reserved" and folded.terminal and folded.settlement != HOST_SETTLES:
            out.append(Mismatch(job_id=str(job_id), column="usage_logs.status",
                                projected=status, folded=folded.settlement))
    return out
