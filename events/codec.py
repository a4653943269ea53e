"""Encoding events for the log and decoding them back, with schema evolution in one place.

A stored event is ``(type, version, payload)`` where ``payload`` is the JSON of the struct
(tag included). Decoding the current version goes straight through one reusable typed
decoder; an older version is decoded generically, passed through the registered upcasters
(``v1 -> v2 -> ...``), then converted. Anything that cannot be decoded raises
:class:`EventDecodeError` naming the job and seq: nothing is skipped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.events.types import EVENT_TYPES, VERSIONS, Event

__all__ = [
    "Encoded",
    "EventDecodeError",
    "UnknownEventType",
    "decode",
    "encode",
    "register_upcaster",
]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)
_generic = msgspec.json.Decoder(dict[str, Any])
# (type, from_version) -> function producing the payload of from_version + 1
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class EventDecodeError(CallwardenError):
    """A stored event could not be decoded; names the job and seq."""

    def __init__(self, job_id: object, seq: int, reason: str) -> None:
        super().__init__(f"job {job_id} seq {seq}: {reason}")
        self.job_id = job_id
        self.seq = seq
        self.reason = reason


class UnknownEventType(EventDecodeError):
    """The stored ``type`` names no event this version of callwarden knows."""


def register_upcaster(type_name: str, from_version: int, fn: Upcaster) -> None:
    """Register how a ``type_name`` payload of ``from_version`` becomes the next version."""
    _UPCASTERS[(type_name, from_version)] = fn


#: ``(type, version, payload)``: an event as its ``call_events`` row stores it.
Encoded = tuple[str, int, bytes]


def encode(event: Event) -> Encoded:
    """``(type, version, payload)`` for the ``call_events`` row."""
    name = type(event).__name__
    return name, VERSIONS[name], _encoder.encode(event)


def _upcast(type_name: str, version: int, payload: bytes, job_id: object, seq: int) -> Event:
    data = _generic.decode(payload)
    current = VERSIONS[type_name]
    while version < current:
        step = _UPCASTERS.get((type_name, version))
        if step is None:
            raise EventDecodeError(job_id, seq, f"no upcaster for {type_name} v{version}")
        try:
            data = step(data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a garbage payload
            raise EventDecodeError(job_id, seq, f"cannot upcast {type_name} v{version}: "
                                   f"{exc}") from exc
        version += 1
    data["type"] = type_name
    return msgspec.convert(data, EVENT_TYPES[type_name])


def decode(
    type_name: str, version: int, payload: bytes | str, *, job_id: object = None, seq: int = 0
) -> Event:
    """The event stored as ``(type_name, version, payload)``."""
    current = VERSIONS.get(type_name)
    if current is None:
        raise UnknownEventType(job_id, seq, f"unknown event type {type_name!r}")
    if version > current or version < 1:
        raise EventDecodeError(job_id, seq, f"{type_name} has no version {version}")
    try:
        if version == current:
            event = _decoder.decode(payload)
        else:
            event = _upcast(type_name, version,
                            payload if isinstance(payload, bytes) else payload.encode(),
                            job_id, seq)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EventDecodeError(job_id, seq, f"invalid {type_name} payload: {exc}") from exc
    if type(event).__name__ != type_name:
        raise EventDecodeError(
            job_id, seq, f"type column {type_name!r} disagrees with payload tag "
            f"{type(event).__name__!r}")
    return event


# -- the upcasters of callwarden's own schema history ------------------------------------------

def _upstream_succeeded_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 kept inline-stored keys in ``result.raw["prestored_keys"]``; v2 has them in
    ``result.stored_keys`` (the finalizer still only accepts keys under the job's own
    prefix, so a key a provider slipped into an old ``raw`` cannot name another job)."""
    result = dict(data.get("result") or {})
    raw = dict(result.get("raw") or {})
    keys = raw.pop("prestored_keys", None)
    if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
        result["stored_keys"] = keys
    result["raw"] = raw
    return {**data, "result": result}


register_upcaster("UpstreamSucceeded", 1, _upstream_succeeded_v1)
