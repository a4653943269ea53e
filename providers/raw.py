"""A provider's answer as bytes, and the pure readings every parser shares (no I/O).

:class:`RawResponse` is what the transport hands a parser: the status, the lower-cased
headers, the body, and when it arrived (``received_at``, unix seconds, read once by the
transport) so that an HTTP-date ``Retry-After`` is read without a clock here.
:func:`decode_json` refuses a body nested deeper than :data:`MAX_DEPTH` — no provider
answer is, and recursive readers must never meet one — and :func:`parse_retry_after` reads
delta-seconds or an HTTP date against a given ``now``.
"""

from __future__ import annotations

import email.utils
from typing import Any

import msgspec

from callwarden.events.errors import CallwardenError
from callwarden.providers.errors import MalformedResponse

__all__ = ["MAX_DEPTH", "JSONTooDeep", "RawResponse", "decode_json", "parse_retry_after"]

MAX_DEPTH = 64


class JSONTooDeep(CallwardenError, ValueError):
    """A JSON document nested deeper than :data:`MAX_DEPTH`."""


def _depth_ok(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def decode_json(body: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``body`` as JSON; :class:`msgspec.DecodeError` when it is not JSON,
    :class:`JSONTooDeep` when it nests deeper than ``max_depth``."""
    try:
        value = msgspec.json.decode(body)
    except RecursionError:
        raise JSONTooDeep(f"JSON nested deeper than {max_depth} levels") from None
    if body.count(b"[") + body.count(b"{") > max_depth and not _depth_ok(value, max_depth):
        raise JSONTooDeep(f"JSON nested deeper than {max_depth} levels")
    return value


class RawResponse(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes
    received_at: float = 0.0  # unix seconds, set by the transport

    def json(self, provider: str) -> Any:
        """The body as JSON, or :class:`MalformedResponse` keeping a prefix of the body."""
        try:
            return decode_json(self.body)
        except (msgspec.DecodeError, JSONTooDeep) as exc:
            snippet = self.body[:200].decode("utf-8", "replace")
            raise MalformedResponse(
                f"invalid JSON from {provider}: {exc}; body starts {snippet!r}",
                provider=provider, status=self.status,
            ) from None

    def retry_after(self, name: str = "retry-after") -> float | None:
        """The seconds a ``Retry-After``-style header asks to wait, read at arrival."""
        return parse_retry_after(self.headers.get(name), now=self.received_at)


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value (delta-seconds, or an HTTP
    date compared with ``now``, unix seconds). ``None`` when absent or unparseable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds and seconds != float("inf") else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when.timestamp() - now)
