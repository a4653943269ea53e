"""The provider simulator: one aiohttp server faking KIE, Replicate, ElevenLabs and Anthropic.

Each provider lives in ``providers/simulator/<name>.py`` (``NAME``, ``routes(sim)``,
``render_error(...)``) and is mounted as a sub-application under ``/<NAME>``. Core adds to
each sub-app one middleware that journals the request and then applies the next armed
fault; it also serves result media at ``/media/{token}`` and the control API at ``/_sim``.
Nothing provider-specific lives here: a provider module that enforces account limits
(:mod:`callwarden.providers.simulator.limits`) enrols its account in ``sim.accounts`` and
asks :meth:`Simulator.refusal` before it creates.

Route names: aiohttp wants them unique per provider, but several paths may be one logical
route. A name ``"create.by_model"`` is journaled and faulted as ``"create"``.

Use it in tests as ``async with running_simulator() as rs: ...`` or run it standalone with
``python -m callwarden.providers.simulator --port 8765``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib
import math
import random
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from callwarden.providers.base import ProviderSettings
from callwarden.providers.simulator.control import control_routes
from callwarden.providers.simulator.journal import Faults, Journal, JournalEntry
from callwarden.providers.simulator.limits import Account, Accounts, Limits, Refusal
from callwarden.providers.simulator.media import MediaHost
from callwarden.providers.simulator.model import (
    Clock,
    Fault,
    Phase,
    Script,
    Step,
    Task,
    TaskStore,
    WebhookPlan,
)
from callwarden.providers.simulator.webhooks import Delivery, Webhooks

__all__ = [
    "JOURNALED",
    "MAX_HANG_S",
    "PROVIDER_MODULES",
    "Account",
    "Accounts",
    "Clock",
    "Delivery",
    "Fault",
    "Faults",
    "Journal",
    "JournalEntry",
    "Limits",
    "MediaHost",
    "Phase",
    "ProviderModule",
    "RunningSimulator",
    "Script",
    "Simulator",
    "Step",
    "Task",
    "TaskStore",
    "WebhookPlan",
    "Webhooks",
    "build_app",
    "load_provider_modules",
    "main",
    "running_simulator",
]

PROVIDER_MODULES: tuple[str, ...] = (
    "callwarden.providers.simulator.kie",
    "callwarden.providers.simulator.replicate",
    "callwarden.providers.simulator.elevenlabs",
    "callwarden.providers.simulator.anthropic",
)
MAX_HANG_S = 120.0
#: The journal entry of the request being handled (set by the journaling middleware).
JOURNALED: Final = web.RequestKey("callwarden.simulator.journaled", JournalEntry)
OnPhase = Callable[[Phase], Awaitable[None]]


class ProviderModule(Protocol):
    """What a ``providers/simulator/<name>.py`` module exposes."""

    NAME: str

    def routes(self, sim: Simulator) -> list[web.RouteDef]: ...

    def render_error(self, status: int, message: str, *, retry_after: float | None = None,
                     in_body: bool = False) -> web.Response: ...


def load_provider_modules(names: Sequence[str] = PROVIDER_MODULES) -> list[ProviderModule]:
    """Import each provider module; skip one that does not exist (yet). An import error
    *inside* an existing module is raised, not hidden."""
    found: list[ProviderModule] = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            if exc.name == name:
                continue
            raise
        found.append(cast(ProviderModule, module))
    return found


def _secret(rng: random.Random, prefix: str, size: int, *, b64: bool) -> str:
    raw = rng.randbytes(size)
    return prefix + (base64.b64encode(raw).decode() if b64 else raw.hex())


class Simulator:
    """The state shared by every provider route: clock, journal, tasks, faults, media,
    webhooks, account limits, scripts queued through the control API, and background
    jobs."""

    def __init__(self, *, api_key: str = "sim-key", clock_factor: float = 1.0,
                 seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock(clock_factor)
        self.journal = Journal()
        self.tasks = TaskStore(self.clock)
        self.faults = Faults(self.clock.now)
        self.media = MediaHost(self.clock, self.rng)
        self.webhooks = Webhooks(self.clock)
        self.accounts = Accounts(self.clock.now)
        self.api_key = api_key
        self.base_url = ""
        self.webhook_secrets: dict[str, str] = {
            "replicate": _secret(self.rng, "whsec_", 24, b64=True),
            "kie": _secret(self.rng, "", 16, b64=False),
            "elevenlabs": _secret(self.rng, "wsec_", 16, b64=False),
        }
        # Webhooks registered with the provider account rather than per request (ElevenLabs'
        # workspace webhooks): provider -> webhook_id -> url. Like the secrets, they are
        # account settings, so reset() keeps them.
        self.workspace_webhooks: dict[str, dict[str, str]] = {}
        self.modules: dict[str, ProviderModule] = {}
        self._scripts: dict[str, deque[Script]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def set_base_url(self, url: str) -> None:
        self.base_url = url.rstrip("/")
        self.media.base_url = self.base_url

    def provider_url(self, provider: str, path: str = "") -> str:
        """Absolute URL of ``path`` under ``provider``'s prefix on this simulator."""
        return f"{self.base_url}/{provider}{path}"

    def register_webhook(self, provider: str, url: str, webhook_id: str | None = None) -> str:
        """Register ``url`` as an account-level webhook of ``provider``; its id."""
        hooks = self.workspace_webhooks.setdefault(provider, {})
        webhook_id = webhook_id or f"{self.rng.getrandbits(80):020x}"
        hooks[webhook_id] = url
        return webhook_id

    def queue_script(self, provider: str, script: Script) -> None:
        """The next task created for ``provider`` (without ``_sim``) follows ``script``."""
        self._scripts.setdefault(provider, deque()).append(script)

    def script_for(self, provider: str, request_input: Mapping[str, Any]) -> Script:
        """The request's ``_sim`` script, else the next queued one, else the default."""
        if "_sim" in request_input:
            try:
                return msgspec.convert(request_input["_sim"], Script)
            except msgspec.ValidationError as exc:
                raise web.HTTPBadRequest(text=f"invalid _sim script: {exc}") from exc
        queue = self._scripts.get(provider)
        return queue.popleft() if queue else Script()

    def refusal(self, account: Account, request: web.Request) -> Refusal | None:
        """Why ``account``'s limits refuse the create ``request`` now (``"rate"`` or
        ``"concurrency"``), else None. A refusal is counted, and marked in the request's
        journal entry (which is then not ``processed``)."""
        reason = account.refusal()
        if reason is not None:
            self._journal_refused(request, reason)
        return reason

    def refused(self, account: Account, request: web.Request, reason: Refusal) -> None:
        """Count and journal, as :meth:`refusal` does, the create ``request`` refused for
        ``reason`` by a cap the provider module keeps itself (ElevenLabs' plan)."""
        account.refused(reason)
        self._journal_refused(request, reason)

    def _journal_refused(self, request: web.Request, reason: Refusal) -> None:
        entry = request.get(JOURNALED)
        if isinstance(entry, JournalEntry):
            self.journal.refuse(entry, reason)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the background; it is cancelled on reset and close."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def drive(self, task: Task, on_phase: OnPhase, *, interval_s: float = 0.02,
              observe: bool = True,
              observer: Callable[[], Phase] | None = None) -> asyncio.Task[None]:
        """Advance ``task`` in the background (one observation per tick when ``observe``)
        and await ``on_phase`` on each change of phase name, until a terminal phase.
        For providers that call back: the task progresses even when nobody polls.
        ``observer``: the provider's own observation (e.g. one that applies a deadline
        first), in place of ``task.observe``/``task.peek``."""
        def default() -> Phase:
            now = self.clock.now()
            return task.observe(now) if observe else task.peek(now)

        return self.spawn(self._drive(observer or default, on_phase, interval_s))

    async def _drive(self, observe: Callable[[], Phase], on_phase: OnPhase,
                     interval_s: float) -> None:
        last: str | None = None
        while True:
            phase = observe()
            if phase.name != last:
                last = phase.name
                await on_phase(phase)
            if phase.terminal:
                return
            await asyncio.sleep(interval_s)

    def reset(self) -> None:
        """Forget tasks, journal, faults, scripts, media, deliveries and account limits and
        counts (clock stays)."""
        for job in self._background:
            job.cancel()
        self.journal.clear()
        self.tasks.clear()
        self.faults.clear()
        self.accounts.reset()
        self.media.clear()
        self._scripts.clear()
        self.webhooks.reset()

    async def close(self) -> None:
        jobs = list(self._background)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self.webhooks.close()


