"""Webhook signing and verification for the three providers that call back.

Pure functions over bytes and an explicit ``now`` (no clock reads): the simulator signs
with them, the webhook receiver verifies with them. Every comparison is constant-time.

- Replicate (Svix scheme): ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``
  (space-separated ``v1,<base64>``); HMAC-SHA256 over ``"{id}.{ts}.{body}"`` with the
  base64-decoded part of ``whsec_...`` as key.
- KIE (opt-in HMAC): ``X-Webhook-Timestamp`` (s), ``X-Webhook-Signature``;
  base64 HMAC-SHA256 over ``"{taskId}.{ts}"``: the body is *not* signed.
- ElevenLabs: ``ElevenLabs-Signature: t=<ts>,v0=<hex>``; hex HMAC-SHA256 over
  ``"{t}.{body}"``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

from providers.errors import SignatureError

__all__ = [
    "elevenlabs_sign",
    "kie_sign",
    "replicate_sign",
    "verify_elevenlabs",
    "verify_kie",
    "verify_replicate",
]


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _check_timestamp(raw: str | None, now: float, tolerance_s: float) -> int:
    if not raw:
        raise SignatureError("missing signature timestamp")
    try:
        ts = int(raw)
    except ValueError:
        raise SignatureError(f"malformed signature timestamp {raw!r}") from None
    if abs(now - ts) > tolerance_s:
        raise SignatureError(f"stale signature timestamp {ts} (now {int(now)})")
    return ts


def _replicate_key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.split("_")[-1])
    except binascii.Error:
        raise SignatureError("malformed Replicate webhook secret") from None


def replicate_sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value (one ``v1,<base64>`` entry)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(_hmac(_replicate_key(secret), signed)).decode()


def verify_replicate(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: float,
    tolerance_s: float = 300.0,
) -> str:
    """Check a Replicate delivery; return its ``webhook-id`` (for replay detection)."""
    h = _lower(headers)
    msg_id = h.get("webhook-id")
    sigs = h.get("webhook-signature")
    if not msg_id or not sigs:
        raise SignatureError("missing webhook-id or webhook-signature")
    ts = _check_timestamp(h.get("webhook-timestamp"), now, tolerance_s)
    expected = replicate_sign(secret, msg_id, ts, body).encode()
    for entry in sigs.split():
        if entry.startswith("v1,") and hmac.compare_digest(entry.encode(), expected):
            return msg_id
    raise SignatureError("no matching v1 signature")


def kie_sign(key: str, task_id: str, timestamp: int) -> str:
    """The ``X-Webhook-Signature`` value."""
    digest = _hmac(key.encode(), f"{task_id}.{timestamp}".encode())
    return base64.b64encode(digest).decode()


def verify_kie(
    key: str, task_id: str, headers: Mapping[str, str], *, now: float,
    tolerance_s: float = 300.0,
) -> None:
    """Check a KIE callback for ``task_id`` (taken from the body by the caller)."""
    h = _lower(headers)
    sig = h.get("x-webhook-signature")
    if not sig:
        raise SignatureError("missing X-Webhook-Signature")
    ts = _check_timestamp(h.get("x-webhook-timestamp"), now, tolerance_s)
    if not hmac.compare_digest(sig.encode(), kie_sign(key, task_id, ts).encode()):
        raise SignatureError("KIE signature mismatch")


def elevenlabs_sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``ElevenLabs-Signature`` header value ``t=<ts>,v0=<hex>``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v0={digest.hexdigest()}"


def verify_elevenlabs(
    secret: str, header: str | None, body: bytes, *, now: float, tolerance_s: float = 1800.0,
) -> str:
    """Check an ElevenLabs delivery's ``ElevenLabs-Signature`` header; return its replay
    key, ``"<t>.<v0>"`` as parsed (so extra parts appended to the header, such as
    ``,x=1``, do not make a replay look new)."""
    if not header:
        raise SignatureError("missing ElevenLabs-Signature")
    parts = dict(p.strip().split("=", 1) for p in header.split(",") if "=" in p)
    ts = _check_timestamp(parts.get("t"), now, tolerance_s)
    given = parts.get("v0", "")
    expected = elevenlabs_sign(secret, ts, body).split("v0=")[1]
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise SignatureError("ElevenLabs signature mismatch")
    return f"{ts}.{given}"
