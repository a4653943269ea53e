"""ElevenLabs workspace webhooks (pure): the signature and the delivery body.

``ElevenLabs-Signature: t=<unix s>,v0=<hex>``, hex HMAC-SHA256 of ``"{t}.{body}"`` with
the webhook's secret (the SDK rejects timestamps older than 30 minutes). The replay key is
``"<t>.<v0>"`` as parsed, so parts appended to the header (``,x=1``) do not make a replay
look new. The body is ``{"type", "data"}``: ``speech_to_text_transcription``
(``data.request_id``, ``data.transcription.text``) is read; any other type is ignored.
There is no dubbing webhook (the SDK's workspace event types are
``voice_library_removal_notice``, ``speech_to_text`` and ``agent_qa``, and ``POST
/v1/dubbing`` takes no webhook — docs/providers.md): dubs are polled. Webhooks are set per
workspace, so no call gets a callback URL.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from callwarden.providers.errors import SignatureError
from callwarden.providers.kinds import kinds_of
from callwarden.providers.outcomes import Failed, Succeeded
from callwarden.providers.webhooks import (
    MalformedDelivery,
    Parsed,
    check_timestamp,
    json_object,
    lower,
    text_field,
)

__all__ = ["SCHEME", "elevenlabs_sign", "parse_elevenlabs", "verify_elevenlabs"]


def elevenlabs_sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``ElevenLabs-Signature`` header value ``t=<ts>,v0=<hex>``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v0={digest.hexdigest()}"


def verify_elevenlabs(
    secret: str, header: str | None, body: bytes, *, now: float, tolerance_s: float = 1800.0,
) -> str:
    """Check an ElevenLabs delivery's ``ElevenLabs-Signature`` header; return its replay
    key, ``"<t>.<v0>"`` as parsed."""
    if not header:
        raise SignatureError("missing ElevenLabs-Signature")
    parts = dict(p.strip().split("=", 1) for p in header.split(",") if "=" in p)
    ts = check_timestamp(parts.get("t"), now, tolerance_s)
    given = parts.get("v0", "")
    expected = elevenlabs_sign(secret, ts, body).split("v0=")[1]
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise SignatureError("ElevenLabs signature mismatch")
    return f"{ts}.{given}"


def _transcription(data: dict[str, Any]) -> Parsed:
    task_id = text_field(data.get("request_id") or data.get("transcription_id"),
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
    doc = json_object(body)
    kind, data = doc.get("type"), doc.get("data")
    if not isinstance(kind, str) or not isinstance(data, dict):
        raise MalformedDelivery("ElevenLabs webhook is not a {type, data: {...}} object")
    if kind == "speech_to_text_transcription":
        return _transcription(data)
    return None


class _ElevenLabs:
    provider: Final = "elevenlabs"
    kinds: Final = kinds_of("elevenlabs")
    trusts_body: Final = True
    secret_env: Final = "CALLWARDEN_ELEVENLABS_WEBHOOK_SECRET"
    tolerance_s: Final = 1800.0

    def verify(self, secret: str, task_id: str | None, headers: Mapping[str, str],
               body: bytes, *, now: float) -> str:
        return "sig:" + verify_elevenlabs(secret, lower(headers).get("elevenlabs-signature"),
                                          body, now=now, tolerance_s=self.tolerance_s)

    def parse(self, body: bytes, *,
              is_media: Callable[[str], bool] | None = None) -> Parsed | None:
        return parse_elevenlabs(body)

    def task_id(self, body: bytes) -> str:
        parsed = parse_elevenlabs(body)
        if parsed is None:
            raise MalformedDelivery("an event that concerns no call")
        return parsed.task_id

    def callback_url(self, base_url: str, job_id: uuid.UUID, token: str | None
                     ) -> str | None:
        return None


SCHEME = _ElevenLabs()
