"""``callwarden simulator`` as a real process: it says at start which key each provider
route wants and how it is sent, and that description is true (the printed header gets
past the gate; no header gets the provider's own 401)."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from callwarden.providers.simulator.core import KEY_HEADERS

pytestmark = pytest.mark.asyncio

# One cheap request per provider that reaches the route's handler once authenticated.
PROBES: dict[str, tuple[str, str, dict[str, str]]] = {
    "anthropic": ("POST", "/v1/messages", {"anthropic-version": "2023-06-01"}),
    "elevenlabs": ("GET", "/v1/dubbing/missing", {}),
    "kie": ("GET", "/api/v1/jobs/recordInfo?taskId=missing", {}),
    "replicate": ("GET", "/v1/predictions/missing", {}),
}


@dataclass
class Started:
    base_url: str
    providers: dict[str, tuple[str, str]]  # name -> (url, "Header: value")
    secrets: dict[str, str]


async def _read_banner(proc: asyncio.subprocess.Process) -> Started:
    assert proc.stdout is not None
    base_url = ""
    providers: dict[str, tuple[str, str]] = {}
    secrets: dict[str, str] = {}
    while len(secrets) < 3:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line, "simulator exited before describing itself"
        if m := re.match(r"simulator listening on (\S+)", line):
            base_url = m.group(1)
        elif m := re.match(r"\s+(\w+)\s+(\S+)\s+key header '([^']+)'", line):
            providers[m.group(1)] = (m.group(2), m.group(3))
        elif m := re.match(r"\s+(\w+)\s+webhook signing secret (\S+)", line):
            secrets[m.group(1)] = m.group(2)
    return Started(base_url, providers, secrets)


@pytest.fixture
async def started() -> AsyncIterator[Started]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "simulator", "--port", "0",
        "--api-key", "key-from-the-command-line", "--seed", "7",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        yield await _read_banner(proc)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def _gate_status(provider: str, status: int, body: object) -> int:
    """The status a provider's gate answered: KIE puts it in its 200 envelope."""
    if provider == "kie" and isinstance(body, dict) and isinstance(body.get("code"), int):
        return int(body["code"])
    return status


async def _probe(session: aiohttp.ClientSession, provider: str, url: str,
                 headers: dict[str, str]) -> int:
    method, path, extra = PROBES[provider]
    async with session.request(method, url + path, headers={**extra, **headers},
                               json={} if method == "POST" else None) as resp:
        body = await resp.json(content_type=None)
        return _gate_status(provider, resp.status, body)


async def test_the_printed_key_header_is_the_one_each_provider_accepts(
        started: Started) -> None:
    assert started.base_url.startswith("http://127.0.0.1:")
    assert set(started.providers) == set(KEY_HEADERS)
    assert set(started.secrets) == {"kie", "replicate", "elevenlabs"}
    async with aiohttp.ClientSession(headers={"User-Agent": "callwarden-test"}) as session:
        for provider, (url, header) in started.providers.items():
            name, _, value = header.partition(": ")
            assert "key-from-the-command-line" in value
            accepted = await _probe(session, provider, url, {name: value})
            refused = await _probe(session, provider, url, {})
            assert accepted != 401, provider
            assert refused == 401, provider


async def test_help_names_every_provider_header() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "simulator", "--help",
        stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    text = " ".join(out.decode().split())
    assert proc.returncode == 0
    for provider, header in KEY_HEADERS.items():
        assert f"{provider} '{header.format(key='<key>')}'" in text
