"""The pure half of the write path: what one append writes, decided before any I/O.

:func:`append_params` gives the ``append_event`` statement's parameters for an event moving
a projection to its fold (the one place they are built: the Postgres write path and the
benchmarks use it);
:class:`AppendResult` is what an append answers; :func:`recordable` makes an event
recordable (its error made safe, no NUL), and :func:`recorded` a run, with each event's
encoding (made once per append); :func:`observe` registers a hook on every
successful append. No I/O, no clock
(``callwarden.database.write`` re-exports every name).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from callwarden.events.codec import Encoded, encode
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    Exhausted,
    FinalizeFailed,
    HostEnded,
    LeftoverSettled,
    ReconcileAttempted,
    TaskCreated,
    UpstreamFailed,
)
from callwarden.projections.columns import to_columns
from callwarden.projections.fold import CallProjection
from callwarden.rules.redact import safe_error

__all__ = ["AppendResult", "Decide", "Settled", "Waiting", "append_params", "as_run", "check_run",
           "observe", "recordable", "recorded", "without_nul"]

Decide = Callable[[CallProjection], Event | None]
Settled = Literal["settled", "no_reservation", "already_settled"]

# What the write path moves a reservation to ("host": left to the host, see HostEnded).
_SETTLES = frozenset({"committed", "refunded"})


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """A start the account's limits refused (migrations/0018_admission.sql): nothing was
    written to the job or its log; ``reason`` names the limit, ``retry_after_s`` is when a
    start may be admitted (a slot's turn is not known: the limit's ``wait_s``)."""

    reason: str
    retry_after_s: float


class AppendResult(msgspec.Struct, frozen=True, kw_only=True):
    """``ok``: the event was appended. ``projection``: the call after the attempt (the
    winner's state when ``ok`` is false). ``settlement``: for a settling transition,
    whether this write moved the reservation, found none, or found it already settled.
    ``host_ended``: the host had ended the job; :class:`HostEnded` was recorded in place
    of the actor's event (``ok`` is false: the actor's own event was not appended).
    ``event``: the (last) event appended; ``events``: every event of the append, in order
    (one, or the run an actor decided at once). ``waiting``: a start refused by the
    account's limits (``ok`` is false; nothing was written)."""

    ok: bool
    projection: CallProjection
    event: Event | None = None
    events: tuple[Event, ...] = ()
    settlement: Settled | None = None
    host_ended: bool = False
    waiting: Waiting | None = None


_observers: list[Callable[[AppendResult], None]] = []


def observe(fn: Callable[[AppendResult], None]) -> None:
    """Call ``fn`` with every successful append of this process (metrics hook it here)."""
    if fn not in _observers:
        _observers.append(fn)


def _cost(new: CallProjection) -> float | None:
    """The credits a commit charges: the ``Completed`` event's (the pricing hook's), or
    ``None`` (the reservation); never negative or non-finite (the last line)."""
    cost = new.provider_cost
    if cost is None or not math.isfinite(cost):
        return None
    return max(cost, 0.0)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    return value


def without_nul(event: Event) -> Event:
    """``event`` with every NUL character (which Postgres refuses in text and jsonb) made
    U+FFFD: a provider's answer that carries one must still be recordable."""
    return _without_nul(event, encode(event))[0]


def _without_nul(event: Event, encoded: Encoded) -> tuple[Event, Encoded]:
    """:func:`without_nul` given ``event``'s encoding, and the encoding of what it
    answers (the same one when there was no NUL: an event is encoded once per append)."""
    if b"\\u0000" not in encoded[2]:
        return event, encoded
    clean = msgspec.convert(_scrub(msgspec.to_builtins(event)), type(event))
    return clean, encode(clean)


#: The events that carry an error text, and its field.
_ERROR_FIELDS: dict[type, str] = {UpstreamFailed: "error", FinalizeFailed: "error",
                                  ReconcileAttempted: "error", Exhausted: "last_error"}


