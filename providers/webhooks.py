"""What every provider's webhook module provides, and the pieces they share (pure).

A provider that calls back has a ``providers/<provider>/webhook.py`` exposing ``SCHEME``, a
:class:`WebhookScheme`: how a delivery is authenticated, what it is trusted for, and where
it is sent. The engine's receiver (:mod:`callwarden.service.webhooks`) mounts one route per
scheme listed in :data:`callwarden.providers.registry.WEBHOOKS` and knows nothing else about a
provider — adding one touches ``providers/`` and the kind registry only.

Two kinds of delivery:

- **signed body** (``trusts_body``: Replicate, ElevenLabs): the signature covers the body,
  so :meth:`WebhookScheme.parse` reads the outcome from it; ``verify`` returns the replay
  key (a repeat of it is a duplicate, acknowledged and ignored).
- **signal** (KIE): the signature covers only the task id and timestamp, or there is none
  and a per-job token in the URL authenticates (``/webhooks/<provider>/{job_id}/{token}``);
  the body is never trusted: :meth:`WebhookScheme.task_id` names the task and the
  receiver polls it.

Anything a body parser cannot read raises :class:`MalformedDelivery` (answered 400,
nothing changes). No clock is read here: ``now`` is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.providers.errors import SignatureError, StaleSignature
from callwarden.providers.outcomes import PollOutcome, Running
from callwarden.providers.raw import JSONTooDeep, decode_json

__all__ = ["MalformedDelivery", "Parsed", "WebhookScheme", "check_timestamp", "hmac_sha256",
           "json_object", "lower", "text_field"]


class MalformedDelivery(CallwardenError, ValueError):
    """The body is not a delivery this receiver understands."""


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """One delivery: the upstream task it is about and what it says (``Running`` for an
    intermediate stage, acknowledged without a transition)."""

    task_id: str
    outcome: PollOutcome

    @property
    def intermediate(self) -> bool:
        return isinstance(self.outcome, Running)


class WebhookScheme(Protocol):
    """One provider's webhooks (see the module docstring)."""

    @property
    def provider(self) -> str: ...

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds whose calls its deliveries are about."""
        ...

    @property
    def trusts_body(self) -> bool: ...

    @property
    def secret_env(self) -> str:
        """The environment variable holding the signing secret."""
        ...

    @property
    def tolerance_s(self) -> float:
        """How old a signature timestamp may be."""
        ...

    def verify(self, secret: str, task_id: str | None, headers: Mapping[str, str],
               body: bytes, *, now: float) -> str:
        """Raise :class:`SignatureError` unless the delivery is authentic; its replay key.
        ``task_id``: for a signal scheme, the task the body names (what is signed)."""
        ...

    def parse(self, body: bytes, *,
              is_media: Callable[[str], bool] | None = None) -> Parsed | None:
        """A signed body's delivery (``None``: an event that concerns no call).
        ``is_media``: whether a URL the body names is on a host the kinds' result files
        come from (a scheme whose bodies name URLs in free-form output reads the rest as
        text; ``None``: the provider's own media hosts)."""
        ...

    def task_id(self, body: bytes) -> str:
        """The task a signal names."""
        ...

    def callback_url(self, base_url: str, job_id: uuid.UUID, token: str | None
                     ) -> str | None:
        """Where a call of this provider should be called back (``None``: no per-request
        callback — e.g. configured per workspace — or a signal scheme without a token)."""
        ...


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def check_timestamp(raw: str | None, now: float, tolerance_s: float) -> int:
    """A signature timestamp (unix seconds) within ``tolerance_s`` of ``now``."""
    if not raw:
        raise SignatureError("missing signature timestamp")
    try:
        ts = int(raw)
    except ValueError:
        raise SignatureError(f"malformed signature timestamp {raw!r}") from None
    if abs(now - ts) > tolerance_s:
        raise StaleSignature(f"stale signature timestamp {ts} (now {int(now)})")
    return ts


def json_object(body: bytes) -> dict[str, Any]:
    try:
        doc = decode_json(body)
    except (msgspec.DecodeError, JSONTooDeep) as exc:
        raise MalformedDelivery(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedDelivery("body is not a JSON object")
    return doc


def text_field(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedDelivery(f"delivery without {what}")
    return value
