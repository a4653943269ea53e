"""Acme Render, a provider callwarden does not ship, served on 127.0.0.1 for the tests of a
host's own adapter (``docs/examples/acme_host/providers.py``).

Its API is the host's business (the adapter's docstring has it). Renders stay
``rendering`` while the server is ``held`` (a worker can be killed mid-poll, and the render
finishes after it died); :meth:`Acme.release` lets them finish. Every create and poll is
counted per render; results are PNG files it serves itself."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from aiohttp import web

from callwarden.providers import adapters
from callwarden.providers.kinds import KINDS
from callwarden.providers.registry import PROVIDERS, WEBHOOKS
from tests.support import serving_app

ADAPTER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "acme_host" / "providers.py"

KEY = "acme-key"
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00"
       b"\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05"
       b"\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")


@dataclass
class Acme:
    """The server's state: renders by id, what each was asked, and the answers it gives."""

    url: str = ""
    held: bool = True
    renders: dict[str, str] = field(default_factory=dict)  # id -> prompt
    callbacks: dict[str, str | None] = field(default_factory=dict)  # id -> callback_url
    polls: dict[str, int] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)  # prompts whose render ends in error
    # a create waits on create_gate when one is set (a slow provider); creating: one came
    create_gate: asyncio.Event | None = None
    creating: asyncio.Event = field(default_factory=asyncio.Event)
    poll_failures: int = 0  # the next polls answered 502 (an overloaded gateway)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def release(self) -> None:
        self.held = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v2/renders", self._create)
        app.router.add_get("/v2/renders/{id}", self._poll)
        app.router.add_get("/files/{name}", self._file)
        return app

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Token {KEY}"

    async def _create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "bad token"}, status=401)
        body = await request.json()
        self.creating.set()
        if self.create_gate is not None:
            await self.create_gate.wait()
        render_id = f"r_{next(self._ids)}"
        self.renders[render_id] = str(body.get("prompt", ""))
        self.callbacks[render_id] = body.get("callback_url")
        self.polls[render_id] = 0
        return web.json_response({"render": {"id": render_id, "state": "queued"}}, status=201)

    async def _poll(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "bad token"}, status=401)
        render_id = request.match_info["id"]
        if render_id not in self.renders:
            return web.json_response({"error": "no such render"}, status=404)
        self.polls[render_id] += 1
        if self.poll_failures > 0:
            self.poll_failures -= 1
            return web.Response(status=502, text="bad gateway")
        render: dict[str, object] = {"id": render_id, "state": "rendering"}
        if not self.held and self.renders[render_id] in self.failing:
            render.update(state="error", error={"message": "the scene would not render"})
        elif not self.held:
            render.update(state="done", files=[{"url": f"{self.url}/files/{render_id}.png"}])
        return web.json_response({"render": render})

    async def _file(self, request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")


@asynccontextmanager
async def running_acme() -> AsyncIterator[Acme]:
    acme = Acme()
    async with serving_app(acme.app()) as url:
        acme.url = url
        yield acme


@contextmanager
def registry_restored() -> Iterator[None]:
    """The provider registry as it was before the block (a test registers a host's
    provider without leaking it into the next test of the process)."""
    kinds, providers, hooks = dict(KINDS), dict(PROVIDERS), dict(WEBHOOKS)
    loaded = set(adapters._LOADED)
    try:
        yield
    finally:
        KINDS.clear()
        KINDS.update(kinds)
        PROVIDERS.clear()
        PROVIDERS.update(providers)
        WEBHOOKS.clear()
        WEBHOOKS.update(hooks)
        adapters._LOADED.clear()
        adapters._LOADED.update(loaded)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_example_adapter() -> ModuleType:
    """``docs/examples/acme_host/providers.py`` imported under a name of its own (its file
    name, ``providers``, is the host's top-level module, not the test process's), after
    the host's own clients it imports (``vendors.py``, a name the test process has no
    other module under)."""
    if "vendors" not in sys.modules:
        _load("vendors", ADAPTER.parent / "vendors.py")
    return _load("acme_host_providers", ADAPTER)