def _route_name(request: web.Request) -> str:
    name = request.match_info.route.name or ""
    return name.split(".", 1)[0]


def _fault_message(status: int) -> str:
    return "rate limited" if status == 429 else f"simulated upstream error (HTTP {status})"


async def _truncated_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The real answer's body cut in half, sent as a 200 JSON response."""
    try:
        resp = await handler(request)
        body = resp.body if isinstance(resp, web.Response) else None
    except web.HTTPException as exc:
        body = exc.body
    raw = body if isinstance(body, bytes) and len(body) > 2 else b'{"status": "succ'
    return web.Response(status=200, body=raw[: len(raw) // 2],
                        content_type="application/json")


def _padded_gzip(body: bytes, inflated_bytes: int) -> bytes:
    """``body`` behind ``inflated_bytes`` of spaces, gzip-compressed (level 9)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * 2**20
    parts = [z.compress(chunk) for _ in range(inflated_bytes // len(chunk))]
    parts += [z.compress(b" " * (inflated_bytes % len(chunk)) + body), z.flush()]
    return b"".join(parts)


async def _gzip_bomb(fault: Fault, request: web.Request, handler: Handler
                     ) -> web.StreamResponse:
    """The real answer, padded to ``fault.inflated_bytes`` and gzipped (a decompression
    bomb a client that inflates without a limit reads whole)."""
    try:
        resp = await handler(request)
        status, body = resp.status, resp.body if isinstance(resp, web.Response) else None
        content_type = resp.headers.get("Content-Type", "application/json")
    except web.HTTPException as exc:
        status, body, content_type = exc.status, exc.body, exc.content_type
    raw = body if isinstance(body, bytes) else b"{}"
    bomb = await asyncio.to_thread(_padded_gzip, raw, fault.inflated_bytes)
    return web.Response(status=status, body=bomb, headers={
        "Content-Type": content_type,
        "Content-Encoding": "gzip"})


async def _reset(request: web.Request) -> web.StreamResponse:
    """Drop the connection without answering."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise ConnectionResetError("simulated connection reset")


async def _apply_fault(fault: Fault, module: ProviderModule, request: web.Request,
                       handler: Handler) -> web.StreamResponse:
    kind = fault.kind
    if kind == "http_status":
        return module.render_error(fault.status, _fault_message(fault.status),
                                   retry_after=fault.retry_after)
    if kind in ("rate_limit", "rate_limit_in_body"):
        return module.render_error(429, _fault_message(429), retry_after=fault.retry_after,
                                   in_body=kind == "rate_limit_in_body")
    if kind == "reset":
        return await _reset(request)
    if kind == "redirect":
        status = fault.status if 300 <= fault.status < 400 else 307
        return web.Response(status=status, headers={"Location": fault.location or "/"})
    if kind == "hang":  # the answer is late and the request not yet handled
        await asyncio.sleep(min(fault.hang_s, MAX_HANG_S))
        return await handler(request)
    if kind == "gzip_bomb":
        return await _gzip_bomb(fault, request, handler)
    if kind == "late":  # handled at once (a create creates), answered late
        response = await handler(request)
        await asyncio.sleep(min(fault.hang_s, MAX_HANG_S))
        return response
    return await _truncated_json(request, handler)


def _journal_and_faults(sim: Simulator, module: ProviderModule) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = _route_name(request)
        fault = sim.faults.take(module.NAME, route) if route else None
        entry = JournalEntry(
            provider=module.NAME, route=route, method=request.method, path=request.path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(), at=sim.clock.now(),
            fault=fault.kind if fault else None,
        )
        sim.journal.record(entry)
        request[JOURNALED] = entry
        if fault is None:
            return await handler(request)
        return await _apply_fault(fault, module, request, handler)

    return middleware


def build_app(sim: Simulator, modules: Sequence[ProviderModule] | None = None) -> web.Application:
    """The root app: control API, media host, and one sub-app per provider module."""
    app = web.Application()
    app.add_routes(control_routes(sim))
    app.router.add_get("/media/{token}", sim.media.handle)
    for module in load_provider_modules() if modules is None else modules:
        sub = web.Application(middlewares=[_journal_and_faults(sim, module)])
        sub.add_routes(module.routes(sim))
        app.add_subapp(f"/{module.NAME}", sub)
        sim.modules[module.NAME] = module
    return app


@dataclass
class RunningSimulator:
    sim: Simulator
    base_url: str

    @property
    def settings(self) -> ProviderSettings:
        """Every provider endpoint pointing at this simulator."""
        return ProviderSettings.for_simulator(self.base_url, self.sim.api_key)

    def url(self, provider: str, path: str = "") -> str:
        return self.sim.provider_url(provider, path)


@asynccontextmanager
async def running_simulator(
    host: str = "127.0.0.1", port: int = 0, *, api_key: str = "sim-key",
    clock_factor: float = 1.0, seed: int = 0,
    modules: Sequence[ProviderModule] | None = None,
) -> AsyncIterator[RunningSimulator]:
    """Serve a fresh :class:`Simulator` on ``host:port`` (0 = any free port), with the
    given provider ``modules`` (default: every module of :data:`PROVIDER_MODULES`)."""
    sim = Simulator(api_key=api_key, clock_factor=clock_factor, seed=seed)
    runner = web.AppRunner(build_app(sim, modules), shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        sim.set_base_url(f"http://{host}:{bound[1]}")
        yield RunningSimulator(sim=sim, base_url=sim.base_url)
    finally:
        await sim.close()
        await runner.cleanup()


#: How each provider's client presents the key, so a user can point any client here.
KEY_HEADERS: Mapping[str, str] = {
    "anthropic": "x-api-key: {key}",
    "elevenlabs": "xi-api-key: {key}",
    "kie": "Authorization: Bearer {key}",
    "replicate": "Authorization: Bearer {key}",
}

KEY_HELP = ("Every provider route wants the one key given by --api-key (default 'sim-key'), "
            "sent the way the real API wants it: " + "; ".join(
                f"{name} '{header.format(key='<key>')}'" for name, header in KEY_HEADERS.items())
            + ". A request without it, or with another, is answered 401 in that provider's "
            "own error shape (KIE: code 401 in its 200 envelope; KIE, like its Cloudflare "
            "front, also wants a User-Agent). The URLs, key headers and webhook signing "
            "secrets are printed at start.")


def _port(text: str) -> int:
    if not text.strip().isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"want a port 0..65535 (0: any free port), got {text!r}")
    return int(text)


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"want a number > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    """The simulator's options, shared by ``python -m callwarden.providers.simulator`` and
    ``callwarden simulator``."""
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=_port, default=default_port,
                        help="the port to listen on (0: any free port)")
    parser.add_argument("--api-key", default="sim-key",
                        help="the key every provider route accepts (default: sim-key)")
    parser.add_argument("--clock-factor", type=_factor, default=1.0,
                        help="simulated seconds per real second (e.g. 60 for demos)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the simulator's randomness (ids, webhook secrets)")


def forwarded(args: argparse.Namespace) -> list[str]:
    """``args`` (parsed by :func:`add_arguments`) as an argv for :func:`main`."""
    return ["--host", args.host, "--port", str(args.port), "--api-key", args.api_key,
            "--clock-factor", str(args.clock_factor), "--seed", str(args.seed)]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m callwarden.providers.simulator",
                                     description="Run the provider simulator.",
                                     epilog=KEY_HELP)
    add_arguments(parser, default_port=8765)
    return parser.parse_args(argv)


def describe(sim: Simulator) -> list[str]:
    """What a client needs to talk to ``sim``: each provider's URL and key header, and
    the secret each provider signs its webhooks with."""
    lines = []
    for name in sorted(sim.modules):
        header = KEY_HEADERS.get(name, "{key}").format(key=sim.api_key)
        lines.append(f"  {name:<11} {sim.provider_url(name)}  key header '{header}'")
    for name, secret in sorted(sim.webhook_secrets.items()):
        lines.append(f"  {name:<11} webhook signing secret {secret}")
    return lines


async def _serve(args: argparse.Namespace) -> None:
    async with running_simulator(args.host, args.port, api_key=args.api_key,
                                 clock_factor=args.clock_factor, seed=args.seed) as rs:
        print(f"simulator listening on {rs.base_url} "
              f"(providers: {', '.join(sorted(rs.sim.modules)) or 'none'})", flush=True)
        print("\n".join(describe(rs.sim)), flush=True)
        await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m callwarden.providers.simulator``."""
    with suppress(KeyboardInterrupt):
        asyncio.run(_serve(_parse_args(argv)))
    return 0
