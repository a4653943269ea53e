"""ElevenLabs wire format, shared by the clients in :mod:`callwarden.providers.elevenlabs`: the
request value, multipart encoding, and the error classification.

ElevenLabs errors are a non-2xx status with a ``detail``, in one of three shapes:

- current: ``{"detail": {"type", "code", "message", "status", "request_id", "param"}}``
- legacy: ``{"detail": {"status": "invalid_api_key", "message": "Invalid API key"}}``
- FastAPI validation (422): ``{"detail": [{"loc", "msg", "type"}, ...]}``

:func:`classify_elevenlabs` maps them onto :mod:`callwarden.providers.errors`, keeping the message
(plus ``request_id``) and the code (``code``, else the legacy ``status``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from callwarden.providers.errors import (
    RETRY_LATER,
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    ProviderError,
    RateLimited,
    TaskNotFound,
    TransientError,
)
from callwarden.providers.raw import JSONTooDeep, RawResponse, decode_json

__all__ = [
    "PROVIDER",
    "FilePart",
    "FormValue",
    "Request",
    "bad_request",
    "classify_elevenlabs",
    "encode_multipart",
    "form_fields",
    "json_object",
    "require",
]

PROVIDER = "elevenlabs"
RATE_LIMIT_CODES = frozenset({
    "rate_limit_exceeded", "concurrent_limit_exceeded",
    "too_many_concurrent_requests", "system_busy",  # legacy statuses
})
CREDIT_CODES = frozenset({"quota_exceeded", "insufficient_credits", "payment_required"})


class FilePart(msgspec.Struct, frozen=True, kw_only=True):
    """A file in a multipart body (a request may also give plain ``bytes``)."""

    data: bytes
    filename: str = "file"
    content_type: str = "application/octet-stream"


FormValue = str | FilePart


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request, as data: ``json_body`` or ``form`` (multipart), not both."""

    method: str
    path: str
    params: dict[str, str] = msgspec.field(default_factory=dict)
    json_body: Any = None
    form: tuple[tuple[str, FormValue], ...] | None = None


def bad_request(message: str) -> BadRequest:
    return BadRequest(message, provider=PROVIDER)


def require(request: Mapping[str, Any], key: str) -> Any:
    """``request[key]``, or :class:`BadRequest` when it is missing or empty."""
    value = request.get(key)
    if value is None or value == "" or value == []:
        raise bad_request(f"request needs {key!r}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return msgspec.json.encode(value).decode()
    return str(value)


def _parts(key: str, value: Any) -> Iterable[tuple[str, FormValue]]:
    if isinstance(value, bytes | bytearray):
        yield key, FilePart(data=bytes(value), filename=key)
    elif isinstance(value, FilePart):
        yield key, value
    elif isinstance(value, list) and value and all(
            isinstance(v, bytes | bytearray | FilePart) for v in value):
        for item in value:
            yield from _parts(key, item)
    elif value is not None:
        yield key, _text(value)


def form_fields(request: Mapping[str, Any], *, skip: Sequence[str] = ()
                ) -> tuple[tuple[str, FormValue], ...]:
    """Multipart fields of ``request``: bytes become files, lists of files repeat the
    field, dicts/lists become JSON text, booleans ``true``/``false``, ``None`` is left out."""
    return tuple(part for key, value in request.items() if key not in skip
                 for part in _parts(key, value))


def _quote(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', "%22").replace("\r", "").replace("\n", "")


def encode_multipart(fields: Sequence[tuple[str, FormValue]], boundary: str
                     ) -> tuple[bytes, str]:
    """``multipart/form-data`` body and its content type (re-sendable bytes, unlike a
    consumed ``aiohttp.FormData``)."""
    out = bytearray()
    for name, value in fields:
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(name)}"'.encode()
        if isinstance(value, FilePart):
            out += (f'; filename="{_quote(value.filename)}"\r\n'
                    f"Content-Type: {value.content_type}").encode()
            data = value.data
        else:
            data = value.encode()
        out += b"\r\n\r\n" + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def json_object(raw: RawResponse) -> dict[str, Any]:
    """The body as a JSON object, or :class:`MalformedResponse`."""
    body = raw.json(PROVIDER)
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {type(body).__name__}",
                                provider=PROVIDER, status=raw.status)
    return body


def _detail_message(detail: Mapping[str, Any]) -> tuple[str, str | None, str | None]:
    """(message, code, legacy status): a live 401 carries ``code: unauthorized`` beside
    the legacy ``status: invalid_api_key``, so both are kept for classification."""
    code, legacy = detail.get("code"), detail.get("status")
    message = str(detail.get("message") or code or legacy or "unknown error")
    if detail.get("param"):
        message += f" (param {detail['param']})"
    if detail.get("request_id"):
        message += f" (request_id {detail['request_id']})"
    return (message, str(code) if code else (str(legacy) if legacy else None),
            str(legacy) if legacy else None)


def _validation_message(items: list[Any]) -> str:
    def one(item: Any) -> str:
        if not isinstance(item, dict):
            return str(item)
        where = item.get("loc")
        loc = ".".join(str(p) for p in where) if isinstance(where, list) else ""
        return f"{loc}: {item.get('msg')}" if loc else str(item.get("msg"))
    return "; ".join(one(i) for i in items) or "validation error"


def _error_parts(raw: RawResponse) -> tuple[str, str | None, str | None]:
    try:
        body = decode_json(raw.body)
    except (msgspec.DecodeError, JSONTooDeep):
        text = raw.body[:200].decode("utf-8", "replace").strip()
        return text or f"HTTP {raw.status}", None, None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        return _detail_message(detail)
    if isinstance(detail, list):
        return _validation_message(detail), "validation_error", None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        # the dubbed-audio endpoint's flat {"error", "message"} (425, 404)
        return str(body.get("message") or body["error"]), body["error"], None
    return str(detail if detail is not None else body), None, None


def _error_class(status: int, *codes: str | None) -> type[ProviderError]:
    if status == 402 or any(c in CREDIT_CODES for c in codes):
        return InsufficientCredits
    if status == 429 or any(c in RATE_LIMIT_CODES for c in codes):
        return RateLimited
    if status in (401, 403):
        return AuthenticationError
    if status == 404:
        return TaskNotFound
    if status in RETRY_LATER or status >= 500:
        return TransientError  # 425: the dub is not ready yet
    return BadRequest


def classify_elevenlabs(raw: RawResponse) -> ProviderError | None:
    """``None`` for a 2xx response, else the typed error it means."""
    if 200 <= raw.status < 300:
        return None
    message, code, legacy = _error_parts(raw)
    cls = _error_class(raw.status, code, legacy)
    if cls is RateLimited:
        retry_after = raw.retry_after()
        return RateLimited(message, retry_after=retry_after, provider=PROVIDER,
                           status=raw.status, code=code)
    return cls(message, provider=PROVIDER, status=raw.status, code=code)