def recordable(event: Event) -> Event:
    """``event`` as it may be recorded: its error text made safe
    (:func:`callwarden.rules.redact.safe_error`: no credentials, no query strings, bounded)
    and no NUL anywhere. The write path applies it to every event it appends."""
    return recorded([event])[0][0]


def recorded(events: Sequence[Event]) -> tuple[list[Event], list[Encoded]]:
    """Each of ``events`` made :func:`recordable`, and its ``call_events`` encoding
    (:func:`callwarden.events.codec.encode`): what the write path appends, each event
    encoded once."""
    out: list[Event] = []
    codes: list[Encoded] = []
    for event in events:
        field = _ERROR_FIELDS.get(type(event))
        text = getattr(event, field) if field is not None else None
        if isinstance(text, str):
            safe = safe_error(text)
            if safe != text:
                event = msgspec.structs.replace(event, **{field: safe})  # type: ignore[arg-type]
        event, code = _without_nul(event, encode(event))
        out.append(event)
        codes.append(code)
    return out, codes


def append_params(job_id: uuid.UUID, current: CallProjection, new: CallProjection,
                  events: Sequence[Event], encoded: Sequence[Encoded] | None = None
                  ) -> dict[str, Any]:
    """The ``append_event`` statement's parameters for ``events`` (one, or a run one
    actor decided at once) moving ``current`` to ``new`` (their fold): the one place they
    are built (the benchmarks use it too). The fences are the first event's: a start or a
    host's decision comes alone (:func:`check_run`). ``encoded``: the events' encodings,
    when the caller has them (:func:`recorded`)."""
    first = events[0]
    if encoded is None:
        encoded = [encode(e) for e in events]
    beat = next((e for e in reversed(events) if isinstance(e, TaskCreated)), None)
    # a terminal transition settles; so does the policy's settlement of what the host left
    # (LeftoverSettled, completed -> completed)
    settling = (new.terminal and not current.terminal) or isinstance(first, LeftoverSettled)
    is_start = isinstance(first, CallStarted)
    params = to_columns(new)
    params.update(
        job_id=job_id, expected_version=current.version,
        events=_rows_json.encode([
            _EventRow(type=t, version=v, payload=msgspec.Raw(p), actor=e.actor)
            for (t, v, p), e in zip(encoded, events, strict=True)]).decode(),
        is_start=is_start, is_completion=any(isinstance(e, Completed) for e in events),
        owns_seed=new.provider_kind is not None,
        host_status=first.status if isinstance(first, HostEnded | LeftoverSettled) else None,
        expected_settled=current.settled_reservations,  # (append_start has no such fence)
        settle_to=new.settlement if settling and new.settlement in _SETTLES else None,
        # what the host left is committed at the reservation (the row's provider_cost, if
        # the host wrote one, is in the provider's units, not credits)
        cost=None if isinstance(first, LeftoverSettled) else _cost(new),
        beat_at=beat.at if beat is not None else None,
        beat_owner=beat.actor if beat is not None else None,
    )
    return params


class _EventRow(msgspec.Struct, frozen=True):
    """One element of the ``events`` parameter (queries.sql, fragment ``event_rows``)."""

    type: str
    version: int
    payload: msgspec.Raw  # the event as encoded once, embedded as it is
    actor: str


_rows_json = msgspec.json.Encoder()


def as_run(event: Event | Sequence[Event]) -> tuple[Event, ...]:
    """One event, or a run of them, as a run."""
    return (event,) if isinstance(event, msgspec.Struct) else tuple(event)


def check_run(events: Sequence[Event]) -> None:
    """A run of events appended at once: not empty, and a start or a host's decision
    (whose fences are their own) only alone."""
    if not events:
        raise ValueError("nothing to append")
    if len(events) > 1 and any(isinstance(e, CallStarted | HostEnded | LeftoverSettled)
                               for e in events):
        raise ValueError("CallStarted, HostEnded and LeftoverSettled are appended alone")


def _settled(settle_to: str | None, row: Mapping[str, Any]) -> Settled | None:
    if settle_to is None:
        return None
    if row["settled"]:
        return "settled"
    return "already_settled" if row["reservations"] else "no_reservation"
