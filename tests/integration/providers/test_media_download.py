"""download() against a tiny aiohttp media server on 127.0.0.1 (not the provider simulator)."""

from __future__ import annotations

import asyncio
import base64
import functools
import socket
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from callwarden.providers.errors import (
    MediaError,
    MediaExpired,
    MediaTooLarge,
    MediaTypeRejected,
    ProviderTimeout,
    RateLimited,
    TransientError,
)
from callwarden.providers.media import Credentials, download
from callwarden.providers.media_guard import MediaPolicy

# The tiny media server runs on 127.0.0.1: allowed as if it were the provider's endpoint.
POLICY = MediaPolicy(hosts=frozenset({"127.0.0.1"}),
                     endpoints=frozenset({("127.0.0.1", p) for p in range(1024, 65536)}))
fetch = functools.partial(download, policy=POLICY)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
CHUNK = 64 * 1024
HUGE = 1024 * CHUNK  # 64 MiB offered; the client may take 1 MiB
LIMIT = 1 * 2**20


@dataclass
class Stream:
    """What the streaming handler managed to send before it stopped."""

    sent: int = 0
    aborted: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class MediaServer:
    base_url: str
    stream: Stream
    release: asyncio.Event


STREAM = web.AppKey("stream", Stream)
RELEASE = web.AppKey("release", asyncio.Event)


async def _stream(request: web.Request, declared_length: bool) -> web.StreamResponse:
    state = request.app[STREAM]
    resp = web.StreamResponse(headers={"Content-Type": "video/mp4"})
    if declared_length:
        resp.content_length = HUGE
    try:
        await resp.prepare(request)
        while state.sent < HUGE:
            await resp.write(b"\x00" * CHUNK)
            state.sent += CHUNK
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        state.aborted = True
        raise
    finally:
        state.done.set()
    return resp


async def _ok(_: web.Request) -> web.Response:
    return web.Response(body=PNG, content_type="image/png")


async def _status(request: web.Request) -> web.Response:
    code = int(request.match_info["code"])
    headers = {"Retry-After": "7"} if code == 429 else None
    return web.Response(status=code, text="nope", headers=headers)


async def _typed(request: web.Request) -> web.Response:
    body = {"html": b"<html>login</html>", "png": PNG, "junk": b"\x01\x02junk" * 10}
    ctype = request.query.get("ct", "application/octet-stream")
    return web.Response(body=body[request.match_info["kind"]], headers={"Content-Type": ctype})


async def _hang_headers(request: web.Request) -> web.Response:
    await request.app[RELEASE].wait()
    return web.Response(body=PNG, content_type="image/png")


async def _hang_body(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "image/png"})
    resp.content_length = len(PNG)
    await resp.prepare(request)
    await resp.write(PNG[:10])
    await request.app[RELEASE].wait()
    return resp


