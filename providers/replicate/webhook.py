"""Replicate webhooks (pure): the Svix scheme and the delivery body.

``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` (space-separated
``v1,<base64>``): HMAC-SHA256 over ``"{id}.{ts}.{body}"`` keyed with the base64-decoded
part of the ``whsec_...`` secret (the official Svix vectors pass). The body is the
prediction (or training) object, read by
:func:`callwarden.providers.replicate.wire.parse_prediction` (``is_media``: which URLs in its
output are files, as for a poll):
``starting``/``processing`` (the ``start`` and ``output`` events) are intermediate,
``data_removed`` is ``Failed(code="result_gone")``. The replay key is the ``webhook-id``
(the same across a delivery's retries).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import uuid
from collections.abc import Mapping
from typing import Final

from callwarden.providers.errors import MediaExpired, ProviderError, SignatureError
from callwarden.providers.kinds import kinds_of
from callwarden.providers.outcomes import Failed
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate.wire import IsMedia, on_replicate_hosts, parse_prediction
from callwarden.providers.webhooks import (
    MalformedDelivery,
    Parsed,
    check_timestamp,
    hmac_sha256,
    json_object,
    lower,
    text_field,
)

__all__ = ["SCHEME", "parse_replicate", "replicate_sign", "verify_replicate"]


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.split("_")[-1])
    except binascii.Error:
        raise SignatureError("malformed Replicate webhook secret") from None


def replicate_sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value (one ``v1,<base64>`` entry)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac_sha256(_key(secret), signed)).decode()


def verify_replicate(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: float,
    tolerance_s: float = 300.0,
) -> str:
    """Check a Replicate delivery; return its ``webhook-id`` (for replay detection)."""
    h = lower(headers)
    msg_id = h.get("webhook-id")
    sigs = h.get("webhook-signature")
    if not msg_id or not sigs:
        raise SignatureError("missing webhook-id or webhook-signature")
    ts = check_timestamp(h.get("webhook-timestamp"), now, tolerance_s)
    expected = replicate_sign(secret, msg_id, ts, body).encode()
    for entry in sigs.split():
        if entry.startswith("v1,") and hmac.compare_digest(entry.encode(), expected):
            return msg_id
    raise SignatureError("no matching v1 signature")


def parse_replicate(body: bytes, is_media: IsMedia = on_replicate_hosts) -> Parsed:
    """A Replicate webhook body (prediction or training object)."""
    doc = json_object(body)
    task_id = text_field(doc.get("id"), "id")
    try:
        outcome = parse_prediction(RawResponse(status=200, headers={}, body=body),
                                   is_media=is_media)
    except MediaExpired as exc:
        outcome = Failed(error=f"result expired: {exc}", code="result_gone")
    except ProviderError as exc:
        raise MalformedDelivery(str(exc)) from None
    return Parsed(task_id=task_id, outcome=outcome)


class _Replicate:
    provider: Final = "replicate"
    kinds: Final = kinds_of("replicate")
    trusts_body: Final = True
    secret_env: Final = "CALLWARDEN_REPLICATE_WEBHOOK_SECRET"
    tolerance_s: Final = 300.0

    def verify(self, secret: str, task_id: str | None, headers: Mapping[str, str],
               body: bytes, *, now: float) -> str:
        return "id:" + verify_replicate(secret, headers, body, now=now,
                                        tolerance_s=self.tolerance_s)

    def parse(self, body: bytes, *, is_media: IsMedia | None = None) -> Parsed | None:
        return parse_replicate(body, is_media or on_replicate_hosts)

    def task_id(self, body: bytes) -> str:
        return parse_replicate(body).task_id

    def callback_url(self, base_url: str, job_id: uuid.UUID, token: str | None
                     ) -> str | None:
        return f"{base_url.rstrip('/')}/webhooks/replicate"


SCHEME = _Replicate()
