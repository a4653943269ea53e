"""KIE callbacks (pure): a signal, never data.

KIE signs only ``taskId.timestamp`` (``X-Webhook-Timestamp`` in seconds,
``X-Webhook-Signature`` = base64 HMAC-SHA256 of ``"{taskId}.{ts}"`` with the account's
webhook HMAC key), or nothing at all: then the per-job token in the callback URL
(``/webhooks/kie/{job_id}/{token}``) authenticates. Either way the body could be forged
inside the signature's window, so only its task id is read (``data.taskId``, or
``data.task_id`` for Suno and Runway) and the receiver polls the task. The replay key is the
signature (it covers all that is signed).
"""

from __future__ import annotations

import base64
import hmac
import uuid
from collections.abc import Callable, Mapping
from typing import Final

from callwarden.providers.errors import SignatureError
from callwarden.providers.kinds import kinds_of
from callwarden.providers.webhooks import (
    MalformedDelivery,
    Parsed,
    check_timestamp,
    hmac_sha256,
    json_object,
    lower,
    text_field,
)

__all__ = ["SCHEME", "kie_sign", "kie_task_id", "verify_kie"]


def kie_sign(key: str, task_id: str, timestamp: int) -> str:
    """The ``X-Webhook-Signature`` value."""
    return base64.b64encode(hmac_sha256(key.encode(), f"{task_id}.{timestamp}".encode())
                            ).decode()


def verify_kie(
    key: str, task_id: str, headers: Mapping[str, str], *, now: float,
    tolerance_s: float = 300.0,
) -> None:
    """Check a KIE callback for ``task_id`` (taken from the body by the caller)."""
    h = lower(headers)
    sig = h.get("x-webhook-signature")
    if not sig:
        raise SignatureError("missing X-Webhook-Signature")
    ts = check_timestamp(h.get("x-webhook-timestamp"), now, tolerance_s)
    if not hmac.compare_digest(sig.encode(), kie_sign(key, task_id, ts).encode()):
        raise SignatureError("KIE signature mismatch")


def kie_task_id(body: bytes) -> str:
    """The task id a KIE callback is about (``data.taskId`` or ``data.task_id``)."""
    doc = json_object(body)
    code, data = doc.get("code"), doc.get("data")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(data, dict):
        raise MalformedDelivery("KIE callback is not a {code, msg, data: {...}} envelope")
    return text_field(data.get("taskId") or data.get("task_id"), "data.taskId or data.task_id")


class _Kie:
    provider: Final = "kie"
    kinds: Final = kinds_of("kie", "async")
    trusts_body: Final = False
    secret_env: Final = "CALLWARDEN_KIE_WEBHOOK_HMAC_KEY"
    tolerance_s: Final = 300.0

    def verify(self, secret: str, task_id: str | None, headers: Mapping[str, str],
               body: bytes, *, now: float) -> str:
        verify_kie(secret, task_id or "", headers, now=now, tolerance_s=self.tolerance_s)
        return f"sig:{lower(headers).get('x-webhook-signature')}"

    def parse(self, body: bytes, *,
              is_media: Callable[[str], bool] | None = None) -> Parsed | None:
        raise MalformedDelivery("a KIE callback is a signal: its body is never the outcome")

    def task_id(self, body: bytes) -> str:
        return kie_task_id(body)

    def callback_url(self, base_url: str, job_id: uuid.UUID, token: str | None
                     ) -> str | None:
        return f"{base_url.rstrip('/')}/webhooks/kie/{job_id}/{token}" if token else None


SCHEME = _Kie()
