"""``data:`` URIs are decoded within their limits (issue 24, item 9), as pure functions:
memory linear in the URI's length whatever whitespace it holds, the decoded size checked
exactly (encoding overhead never counts against the limit), and the declared type a
``type/subtype`` token. End to end (the worker storing them): ``tests/integration/
test_result_content.py``."""

from __future__ import annotations

import base64
import tracemalloc
import urllib.parse

import pytest

from callwarden.providers.errors import MediaError, MediaTooLarge
from callwarden.providers.media import ANY_FILE, decode_data_uri

DATA = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4096  # 1 MiB and 8 bytes
B64 = base64.b64encode(DATA).decode()


def spaced(text: str, every: int = 2) -> str:
    return " ".join(text[i:i + every] for i in range(0, len(text), every))


def test_a_spaced_data_uri_decodes_in_memory_linear_in_its_length() -> None:
    """Whitespace is dropped in bulk, never by splitting the payload into a list of
    words (a 30 MB spaced URI once grew a worker by 717 MiB)."""
    uri = "data:image/png;base64," + spaced(B64)
    tracemalloc.start()
    try:
        got = decode_data_uri(uri, max_bytes=8 * 2**20, allowed_types=ANY_FILE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.data == DATA
    assert peak < 5 * len(uri), f"peak {peak / 2**20:.1f} MiB for {len(uri) / 2**20:.1f} MiB"


def test_a_percent_encoded_payload_decodes_in_memory_linear_in_its_length() -> None:
    uri = "data:application/octet-stream," + urllib.parse.quote(DATA, safe="")
    tracemalloc.start()
    try:
        got = decode_data_uri(uri, max_bytes=len(DATA), allowed_types=ANY_FILE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.data == DATA
    assert peak < 5 * len(uri), f"peak {peak / 2**20:.1f} MiB for {len(uri) / 2**20:.1f} MiB"


@pytest.mark.parametrize("payload", [
    "\r\n".join(B64[i:i + 76] for i in range(0, len(B64), 76)),
    urllib.parse.quote(B64, safe=""),
    " " * 1000 + B64 + "\n" * 1000,
], ids=["line-wrapped", "percent-encoded", "padded-with-whitespace"])
def test_encoding_overhead_never_counts_against_the_limit(payload: str) -> None:
    got = decode_data_uri("data:image/png;base64," + payload, max_bytes=len(DATA),
                          allowed_types=ANY_FILE)
    assert got.data == DATA


def test_one_byte_over_the_limit_is_too_large() -> None:
    with pytest.raises(MediaTooLarge):
        decode_data_uri("data:image/png;base64," + B64, max_bytes=len(DATA) - 1,
                        allowed_types=ANY_FILE)


@pytest.mark.parametrize("uri", [
    "data:image/png\r\n;base64," + B64[:8],
    "data:image/png text/html;base64," + B64[:8],
    "data:image/;base64," + B64[:8],
    "data:/png;base64," + B64[:8],
    "data:image/png;x=\"y\";base64," + B64[:8],
], ids=["crlf", "space", "no-subtype", "no-type", "quoted-parameter"])
def test_a_declared_type_must_be_a_token(uri: str) -> None:
    with pytest.raises(MediaError, match="not a media type"):
        decode_data_uri(uri, allowed_types=ANY_FILE)


def test_parameters_and_case_are_read_as_rfc_2397_writes_them() -> None:
    got = decode_data_uri("data:IMAGE/PNG;name=cat.png;BASE64," + B64[:12],
                          allowed_types=ANY_FILE)
    assert got.content_type == "image/png"
    assert decode_data_uri("data:,hello%20world", allowed_types=ANY_FILE).data == (
        b"hello world")
