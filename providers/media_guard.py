"""Where result media may be fetched from: the guard against server-side request forgery.

A provider's answer (a model's output, a callback body) names the URLs callwarden will
download and store as the user's asset. Fetched blindly, a URL pointing at an internal
address (a cloud metadata endpoint, a database, another service on the host) would be read
and handed to the user. So every media URL — and every redirect hop — must pass
:class:`MediaPolicy` (DESIGN §10):

- the scheme is ``http`` or ``https`` (``data:`` URIs never touch the network);
- the host is one of the kind's known media hosts (exact names or ``*.suffix`` patterns,
  from the kind registry, plus the operator's extra allow-list), or is the host *and port*
  of the provider endpoint callwarden is configured with (so a simulator or a proxy works);
- every address the host resolves to is a public (globally routable) one — loopback,
  private, link-local (the ``169.254.169.254`` metadata endpoint), shared, multicast and
  reserved ranges are refused — unless the host is that configured endpoint. The check runs
  in the connection's own resolver (:class:`GuardedResolver`), so a DNS answer cannot change
  between the check and the connection; a literal IP in the URL is checked up front.

A refusal is :class:`~callwarden.providers.errors.MediaRefused`: nothing was fetched; the finalizer
fails the call and refunds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable
from typing import Any

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from callwarden.providers.closing import AsyncClosing
from callwarden.providers.errors import MediaRefused

__all__ = ["GuardedResolver", "MediaPolicy", "MediaSessions", "Origin", "check_url",
           "is_public_address", "media_session", "origin_of", "shown_url"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def shown_url(url: str) -> str:
    """``url`` without query and fragment (signed URLs carry credentials there)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url.split("?", 1)[0].split("#", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(query="", fragment=""))


#: ``(scheme, host, port)``, lower case, the port made explicit.
Origin = tuple[str, str, int]


def origin_of(url: str) -> Origin | None:
    """``url``'s origin; ``None`` for a URL that is not http(s) with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, IPv4-compatible)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is globally routable: not loopback, private,
    link-local (metadata), shared, site-local, multicast, reserved or unspecified — nor
    an IPv6 address carrying such an IPv4 one (mapped, 6to4, NAT64, IPv4-compatible)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _SITE_LOCAL:
            return False
        inner = _embedded_v4(ip)
        if inner is not None:
            return inner.is_global and not inner.is_multicast
    return ip.is_global and not ip.is_multicast


def _matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and host != pattern[2:]
    return host == pattern


class MediaPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """``hosts``: media host names or ``*.suffix`` patterns (lower case); ``endpoints``:
    the configured provider endpoints as ``(host, port)``, allowed whatever they resolve
    to; ``max_redirects``: hops followed, each checked like the first URL."""

    hosts: frozenset[str] = frozenset()
    endpoints: frozenset[tuple[str, int]] = frozenset()
    max_redirects: int = 5

    @classmethod
    def build(cls, hosts: Iterable[str], endpoint_urls: Iterable[str]) -> MediaPolicy:
        """From host patterns and endpoint base URLs (``https://api.kie.ai``)."""
        endpoints = set()
        for url in endpoint_urls:
            parts = urllib.parse.urlsplit(url)
            if parts.hostname:
                port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 443)
                endpoints.add((parts.hostname.lower(), port))
        return cls(hosts=frozenset(h.strip().lower() for h in hosts if h.strip()),
                   endpoints=frozenset(endpoints))

    def is_endpoint(self, host: str, port: int) -> bool:
        return (host.lower(), port) in self.endpoints

    def allows_host(self, host: str, port: int) -> bool:
        host = host.lower()
        return self.is_endpoint(host, port) or any(_matches(host, p) for p in self.hosts)

    def allows_url(self, url: str) -> bool:
        """Whether ``url`` is an http(s) URL on a host this policy allows (the host
        alone: :func:`check_url` checks the rest before anything is fetched)."""
        origin = origin_of(url)
        return origin is not None and self.allows_host(origin[1], origin[2])


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_url(url: str, policy: MediaPolicy) -> tuple[str, int]:
    """``(host, port)`` of an http(s) ``url`` the policy allows; :class:`MediaRefused`
    otherwise. Pure: the resolved addresses are checked by :class:`GuardedResolver`."""
    shown = shown_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise MediaRefused(f"refused media URL {shown!r}: {exc}") from None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        raise MediaRefused(f"refused media URL {shown!r}: not an http(s) URL with a host")
    host = parts.hostname.lower()
    port = port or _DEFAULT_PORTS[parts.scheme.lower()]
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise MediaRefused(f"refused media URL {shown!r}: host is not a valid name ({exc})"
                           ) from None
    if parts.username is not None or parts.password is not None:
        raise MediaRefused(f"refused media URL {shown!r}: credentials in the URL")
    if not policy.allows_host(host, port):
        raise MediaRefused(f"refused media URL {shown!r}: {host} is not a media host of "
                           "this provider (nor its configured endpoint)")
    if _ip_literal(host) and not policy.is_endpoint(host, port) and not is_public_address(host):
        raise MediaRefused(f"refused media URL {shown!r}: {host} is not a public address")
    return host, port


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses a host any of whose
    addresses is not public (unless it is a configured endpoint of ``policy``)."""

    def __init__(self, policy: MediaPolicy) -> None:
        self.policy = policy
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self.policy.is_endpoint(host, port):
            return found
        bad = [r["host"] for r in found if not is_public_address(r["host"])]
        if bad or not found:
            raise MediaRefused(f"refused media host {host}: resolves to a non-public "
                               f"address ({', '.join(bad) or 'none'})")
        return found

    async def close(self) -> None:
        await self._inner.close()


def media_session(policy: MediaPolicy, **kwargs: Any) -> aiohttp.ClientSession:
    """A session whose every connection goes through :class:`GuardedResolver` (and never
    through a proxy from the environment)."""
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(policy), use_dns_cache=False)
    return aiohttp.ClientSession(connector=connector, trust_env=False, **kwargs)


class MediaSessions(AsyncClosing):
    """One :func:`media_session` per policy, kept open so that a download reuses the
    connection an earlier one made to the same media host (issue 26: a new session per
    finalization paid a resolution, a TCP and TLS handshake and a close per call).

    Nothing of the guard is given up: a new connection is still resolved and checked by
    :class:`GuardedResolver`, and a kept one leads to an address that was checked when it
    was made (a DNS answer that changes later cannot redirect it). No cookie is kept
    between downloads (a media host's cookie never reaches another call's request). A
    session belongs to the event loop it was made on; on another loop a new one is made.
    Close with :meth:`aclose` (the runner, the reconciler and the webhook service do)."""

    def __init__(self) -> None:
        self._open: dict[MediaPolicy, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession]] = {}

    def session(self, policy: MediaPolicy) -> aiohttp.ClientSession:
        """The open session for ``policy`` on the running loop (made on first use)."""
        loop = asyncio.get_running_loop()
        held = self._open.get(policy)
        if held is not None and held[0] is loop and not held[1].closed:
            return held[1]
        session = media_session(policy, cookie_jar=aiohttp.DummyCookieJar())
        self._open[policy] = (loop, session)
        return session

    async def aclose(self) -> None:
        """Close every session made on the running loop (those of a loop that has ended
        went with it)."""
        loop = asyncio.get_running_loop()
        held, self._open = self._open, {}
        for owner, session in held.values():
            if owner is loop:
                await session.close()
