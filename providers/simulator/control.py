"""The simulator's control API under ``/_sim``: arm faults, queue scripts, read the
journal, move the clock, register an account-level webhook (ElevenLabs' workspace
webhooks), set a provider account's limits and read what they saw
(:mod:`callwarden.providers.simulator.limits`), reset, and inspect a task. Never
journaled, never faulted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from aiohttp import web

from callwarden.providers.simulator.limits import Account, Limits
from callwarden.providers.simulator.model import Fault, Script

if TYPE_CHECKING:
    from callwarden.providers.simulator.core import Simulator

__all__ = ["control_routes"]

T = TypeVar("T")


class _FaultRequest(msgspec.Struct, kw_only=True):
    provider: str
    route: str
    fault: Fault


class _ScriptRequest(msgspec.Struct, kw_only=True):
    provider: str
    script: Script


class _WebhookRequest(msgspec.Struct, kw_only=True):
    provider: str
    url: str
    webhook_id: str | None = None


class _LimitsRequest(msgspec.Struct, kw_only=True):
    provider: str
    limits: Limits


class _AdvanceRequest(msgspec.Struct, kw_only=True):
    seconds: float


async def _decode(request: web.Request, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(await request.read(), type=kind)
    except msgspec.DecodeError as exc:
        raise web.HTTPBadRequest(text=msgspec.json.encode({"error": str(exc)}).decode(),
                                 content_type="application/json") from exc


def _ok(data: Any = None) -> web.Response:
    return web.json_response({"ok": True} if data is None else data)


def _account(sim: Simulator, provider: str) -> Account:
    """``provider``'s account; 404 when its module enforces no account limits."""
    account = sim.accounts.get(provider)
    if account is None:
        error = {"error": f"the simulated {provider!r} enforces no account limits"}
        raise web.HTTPNotFound(text=msgspec.json.encode(error).decode(),
                               content_type="application/json")
    return account


def control_routes(sim: Simulator) -> list[web.RouteDef]:
    """The ``/_sim/...`` routes bound to ``sim``."""

    async def arm_fault(request: web.Request) -> web.Response:
        req = await _decode(request, _FaultRequest)
        sim.faults.arm(req.provider, req.route, req.fault)
        return _ok()

    async def queue_script(request: web.Request) -> web.Response:
        req = await _decode(request, _ScriptRequest)
        sim.queue_script(req.provider, req.script)
        return _ok()

    async def journal(request: web.Request) -> web.Response:
        q = request.query
        entries = sim.journal.entries(q.get("provider") or None, q.get("route") or None)
        return _ok([e.to_json() for e in entries])

    async def advance(request: web.Request) -> web.Response:
        req = await _decode(request, _AdvanceRequest)
        return _ok({"now": sim.clock.advance(req.seconds)})

    async def register_webhook(request: web.Request) -> web.Response:
        req = await _decode(request, _WebhookRequest)
        return _ok({"webhook_id": sim.register_webhook(req.provider, req.url,
                                                       req.webhook_id)})

    async def set_limits(request: web.Request) -> web.Response:
        req = await _decode(request, _LimitsRequest)
        account = _account(sim, req.provider)
        account.limits = req.limits
        return _ok(account.to_json())

    async def limits(request: web.Request) -> web.Response:
        return _ok(_account(sim, request.match_info["provider"]).to_json())

    async def reset(request: web.Request) -> web.Response:
        sim.reset()
        return _ok()

    async def task(request: web.Request) -> web.Response:
        found = sim.tasks.get(request.match_info["provider"], request.match_info["task_id"])
        if found is None:
            raise web.HTTPNotFound(text='{"error": "no such task"}',
                                   content_type="application/json")
        return _ok(found.to_json(sim.clock.now()))

    return [
        web.post("/_sim/faults", arm_fault),
        web.post("/_sim/scripts", queue_script),
        web.get("/_sim/journal", journal),
        web.post("/_sim/clock/advance", advance),
        web.post("/_sim/webhooks", register_webhook),
        web.post("/_sim/limits", set_limits),
        web.get("/_sim/limits/{provider}", limits),
        web.post("/_sim/reset", reset),
        web.get("/_sim/tasks/{provider}/{task_id}", task),
    ]
