"""Between a :class:`CallProjection` and the ``jobs`` row's columns (pure conversions).

``to_columns`` gives the values the append statement writes; ``from_row`` rebuilds the
projection from a row read back, so a writer can fold one more event onto it without
reading the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import msgspec

from events.states import CallState
from events.types import StoredMedia, UpstreamResult
from projections.fold import CallProjection

__all__ = ["as_float", "from_row", "output_data", "to_columns"]

_enc = msgspec.json.Encoder()
_result_dec = msgspec.json.Decoder(UpstreamResult)
_output_dec = msgspec.json.Decoder(dict[str, Any])


class _Output(msgspec.Struct, frozen=True):
    media: tuple[StoredMedia, ...]


def output_data(p: CallProjection) -> str | None:
    """The ``jobs.output_data`` JSON the call sets (only once completed)."""
    if p.output_media is None:
        return None
    return _enc.encode(_Output(p.output_media)).decode()


def to_columns(p: CallProjection) -> dict[str, Any]:
    """Column values for the append statement (JSON columns as text)."""
    return {
        "call_state": p.state.value if p.state is not None else None,
        "new_version": p.version,
        "status": p.status,
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
        "output_data": output_data(p),
        "provider_cost": p.provider_cost,
        "call_finished_at": p.call_finished_at,
        "call_settlement": p.settlement,
    }


def as_float(value: Decimal | float | None) -> float | None:
    """A ``numeric`` column as a float (``None`` stays ``None``)."""
    return None if value is None else float(value)


def _media(raw: str | None) -> tuple[StoredMedia, ...] | None:
    if raw is None:
        return None
    data = _output_dec.decode(raw)
    if "media" not in data:
        return None
    return msgspec.convert(data["media"], tuple[StoredMedia, ...])


def from_row(row: Mapping[str, Any]) -> CallProjection:
    """The projection stored in a ``jobs`` row (as read by ``load_projection``)."""
    state = row["call_state"]
    result = row["upstream_result"]
    return CallProjection(
        state=CallState(state) if state is not None else None,
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
        upstream_result=_result_dec.decode(result) if result is not None else None,
        output_media=_media(row["output_data"]),
        provider_cost=as_float(row["provider_cost"]),
        call_finished_at=row["call_finished_at"],
        settlement=row["call_settlement"],
    )
