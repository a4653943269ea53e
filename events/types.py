"""What happened to a job's external call: one frozen, tagged msgspec Struct per event.

Every event carries ``at`` (when it happened, timezone-aware, passed in: nothing here reads
a clock) and ``actor`` (who recorded it: ``worker:<incarnation>``, ``reconciler:<id>``,
``webhook``, ``user:<id>``, ``admin``...). The tag is the event's type name, stored in the
``call_events.type`` column; ``VERSIONS`` gives each type's current payload version.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

import msgspec

__all__ = [
    "EVENT_TYPES",
    "VERSIONS",
    "Adopted",
    "CallStarted",
    "Cancelled",
    "Completed",
    "Event",
    "Exhausted",
    "FinalizeClaimed",
    "FinalizeFailed",
    "HostEnded",
    "LeftoverSettled",
    "ReconcileAttempted",
    "StoredMedia",
    "Swept",
    "TaskCreated",
    "UpstreamFailed",
    "UpstreamResult",
    "UpstreamSucceeded",
]


class _Base(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    at: datetime
    actor: str
    VERSION: ClassVar[int] = 1


class UpstreamResult(msgspec.Struct, frozen=True, kw_only=True):
    """What upstream produced: URLs to download at once, text, the cost it reported (in
    the provider's own units), the usage it reported (normalised keys, see
    ``callwarden.providers.outcomes.Usage``) and, for a language model, why it stopped.

    ``stored_keys``: media a sync call returned inline (TTS audio), already stored by the
    worker under the job's own keys before the outcome was recorded. It is callwarden's
    field, never read from ``raw`` (the provider's own answer, which it controls)."""

    media_urls: tuple[str, ...] = ()
    text: str | None = None
    cost: float | None = None
    raw: dict[str, Any] = msgspec.field(default_factory=dict)
    stored_keys: tuple[str, ...] = ()
    usage: dict[str, float | str] = msgspec.field(default_factory=dict)
    stop_reason: str | None = None


class StoredMedia(msgspec.Struct, frozen=True, kw_only=True):
    """One result stored under its deterministic key."""

    key: str
    url: str
    content_type: str
    size: int


class CallStarted(_Base, frozen=True, kw_only=True, tag=True):
    """∅ → created. Written *before* the upstream create request (or the sync call)."""

    kind: str
    sync: bool = False


class Adopted(_Base, frozen=True, kw_only=True, tag=True):
    """∅ → created|polling: a row whose seed columns were written by non-callwarden code.
    Carries every seed column it observed, so the fold of the log keeps the host's
    ``reconcile_attempts`` and ``reconcile_last_error``."""

    kind: str
    task_id: str | None = None
    call_started_at: datetime | None = None
    observed_status: str | None = None
    sync: bool = False
    reconcile_attempts: int = 0
    reconcile_last_error: str | None = None


class TaskCreated(_Base, frozen=True, kw_only=True, tag=True):
    """created → polling: the upstream task id is persisted."""

    task_id: str


class UpstreamSucceeded(_Base, frozen=True, kw_only=True, tag=True):
    """created|polling → upstream_succeeded.

    Version 2 moved inline-stored keys from ``result.raw["prestored_keys"]`` (where the
    provider's own answer could forge them) to ``result.stored_keys``."""

    VERSION: ClassVar[int] = 2
    result: UpstreamResult


class UpstreamFailed(_Base, frozen=True, kw_only=True, tag=True):
    """created|polling → failed (refund); also from upstream_succeeded|finalizing when the
    result is gone before it could be stored (expired URL, Replicate ``data_removed``)."""

    error: str
    code: str | None = None


class FinalizeClaimed(_Base, frozen=True, kw_only=True, tag=True):
    """upstream_succeeded → finalizing, or finalizing → finalizing once the lease expired."""

    owner: str
    lease_until: datetime


class FinalizeFailed(_Base, frozen=True, kw_only=True, tag=True):
    """finalizing → upstream_succeeded (retried later)."""

    error: str


class Completed(_Base, frozen=True, kw_only=True, tag=True):
    """finalizing → completed (commit at ``cost`` credits — the pricing hook's answer, or
    ``None``: the reservation — never above the reservation). ``text`` and
    ``stop_reason``: a text result, and why the model stopped, as they go into the job's
    output."""

    media: tuple[StoredMedia, ...] = ()
    cost: float | None = None
    text: str | None = None
    stop_reason: str | None = None


class Swept(_Base, frozen=True, kw_only=True, tag=True):
    """created|polling → swept (refund): no recovery is possible."""

    reason: str = "reconcile_no_recovery"


class Exhausted(_Base, frozen=True, kw_only=True, tag=True):
    """any non-terminal → exhausted (refund): reconcile attempts hit the cap."""

    attempts: int
    last_error: str | None = None


class Cancelled(_Base, frozen=True, kw_only=True, tag=True):
    """any non-terminal (or a job whose call never started) → cancelled (refund)."""

    by: str


class HostEnded(_Base, frozen=True, kw_only=True, tag=True):
    """any non-terminal (or no call) → completed | cancelled | failed, as host code decided.

    The host wrote a terminal ``status`` on the row (``completed``, ``cancelled``, or any
    other value that is not ``pending``/``processing``: ``failed``) before callwarden's
    own transition could land. The call ends that way; the row's ``status`` and
    ``error_message`` stay as the host wrote them. A job the host cancelled or failed has
    what it left ``reserved`` refunded (what the host's own refund would do); one it
    *completed* is the host's to commit (settlement ``"host"``: only it knows the amount),
    and callwarden moves nothing (unless the host never does: :class:`LeftoverSettled`).
    Never a reservation the host settled itself."""

    status: str


class LeftoverSettled(_Base, frozen=True, kw_only=True, tag=True):
    """completed → completed: the host completed the job (``HostEnded``, settlement
    ``host``) and still left its reservation ``reserved`` ``[reconcile]
    host_left_after_s`` after callwarden recorded that (its commit failed, or it never
    commits). The reconciler's policy (``host_completed_reserved = "commit"``) settles it
    as ``settlement`` (``committed``: at the reservation) in this event's transaction, so
    no credit stays held forever. ``status``: the host's status it observed (the write's
    fence, as ``HostEnded``'s). The one event a terminal call takes, and only from
    settlement ``host``."""

    status: str
    settlement: str = "committed"


class ReconcileAttempted(_Base, frozen=True, kw_only=True, tag=True):
    """non-terminal → same state; ``reconcile_attempts += 1``."""

    outcome: str
    error: str | None = None
    next_attempt_at: datetime | None = None


Event = (
    CallStarted
    | Adopted
    | TaskCreated
    | UpstreamSucceeded
    | UpstreamFailed
    | FinalizeClaimed
    | FinalizeFailed
    | Completed
    | Swept
    | Exhausted
    | Cancelled
    | HostEnded
    | ReconcileAttempted
    | LeftoverSettled
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        CallStarted, Adopted, TaskCreated, UpstreamSucceeded, UpstreamFailed,
        FinalizeClaimed, FinalizeFailed, Completed, Swept, Exhausted, Cancelled,
        HostEnded, ReconcileAttempted, LeftoverSettled,
    )
}

VERSIONS: dict[str, int] = {name: cls.VERSION for name, cls in EVENT_TYPES.items()}
