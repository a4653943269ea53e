"""What a webhook body says, per provider and family: ``body -> (task id, outcome)`` (pure).

No I/O and no clock: the receiver (:mod:`engine.service.webhooks`) verifies signatures, finds the
job and records the outcome; this module only reads bodies. It reuses the providers' own
parsers where the callback has the poll's shape (Replicate's prediction object, an
ElevenLabs dubbing object).

- Replicate: the body is the prediction (or training) object -> ``parse_prediction``.
  ``starting``/``processing`` (the ``start`` and ``output`` events) are intermediate.
  ``data_removed`` -> ``Failed(code="result_gone")``.
- KIE: ``{"code", "msg", "data"}``: only the task id is read (``data.taskId``, or
  ``data.task_id`` for Suno and Runway). KIE signs only ``taskId.timestamp``, so the rest of
  the body is never trusted: the receiver polls the task and records what the poll says.
- ElevenLabs (workspace webhooks): ``{"type", "data"}``. ``speech_to_text_transcription``
  (``data.request_id``, ``data.transcription.text``) is read; any other type is ignored.
  There is no dubbing webhook: the SDK's workspace event types are
  ``voice_library_removal_notice``, ``speech_to_text`` and ``agent_qa``, and
  ``POST /v1/dubbing`` takes no webhook (docs/providers.md) — dubs are polled.

Anything else raises :class:`MalformedDelivery` (the receiver answers 400, changes nothing).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from providers.errors import MediaExpired, ProviderError
from providers.outcomes import Failed, PollOutcome, Running, Succeeded
from providers.raw import JSONTooDeep, RawResponse, decode_json
from providers.replicate import parse_prediction

__all__ = [
    "ELEVENLABS_KINDS",
    "REPLICATE_KINDS",
    "MalformedDelivery",
    "Parsed",
    "kie_task_id",
    "parse_elevenlabs",
    "parse_replicate",
]

REPLICATE_KINDS: Final = ("replicate-prediction", "replicate-training")
ELEVENLABS_KINDS: Final = ("elevenlabs-async", "elevenlabs-sync")


class MalformedDelivery(ValueError):
    """The body is not a delivery this receiver understands."""


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """One delivery: the upstream task it is about and what it says (``Running`` for an
    intermediate stage, acknowledged without a transition)."""

    task_id: str
    outcome: PollOutcome

    @property
    def intermediate(self) -> bool:
        return isinstance(self.outcome, Running)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = decode_json(body)
    except (msgspec.DecodeError, JSONTooDeep) as exc:
        raise MalformedDelivery(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedDelivery("body is not a JSON object")
    return doc


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedDelivery(f"delivery without {what}")
    return value


def _urls(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(u for u in value if isinstance(u, str) and u)


# -- Replicate -------------------------------------------------------------------------------

def parse_replicate(body: bytes) -> Parsed:
    """A Replicate webhook body (prediction or training object)."""
    doc = _json_object(body)
    task_id = _text(doc.get("id"), "id")
    raw = RawResponse(status=200, headers={}, body=body)
    try:
        outcome = parse_prediction(raw)
    except MediaExpired as exc:
        outcome = Failed(error=f"result expired: {exc}", code="result_gone")
    except ProviderError as exc:
        raise MalformedDelivery(str(exc)) from None
    return Parsed(task_id=task_id, outcome=outcome)


# -- KIE -------------------------------------------------------------------------------------

def _kie_envelope(body: bytes) -> tuple[int, str, dict[str, Any]]:
    doc = _json_object(body)
    code, data = doc.get("code"), doc.get("data")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(data, dict):
        raise MalformedDelivery("KIE callback is not a {code, msg, data: {...}} envelope")
    msg = doc.get("msg", doc.get("message"))
    return code, msg if isinstance(msg, str) else "", data


def kie_task_id(body: bytes) -> str:
    """The task id a KIE callback is about (``data.taskId`` or ``data.task_id``); the KIE
    HMAC signs it, not the body."""
    _, _, data = _kie_envelope(body)
    return _text(data.get("taskId") or data.get("task_id"), "data.taskId or data.task_id")


# -- ElevenLabs ------------------------------------------------------------------------------

def _transcription(data: dict[str, Any]) -> Parsed:
    task_id = _text(data.get("request_id") or data.get("transcription_id"),
                    "data.request_id")
    error = data.get("error")
    if isinstance(error, str) and error:
        return Parsed(task_id=task_id, outcome=Failed(error=error, raw=data))
    result = data.get("transcription")
    text = result.get("text") if isinstance(result, dict) else None
    if not isinstance(text, str):
        raise MalformedDelivery("transcription webhook without data.transcription.text")
    return Parsed(task_id=task_id, outcome=Succeeded(text=text, raw=data))


def parse_elevenlabs(body: bytes) -> Parsed | None:
    """An ElevenLabs workspace webhook; ``None`` for an event type that concerns no call
    (voice removal notices, agent transcripts...)."""
    doc = _json_object(body)
    kind, data = doc.get("type"), doc.get("data")
    if not isinstance(kind, str) or not isinstance(data, dict):
        raise MalformedDelivery("ElevenLabs webhook is not a {type, data: {...}} object")
    if kind == "speech_to_text_transcription":
        return _transcription(data)
    return None
