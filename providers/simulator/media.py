"""The simulator's result-media host: fake bytes behind URLs that expire on the sim clock.

Provider modules mint a URL with :meth:`MediaHost.put` when a task succeeds (with the
provider's TTL); core serves it at ``GET /media/{token}`` until it expires, then 404.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiohttp import web

from callwarden.providers.simulator.model import Clock, Script

__all__ = ["MediaHost", "StoredMedia", "fake_media"]

_FAKE_HEADERS: dict[str, bytes] = {
    "image/png": b"\x89PNG\r\n\x1a\n",
    "image/jpeg": b"\xff\xd8\xff\xe0",
    "image/webp": b"RIFF\x00\x00\x00\x00WEBP",
    "video/mp4": b"\x00\x00\x00\x18ftypmp42",
    "audio/mpeg": b"ID3\x04\x00",
}


def fake_media(content_type: str, seed: str, size: int = 256) -> bytes:
    """Deterministic fake bytes that start with the type's magic number."""
    head = _FAKE_HEADERS.get(content_type, b"")
    body = random.Random(seed).randbytes(max(0, size - len(head)))
    return head + body


@dataclass
class StoredMedia:
    data: bytes
    content_type: str
    expires_at: float | None  # simulated unix seconds; None = never
    expired: bool = False
    redirect: str | None = None  # answer 302 to this location instead
    status: int | None = None  # answer this HTTP status instead
    drops_connection: bool = False  # close the connection once sent, unannounced


class MediaHost:
    """Holds media bytes by token; ``base_url`` is set by core once it listens."""

    def __init__(self, clock: Clock, rng: random.Random) -> None:
        self._clock = clock
        self._rng = rng
        self._items: dict[str, StoredMedia] = {}
        self.base_url = ""
        self.requests: list[str] = []  # every GET/HEAD, by URL path, in order
        # the client's end of the connection each one came on (address, port): a kept
        # connection shows as the same port again
        self.peers: list[tuple[str, int]] = []

    def put(self, data: bytes, content_type: str, ttl_s: float | None, *,
            script: Script | None = None) -> str:
        """Store ``data``; return its absolute URL (valid ``ttl_s`` simulated seconds).
        ``script``'s hostile options apply: an HTML page or a given body instead of the
        media, a redirect."""
        token = f"{self._rng.getrandbits(128):032x}"
        expires = None if ttl_s is None else self._clock.now() + ttl_s
        if script is not None and script.media_body == "html":
            data, content_type = b"<!doctype html><h1>502 Bad Gateway</h1>", "text/html"
        if script is not None and script.media_served is not None:
            data = script.media_served.body.encode()
            content_type = script.media_served.content_type
        redirect = script.media_redirect if script is not None else None
        status = script.media_status if script is not None else None
        self._items[token] = StoredMedia(
            data, content_type, expires, redirect=redirect, status=status,
            drops_connection=script is not None and script.media_drops_connection)
        return f"{self.base_url}/media/{token}"

    def expire(self, url: str) -> None:
        item = self._items.get(_token(url))
        if item is not None:
            item.expired = True

    def is_expired(self, url: str) -> bool:
        """True when the URL is unknown or past its TTL (what a GET would answer 404 to)."""
        return self.lookup(url) is None

    def lookup(self, url: str) -> StoredMedia | None:
        """The media a URL this host minted points at, unless expired or unknown."""
        return self.get(_token(url))

    def get(self, token: str) -> StoredMedia | None:
        item = self._items.get(token)
        if item is None or item.expired:
            return None
        if item.expires_at is not None and self._clock.now() >= item.expires_at:
            return None
        return item

    def clear(self) -> None:
        self._items.clear()
        self.requests.clear()
        self.peers.clear()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET``/``HEAD /media/{token}``: the bytes, or 404 once expired."""
        self.requests.append(request.path)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.peers.append((str(peer[0]), int(peer[1])) if peer else ("", 0))
        item = self.get(request.match_info["token"])
        if item is None:
            return web.Response(status=404, text="Not Found")
        if item.redirect is not None:
            return web.Response(status=302, headers={"Location": item.redirect})
        if item.status is not None:
            return web.Response(status=item.status, text=f"HTTP {item.status}")
        response = web.Response(body=item.data, content_type=item.content_type)
        if item.drops_connection and request.transport is not None:
            await response.prepare(request)
            await response.write_eof()
            request.transport.close()  # sent in full first; no Connection: close said
        return response


def _token(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]
