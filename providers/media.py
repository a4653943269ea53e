"""Download a result's media with a hard size cap, a type allow-list and typed errors.

:func:`download` streams the body in chunks and aborts (closing the connection) as soon as it
passes ``max_bytes``; a ``Content-Length`` above the limit is refused before any body is read.
``data:`` URIs (Replicate's sync mode returns them) are decoded under the same checks, within
their own limits (:mod:`callwarden.providers.data_uri`: the length first, a header that is a
media type, decoding in memory linear in the URI).
Every http(s) URL, and every redirect hop (followed by hand, up to the policy's limit),
must pass the :class:`~callwarden.providers.media_guard.MediaPolicy` the caller gives; use a session
from :func:`~callwarden.providers.media_guard.media_session` so resolved addresses are checked too.
:class:`Credentials` (ElevenLabs serves dubbed audio only with its key) are sent to their
own origin only — the provider's configured API endpoint — on the first request and on any
hop, never to another host media may come from (a media endpoint, an allow-listed CDN).

Content types. ``allowed_types`` holds exact types (``audio/mpeg``) and major-type wildcards
(``image/*``); ``*`` (:data:`ANY_FILE`) any type but a web page; ``None`` accepts anything.
The default, :data:`DEFAULT_MEDIA_TYPES`, is
``image/*``, ``video/*`` and ``audio/*``. ``application/octet-stream`` is deliberately *not* in
it, yet CDNs often label media that way: a generic or missing type is resolved by sniffing the
first bytes (PNG, JPEG, GIF, WebP, AVIF/HEIC, MP4/MOV, WebM, MP3, AAC, WAV, OGG, FLAC); media
that sniffs as an allowed type is accepted *with the sniffed type*, anything else is refused.
So an HTML error page or an unknown blob served with status 200 is never stored as a result.
A declared type that is not one ``type/subtype`` (a list such as ``image/png, text/html``)
counts as missing. What is accepted is stored as
:func:`~callwarden.providers.media_types.stored_type` says: a type a browser could run
script in (SVG, XML, JavaScript, anything not known to be inert) as
``application/octet-stream``, so it can never execute where it is served.

Errors (all from :mod:`callwarden.providers.errors`; no aiohttp exception escapes)::

    HTTP 403 / 404 / 410                    MediaExpired
    HTTP 429                                RateLimited (retry_after from Retry-After)
    HTTP 5xx / 408 / 425, reset, refused    TransientError
    no complete answer within timeout_s     ProviderTimeout
    body or Content-Length over max_bytes   MediaTooLarge
    content type not allowed                MediaTypeRejected
    other 4xx, bad URL or scheme, bad data: MediaError
    host or redirect hop not allowed        MediaRefused (nothing fetched)

Messages show URLs without their query string (signed URLs carry credentials there).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Mapping

import aiohttp
import msgspec

from callwarden.providers.data_uri import decode_payload, read_header
from callwarden.providers.errors import (
    RETRY_LATER,
    MediaError,
    MediaExpired,
    MediaRefused,
    MediaTooLarge,
    MediaTypeRejected,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    TransientError,
)
from callwarden.providers.media_guard import MediaPolicy, Origin, check_url, origin_of, shown_url
from callwarden.providers.media_types import media_type, stored_type
from callwarden.providers.raw import parse_retry_after

__all__ = [
    "ANY_FILE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MEDIA_TYPES",
    "GENERIC_TYPES",
    "PAGE_TYPES",
    "Credentials",
    "Downloaded",
    "decode_data_uri",
    "download",
    "resolve_content_type",
    "sniff_media_type",
    "status_error",
    "type_allowed",
]

DEFAULT_MAX_BYTES = 200 * 2**20
DEFAULT_MEDIA_TYPES: frozenset[str] = frozenset({"image/*", "video/*", "audio/*"})
#: Any file but a web page (Replicate: a model's output may be any file, as the SDK takes
#: it — text, JSON, archives, 3-D models — yet an HTML page is an error page, not a result).
ANY_FILE: frozenset[str] = frozenset({"*"})
PAGE_TYPES: frozenset[str] = frozenset({"text/html", "application/xhtml+xml"})
GENERIC_TYPES: frozenset[str] = frozenset(
    {"", "application/octet-stream", "binary/octet-stream", "application/binary"}
)
_CHUNK = 64 * 1024
_EXPIRED = frozenset({403, 404, 410})

# Leading bytes -> content type; RIFF and ISO-BMFF ("ftyp") containers by their brand.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"\x1a\x45\xdf\xa3", "video/webm"),
    (b"ID3", "audio/mpeg"),
    (b"\xff\xfb", "audio/mpeg"),
    (b"\xff\xf3", "audio/mpeg"),
    (b"\xff\xf2", "audio/mpeg"),
    (b"\xff\xf1", "audio/aac"),
    (b"\xff\xf9", "audio/aac"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
)
_RIFF_FORMS: Mapping[bytes, str] = {b"WEBP": "image/webp", b"WAVE": "audio/wav"}
_FTYP_BRANDS: Mapping[bytes, str] = {
    b"avif": "image/avif", b"heic": "image/heic", b"heix": "image/heic", b"mif1": "image/heic",
    b"M4A ": "audio/mp4", b"qt  ": "video/quicktime",
}


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """Headers that authenticate to one origin only (a provider's API endpoint)."""

    origin: Origin
    headers: dict[str, str]

    @classmethod
    def for_endpoint(cls, base_url: str, headers: Mapping[str, str]) -> Credentials | None:
        """``headers`` for ``base_url``'s origin (``None`` if it has none)."""
        origin = origin_of(base_url)
        return None if origin is None else cls(origin=origin, headers=dict(headers))

    def for_url(self, url: str) -> dict[str, str] | None:
        """The headers to send to ``url``: these, on their own origin only."""
        return dict(self.headers) if origin_of(url) == self.origin else None


class Downloaded(msgspec.Struct, frozen=True, kw_only=True):
    """A fetched media body; ``content_type`` is the checked (possibly sniffed) type."""

    data: bytes
    content_type: str
    url: str


# --------------------------------------------------------------------------- pure decisions


def sniff_media_type(data: bytes) -> str | None:
    """The media type that ``data``'s leading bytes announce, or ``None``."""
    if data[:4] == b"RIFF":
        return _RIFF_FORMS.get(data[8:12])
    if data[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(data[8:12], "video/mp4")
    for magic, content_type in _MAGIC:
        if data.startswith(magic):
            return content_type
    return None


def _base_type(header: str | None) -> str:
    """The declared ``type/subtype``; ``""`` (generic: sniffed) when missing or not one."""
    return media_type(header or "") or ""


def type_allowed(content_type: str, allowed: frozenset[str] | None) -> bool:
    """``content_type`` is in ``allowed`` exactly or by its ``major/*`` wildcard; ``*``
    allows any type but a web page; ``None`` allows anything."""
    if allowed is None:
        return True
    if "*" in allowed and content_type not in PAGE_TYPES:
        return True
    major = content_type.split("/", 1)[0]
    return content_type in allowed or f"{major}/*" in allowed


def resolve_content_type(
    declared: str, data: bytes, allowed: frozenset[str] | None
) -> str | None:
    """The type to record for ``data`` served as ``declared``, or ``None`` if refused.

    A specific declared type must be allowed; a generic one is replaced by the sniffed type
    (``application/octet-stream`` when nothing is recognised) which must then be allowed.
    """
    if declared not in GENERIC_TYPES:
        return declared if type_allowed(declared, allowed) else None
    candidate = sniff_media_type(data) or "application/octet-stream"
    return candidate if type_allowed(candidate, allowed) else None


def status_error(status: int, reason: str, retry_after: str | None, shown: str, *,
                 now: float) -> ProviderError | None:
    """The error an HTTP status on a media URL means, or ``None`` for 2xx (``now``: when
    it arrived, unix seconds, for an HTTP-date ``Retry-After``)."""
    if 200 <= status < 300:
        return None
    message = f"GET {shown} answered HTTP {status} {reason}".rstrip()
    if status in _EXPIRED:
        return MediaExpired(message, status=status)
    if status == 429:
        return RateLimited(message, status=status,
                           retry_after=parse_retry_after(retry_after, now=now))
    if status >= 500 or status in RETRY_LATER:
        return TransientError(message, status=status)
    return MediaError(message, status=status)


def _refuse_declared(declared: str, allowed: frozenset[str] | None, shown: str) -> None:
    if declared not in GENERIC_TYPES and not type_allowed(declared, allowed):
        raise MediaTypeRejected(f"{shown}: content type {declared!r} is not allowed")


def _checked(declared: str, data: bytes, allowed: frozenset[str] | None, url: str,
             shown: str) -> Downloaded:
    if not data:  # a 200 with nothing in it is no result: never stored, never charged
        raise MediaError(f"{shown}: the media is empty (0 bytes)")
    content_type = resolve_content_type(declared, data, allowed)
    if content_type is None:
        sniffed = sniff_media_type(data)
        raise MediaTypeRejected(
            f"{shown}: content type {declared or 'missing'!r} (sniffed {sniffed!r}) "
            "is not allowed"
        )
    return Downloaded(data=data, content_type=stored_type(content_type), url=url)


# --------------------------------------------------------------------------- data: URIs


def decode_data_uri(
    uri: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
    allowed_types: frozenset[str] | None = DEFAULT_MEDIA_TYPES,
) -> Downloaded:
    """Decode an RFC 2397 ``data:`` URI under the same size and type rules as a download
    (:mod:`callwarden.providers.data_uri`). A missing media type is treated as generic and
    sniffed; one that is not a media type is refused."""
    header = read_header(uri, max_bytes)
    _refuse_declared(header.declared, allowed_types, "data: URI")
    data = decode_payload(uri, header, max_bytes)
    return _checked(header.declared, data, allowed_types, uri, "data: URI")


# --------------------------------------------------------------------------- HTTP


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, shown: str) -> bytes:
    """Read the body in chunks; close the connection as soon as it passes ``max_bytes``."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        resp.close()
        raise MediaTooLarge(
            f"{shown}: Content-Length {resp.content_length} exceeds {max_bytes} bytes")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            resp.close()
            raise MediaTooLarge(f"{shown}: body exceeds {max_bytes} bytes")
    return bytes(body)


_REDIRECTS = frozenset({301, 302, 303, 307, 308})


async def _fetch(
    session: aiohttp.ClientSession, url: str, *, policy: MediaPolicy, max_bytes: int,
    allowed_types: frozenset[str] | None, credentials: Credentials | None,
) -> tuple[str, bytes]:
    """GET ``url``, following redirects by hand: each hop is checked by ``policy`` before
    it is requested. ``credentials`` go only to their own origin, hop by hop."""
    for _ in range(policy.max_redirects + 1):
        check_url(url, policy)
        shown = shown_url(url)
        send = credentials.for_url(url) if credentials is not None else None
        async with session.get(url, headers=send, allow_redirects=False) as resp:
            location = resp.headers.get("Location")
            if resp.status in _REDIRECTS and location:
                url = urllib.parse.urljoin(url, location)
                continue
            error = status_error(resp.status, resp.reason or "", resp.headers.get("Retry-After"),
                                 shown, now=time.time())
            if error is not None:
                raise error
            declared = _base_type(resp.headers.get("Content-Type"))
            _refuse_declared(declared, allowed_types, shown)
            return declared, await _read_capped(resp, max_bytes, shown)
    raise MediaRefused(f"refused media URL {shown_url(url)!r}: more than "
                       f"{policy.max_redirects} redirects")


async def download(
    session: aiohttp.ClientSession,
    url: str,
    *,
    policy: MediaPolicy,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allowed_types: frozenset[str] | None = DEFAULT_MEDIA_TYPES,
    credentials: Credentials | None = None,
    timeout_s: float = 120,
) -> Downloaded:
    """Fetch ``url`` (``http``, ``https`` or ``data:``) within ``timeout_s`` in total, body
    included, from where ``policy`` allows, sending ``credentials`` to their origin only.
    Raises only :mod:`callwarden.providers.errors` types (see the module docstring)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        return decode_data_uri(url, max_bytes=max_bytes, allowed_types=allowed_types)
    shown = shown_url(url)
    if scheme not in ("http", "https"):
        raise MediaRefused(f"unsupported media URL scheme in {shown!r}")
    try:
        async with asyncio.timeout(timeout_s):
            declared, data = await _fetch(session, url, policy=policy, max_bytes=max_bytes,
                                          allowed_types=allowed_types,
                                          credentials=credentials)
    except TimeoutError as exc:
        raise ProviderTimeout(f"GET {shown} timed out after {timeout_s}s") from exc
    except (aiohttp.InvalidURL, UnicodeError, ValueError) as exc:
        raise MediaError(f"invalid media URL {shown!r}: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise TransientError(f"GET {shown} failed: {exc!r}") from exc
    return _checked(declared, data, allowed_types, url, shown)
