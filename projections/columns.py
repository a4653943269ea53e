"""Between a :class:`CallProjection` and the ``jobs`` row's columns (pure conversions).

``to_columns`` gives the values the append statement writes; ``from_row`` rebuilds the
projection from a row read back, so a writer can fold one more event onto it without
reading the log.

Only callwarden's own columns are parsed: the result media live in ``call_output``
(callwarden's), never read back from the host's ``output_data`` (whatever shape the host
keeps there). A callwarden column that does not decode (host code wrote over it) raises
:class:`ProjectionUnreadable` naming the column; the engine then folds the job's log
instead, which is the truth the columns only cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.events.states import CallState
from callwarden.events.types import StoredMedia, UpstreamResult
from callwarden.projections.fold import CallProjection

__all__ = ["READ_COLUMNS", "ProjectionUnreadable", "as_float", "call_output", "from_row",
           "to_columns"]

#: The ``jobs`` columns :func:`from_row` reads: every statement whose rows become a
#: projection (``load_projection``, ``reconcile_claim``, ``audit_histories``) returns each of
#: them (``tests/unit/test_projection_writes.py`` checks all three and ``from_row``).
#: ``settled_reservations`` is read when present (the write path's fence).
READ_COLUMNS = ("status", "call_state", "call_version", "provider_kind", "provider_task_id",
                "provider_call_started_at", "call_sync", "reconcile_attempts",
                "reconcile_last_error", "reconcile_next_at", "error_message",
                "finalize_owner", "finalize_lease_until", "upstream_result", "call_output",
                "provider_cost", "call_finished_at", "call_settlement")

_enc = msgspec.json.Encoder()
_result_dec = msgspec.json.Decoder(UpstreamResult)


class _Output(msgspec.Struct, frozen=True, omit_defaults=True):
    """``call_output`` (and what is merged into the host's ``output_data``)."""

    media: tuple[StoredMedia, ...]
    text: str | None = None
    stop_reason: str | None = None


_out_dec = msgspec.json.Decoder(_Output)


class ProjectionUnreadable(CallwardenError, ValueError):
    """A callwarden column of the row does not decode (``column`` names it)."""

    def __init__(self, column: str, detail: str) -> None:
        super().__init__(f"column {column} is unreadable: {detail}")
        self.column = column


def call_output(p: CallProjection) -> str | None:
    """The ``call_output`` JSON the call sets once completed (also merged into the host's
    ``output_data`` by the append statement)."""
    if p.output_media is None:
        return None
    out = _Output(p.output_media, text=p.output_text, stop_reason=p.output_stop_reason)
    return _enc.encode(out).decode()


def to_columns(p: CallProjection) -> dict[str, Any]:
    """Column values for the append statement (JSON columns as text)."""
    return {
        "call_state": p.state.value if p.state is not None else None,
        "new_version": p.version,
        # A created call leaves the host's pending/processing as it is (the status read
        # may be stale: writing it back would undo a host's flip to processing).
        "status": p.status if p.state not in (None, CallState.CREATED) else None,
        "provider_kind": p.provider_kind,
        "provider_task_id": p.provider_task_id,
        "provider_call_started_at": p.provider_call_started_at,
        "call_sync": p.call_sync,
        "reconcile_attempts": p.reconcile_attempts,
        "reconcile_last_error": p.reconcile_last_error,
        "reconcile_next_at": p.reconcile_next_at,
        "error_message": p.error_message,
        "finalize_owner": p.finalize_owner,
        "finalize_lease_until": p.finalize_lease_until,
        "upstream_result": (_enc.encode(p.upstream_result).decode()
                            if p.upstream_result is not None else None),
        "call_output": call_output(p),
        "provider_cost": p.provider_cost,
        "call_finished_at": p.call_finished_at,
        "call_settlement": p.settlement,
    }


def as_float(value: Decimal | float | None) -> float | None:
    """A ``numeric`` column as a float (``None`` stays ``None``)."""
    return None if value is None else float(value)


def _output(raw: str | None) -> _Output | None:
    if raw is None:
        return None
    try:
        return _out_dec.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProjectionUnreadable("call_output", str(exc)) from exc


def _result(raw: str | None) -> UpstreamResult | None:
    if raw is None:
        return None
    try:
        return _result_dec.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProjectionUnreadable("upstream_result", str(exc)) from exc


def _state(raw: str | None) -> CallState | None:
    try:
        return CallState(raw) if raw is not None else None
    except ValueError as exc:
        raise ProjectionUnreadable("call_state", str(exc)) from exc


def from_row(row: Mapping[str, Any]) -> CallProjection:
    """The projection stored in a ``jobs`` row (as read by ``load_projection``);
    :class:`ProjectionUnreadable` if one of callwarden's columns does not decode."""
    output = _output(row["call_output"])
    return CallProjection(
        state=_state(row["call_state"]),
        version=row["call_version"],
        status=row["status"],
        provider_kind=row["provider_kind"],
        provider_task_id=row["provider_task_id"],
        provider_call_started_at=row["provider_call_started_at"],
        call_sync=row["call_sync"],
        reconcile_attempts=row["reconcile_attempts"],
        reconcile_last_error=row["reconcile_last_error"],
        reconcile_next_at=row["reconcile_next_at"],
        error_message=row["error_message"],
        finalize_owner=row["finalize_owner"],
        finalize_lease_until=row["finalize_lease_until"],
        upstream_result=_result(row["upstream_result"]),
        output_media=output.media if output is not None else None,
        output_text=output.text if output is not None else None,
        output_stop_reason=output.stop_reason if output is not None else None,
        provider_cost=as_float(row["provider_cost"]),
        call_finished_at=row["call_finished_at"],
        settlement=row["call_settlement"],
        settled_reservations=int(row.get("settled_reservations") or 0),
    )
