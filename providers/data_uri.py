"""``data:`` URIs (RFC 2397) read within their limits (pure).

A ``data:`` URI is as long as the provider's answer makes it, so nothing in it is split,
copied whole more than once, or decoded before it is known to fit:

1. **The length first.** A URI longer than the longest encoding of ``max_bytes`` (every
   byte percent-encoded; or base64 broken into lines, every character percent-encoded)
   plus a header is :class:`MediaTooLarge`, before anything else is read.
2. **The header** (before the first ``,``) is at most :data:`HEADER_MAX` characters of
   ``[type/subtype]*(;attribute=value)[;base64]``, type, subtype and attribute tokens (RFC
   9110) and values tokens or percent-escapes: no space, CR, LF, quote or list. Else
   :class:`MediaError` (the type is never stored unchecked).
3. **The payload** is decoded in bounded pieces — percent-escapes chunk by chunk,
   whitespace (line breaks) dropped in one pass, base64 strictly — so memory stays linear
   in the URI's length whatever it holds.
4. **The decoded size** is checked exactly: encoding overhead (line breaks,
   percent-escapes) never counts against ``max_bytes``.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import urllib.parse
from typing import Final

import msgspec

from callwarden.providers.errors import MediaError, MediaTooLarge
from callwarden.providers.media_types import TOKEN, media_type

__all__ = ["HEADER_MAX", "DataHeader", "decode_payload", "is_data_uri", "longest_payload",
           "read_header"]

HEADER_MAX: Final = 256
_SCHEME: Final = len("data:")
_HEADER: Final = re.compile(
    rf"(?P<type>{TOKEN}/{TOKEN})?(?:;{TOKEN}=(?:{TOKEN}))*(?P<base64>;base64)?", re.I)
_WHITESPACE: Final = b" \t\r\n\f\v"
_CHUNK: Final = 64 * 1024


class DataHeader(msgspec.Struct, frozen=True, kw_only=True):
    """A checked header: the declared type (``""``: none), whether the payload is base64,
    and where the payload starts in the URI."""

    declared: str
    is_base64: bool
    start: int


def is_data_uri(value: str) -> bool:
    """Whether ``value`` is written as a ``data:`` URI (``data:`` then a well-formed header
    and a comma within :data:`HEADER_MAX` characters), whatever its length: a model's text
    that only starts with ``data:`` ("data: none found") is text, not a file."""
    if value[:_SCHEME].lower() != "data:":
        return False
    comma = value.find(",", _SCHEME, _SCHEME + HEADER_MAX + 1)
    if comma < 0:
        return False
    found = _HEADER.fullmatch(value[_SCHEME:comma])
    return found is not None and (not found["type"] or media_type(found["type"]) is not None)


def longest_payload(max_bytes: int, is_base64: bool) -> int:
    """The most characters a payload decoding to ``max_bytes`` can take: every byte
    percent-encoded; base64 with a line break every 64 characters (PEM; MIME breaks at
    76), every character percent-encoded."""
    if not is_base64:
        return 3 * max_bytes
    encoded = 4 * math.ceil(max_bytes / 3)
    return 3 * (encoded + 2 * math.ceil(encoded / 64))


def read_header(uri: str, max_bytes: int) -> DataHeader:
    """Check ``uri``'s length against ``max_bytes`` and read its header."""
    longest = _SCHEME + HEADER_MAX + 1 + longest_payload(max_bytes, True)
    if len(uri) > longest:
        raise MediaTooLarge(f"data: URI is {len(uri)} characters, more than any encoding "
                            f"of at most {max_bytes} bytes takes ({longest})")
    if uri[:_SCHEME].lower() != "data:":
        raise MediaError("malformed data: URI (expected data:[<type>][;base64],<data>)")
    comma = uri.find(",", _SCHEME, _SCHEME + HEADER_MAX + 1)
    if comma < 0:
        raise MediaError(f"malformed data: URI: no ',' ends a header of at most {HEADER_MAX} "
                         "characters (expected data:[<type>][;base64],<data>)")
    header = uri[_SCHEME:comma]
    found = _HEADER.fullmatch(header)
    declared = media_type(found["type"]) if found and found["type"] else ""
    if found is None or declared is None:
        raise MediaError(f"data: URI declares {header[:80]!r}, which is not a media type "
                         "(type/subtype[;attribute=value]...[;base64])")
    payload = len(uri) - comma - 1
    is_base64 = found["base64"] is not None
    if payload > longest_payload(max_bytes, is_base64):
        raise MediaTooLarge(f"data: URI payload is {payload} characters, more than any "
                            f"encoding of at most {max_bytes} bytes takes")
    return DataHeader(declared=declared, is_base64=is_base64, start=comma + 1)


def _unquoted(uri: str, start: int) -> bytes:
    """The percent-decoded bytes of ``uri[start:]``, decoded a chunk at a time (never a
    list of every escape at once); a chunk never ends inside an escape."""
    if uri.find("%", start) < 0:
        return uri[start:].encode()
    out = bytearray()
    end_of_uri = len(uri)
    while start < end_of_uri:
        end = min(start + _CHUNK, end_of_uri)
        cut = uri.rfind("%", max(start + 1, end - 2), end)
        if cut >= 0 and end < end_of_uri:
            end = cut
        out += urllib.parse.unquote_to_bytes(uri[start:end])
        start = end
    return bytes(out)


def _base64(encoded: bytes, max_bytes: int) -> bytes:
    encoded = encoded.translate(None, _WHITESPACE)
    least = len(encoded) // 4 * 3 - 2
    if least > max_bytes:
        raise MediaTooLarge(f"data: URI payload decodes to more than {max_bytes} bytes")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"data: URI has invalid base64: {exc}") from None


def decode_payload(uri: str, header: DataHeader, max_bytes: int) -> bytes:
    """The payload's bytes, at most ``max_bytes`` of them (else :class:`MediaTooLarge`)."""
    data = _unquoted(uri, header.start)
    if header.is_base64:
        data = _base64(data, max_bytes)
    if len(data) > max_bytes:
        raise MediaTooLarge(f"data: URI payload is {len(data)} bytes, over {max_bytes}")
    return data