async def _reset(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def _huge(request: web.Request) -> web.StreamResponse:
    return await _stream(request, declared_length=False)


async def _huge_declared(request: web.Request) -> web.StreamResponse:
    return await _stream(request, declared_length=True)


async def _auth(request: web.Request) -> web.Response:
    if request.headers.get("Authorization") != "Bearer k":
        return web.Response(status=401)
    return web.Response(body=PNG, content_type="image/png")


def _app(release: asyncio.Event) -> web.Application:
    app = web.Application()
    app[STREAM] = Stream()
    app[RELEASE] = release
    app.add_routes([
        web.get("/ok.png", _ok), web.get("/status/{code}", _status),
        web.get("/typed/{kind}", _typed), web.get("/huge", _huge),
        web.get("/huge-declared", _huge_declared), web.get("/hang-headers", _hang_headers),
        web.get("/hang-body", _hang_body), web.get("/reset", _reset), web.get("/auth", _auth),
    ])
    return app


@pytest.fixture
async def server() -> AsyncIterator[MediaServer]:
    release = asyncio.Event()
    app = _app(release)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield MediaServer(f"http://127.0.0.1:{port}", app[STREAM], release)
    release.set()
    await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_download_returns_body_and_type(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    got = await fetch(http, f"{server.base_url}/ok.png?sig=secret")
    assert (got.data, got.content_type) == (PNG, "image/png")
    assert got.url.endswith("/ok.png?sig=secret")


async def test_credentials_are_sent_to_their_own_origin(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    credentials = Credentials.for_endpoint(server.base_url, {"Authorization": "Bearer k"})
    got = await fetch(http, f"{server.base_url}/auth", credentials=credentials)
    assert got.data == PNG
    other = Credentials.for_endpoint("http://127.0.0.1:1", {"Authorization": "Bearer k"})
    with pytest.raises(MediaError):  # the server answers 401 to a request without them
        await fetch(http, f"{server.base_url}/auth", credentials=other)


@pytest.mark.parametrize("code", [403, 404, 410])
async def test_gone_media_is_expired(
    server: MediaServer, http: aiohttp.ClientSession, code: int
) -> None:
    with pytest.raises(MediaExpired) as info:
        await fetch(http, f"{server.base_url}/status/{code}?X-Amz-Signature=secret")
    assert info.value.status == code
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("code", [500, 502, 503])
async def test_server_error_is_transient_not_media_error(
    server: MediaServer, http: aiohttp.ClientSession, code: int
) -> None:
    with pytest.raises(TransientError) as info:
        await fetch(http, f"{server.base_url}/status/{code}")
    assert info.value.status == code
    assert not isinstance(info.value, MediaError | ProviderTimeout)


async def test_throttled_download_carries_retry_after(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(RateLimited) as info:
        await fetch(http, f"{server.base_url}/status/429")
    assert info.value.retry_after == 7.0


async def test_other_client_error_is_terminal_media_error(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(MediaError) as info:
        await fetch(http, f"{server.base_url}/auth")
    assert info.value.status == 401
    assert not isinstance(info.value, TransientError)


async def test_huge_body_stops_early_and_closes_the_connection(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(MediaTooLarge):
        await fetch(http, f"{server.base_url}/huge", max_bytes=LIMIT)
    await asyncio.wait_for(server.stream.done.wait(), timeout=5)
    assert server.stream.aborted
    assert server.stream.sent < HUGE


async def test_declared_length_over_limit_is_refused_before_the_body(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(MediaTooLarge, match="Content-Length"):
        await fetch(http, f"{server.base_url}/huge-declared", max_bytes=LIMIT)
    await asyncio.wait_for(server.stream.done.wait(), timeout=5)
    assert server.stream.aborted
    assert server.stream.sent < HUGE


async def test_a_gzipped_body_is_held_to_the_limit_once_inflated(
    http: aiohttp.ClientSession
) -> None:
    """256 MiB of zeros gzipped to ~256 KiB, sent with ``Content-Encoding: gzip``: the
    limit counts inflated bytes, so the download stops at 1 MiB, memory far below the
    inflated size (the media path's cap, kept as it was: issue 24's review, item 4)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join([*(z.compress(bytes(2**20)) for _ in range(256)), z.flush()])

    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Type": "video/mp4",
                                                "Content-Encoding": "gzip"})

    app = web.Application()
    app.router.add_get("/bomb.mp4", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    tracemalloc.start()
    try:
        with pytest.raises(MediaTooLarge, match="exceeds"):
            await fetch(http, f"http://127.0.0.1:{runner.addresses[0][1]}/bomb.mp4",
                        max_bytes=LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await runner.cleanup()
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"


async def test_body_exactly_at_the_limit_is_accepted(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    got = await fetch(http, f"{server.base_url}/ok.png", max_bytes=len(PNG))
    assert len(got.data) == len(PNG)
    with pytest.raises(MediaTooLarge):
        await fetch(http, f"{server.base_url}/ok.png", max_bytes=len(PNG) - 1)


async def test_disallowed_content_type_is_rejected(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(MediaTypeRejected, match="text/html"):
        await fetch(http, f"{server.base_url}/typed/html?ct=text/html; charset=utf-8")


async def test_explicit_allow_list_is_honoured(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    url = f"{server.base_url}/typed/png?ct=image/png"
    with pytest.raises(MediaTypeRejected):
        await fetch(http, url, allowed_types=frozenset({"audio/*"}))
    got = await fetch(http, f"{server.base_url}/typed/html?ct=text/html", allowed_types=None)
    assert got.content_type == "application/octet-stream"  # accepted, stored inert


async def test_octet_stream_media_is_accepted_with_its_sniffed_type(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    got = await fetch(http, f"{server.base_url}/typed/png")
    assert got.content_type == "image/png"


async def test_octet_stream_of_unknown_bytes_is_rejected(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(MediaTypeRejected):
        await fetch(http, f"{server.base_url}/typed/junk")


async def test_no_answer_is_a_timeout(server: MediaServer, http: aiohttp.ClientSession) -> None:
    with pytest.raises(ProviderTimeout):
        await fetch(http, f"{server.base_url}/hang-headers", timeout_s=0.2)


async def test_stalled_body_is_a_timeout(server: MediaServer, http: aiohttp.ClientSession) -> None:
    with pytest.raises(ProviderTimeout):
        await fetch(http, f"{server.base_url}/hang-body", timeout_s=0.2)


async def test_reset_connection_is_transient(
    server: MediaServer, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(TransientError) as info:
        await fetch(http, f"{server.base_url}/reset")
    assert not isinstance(info.value, ProviderTimeout)
    assert isinstance(info.value.__cause__, aiohttp.ClientError)


async def test_refused_connection_is_transient(http: aiohttp.ClientSession) -> None:
    """The port stays bound (never listening) while it is tried: a port closed first
    could be taken by another process's server in between, and then answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(TransientError):
            await fetch(http, f"http://127.0.0.1:{port}/x.png")


@pytest.mark.parametrize("url", ["ftp://example.invalid/x.png", "file:///etc/passwd",
                                 "http://[::1/x"])
async def test_bad_urls_are_terminal_media_errors(http: aiohttp.ClientSession, url: str) -> None:
    with pytest.raises(MediaError) as info:
        await fetch(http, url)
    assert not isinstance(info.value, TransientError)


# --------------------------------------------------------------------------- data: URIs


def _data_uri(data: bytes, ctype: str = "image/png") -> str:
    return f"data:{ctype};base64,{base64.b64encode(data).decode()}"


async def test_data_uri_is_decoded(http: aiohttp.ClientSession) -> None:
    got = await fetch(http, _data_uri(PNG))
    assert (got.data, got.content_type) == (PNG, "image/png")


async def test_percent_encoded_data_uri_is_decoded(http: aiohttp.ClientSession) -> None:
    got = await fetch(http, "data:audio/mpeg,ID3%00%01")
    assert (got.data, got.content_type) == (b"ID3\x00\x01", "audio/mpeg")


async def test_data_uri_over_the_limit_is_too_large(http: aiohttp.ClientSession) -> None:
    with pytest.raises(MediaTooLarge):
        await fetch(http, _data_uri(PNG), max_bytes=len(PNG) - 1)


async def test_data_uri_with_disallowed_type_is_rejected(http: aiohttp.ClientSession) -> None:
    with pytest.raises(MediaTypeRejected):
        await fetch(http, _data_uri(b"hello", "text/plain"))


async def test_untyped_data_uri_is_sniffed(http: aiohttp.ClientSession) -> None:
    got = await fetch(http, f"data:;base64,{base64.b64encode(PNG).decode()}")
    assert got.content_type == "image/png"


@pytest.mark.parametrize("url", ["data:image/png;base64,@@@not-base64", "data:image/png"])
async def test_malformed_data_uri_is_a_media_error(http: aiohttp.ClientSession, url: str) -> None:
    with pytest.raises(MediaError):
        await fetch(http, url)
