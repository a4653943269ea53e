"""The host's provider code: its client for Acme Render, a provider callwarden does not
ship, and its own client for Replicate's predictions, which callwarden does ship.

Acme's API (the host's own knowledge of it): ``POST /v2/renders`` with a JSON body starts a
render and answers ``201 {"render": {"id": ..., "state": "queued"}}``; ``GET
/v2/renders/{id}`` answers its state (``queued``, ``rendering``, ``done`` with ``files``,
``error`` with ``error.message``) or 404 for an id it does not know. Auth is ``Authorization:
Token <key>``. A render created with a ``callback_url`` is announced there when it ends
(``POST`` with ``{"render": {"id": ...}}``, unsigned): a signal only — callwarden's
receiver checks the job's token in the URL and polls the render through this adapter.

Registered through the ``callwarden.providers`` entry point of the host's package (or
``CALLWARDEN_PROVIDERS=providers:PROVIDERS``), the same adapters serve the worker that
creates and polls a task and the reconciler that recovers it after that worker died.
Acme's endpoint comes from ``CALLWARDEN_ACME_URL`` and ``ACME_API_KEY``; Replicate's from
``CALLWARDEN_REPLICATE_URL`` and ``REPLICATE_API_TOKEN``, as for callwarden's own client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from callwarden.providers.errors import (
    BadRequest,
    MalformedResponse,
    SignatureError,
    TransientError,
)
from callwarden.providers.kinds import KindSpec
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Running, Succeeded
from callwarden.providers.registry import ClientRequest, Provider
from callwarden.providers.webhooks import MalformedDelivery, Parsed, json_object, text_field

RENDER = KindSpec(
    name="acme-render", provider="acme", mode="async", family="render",
    stale_threshold_s=600,             # a render that has not moved in 10 minutes is stuck
    result_url_lifetime_s=6 * 3600,    # Acme keeps its files for 6 hours
    poll_interval_s=1.0, poll_budget_s=900,
    media_hosts=("files.acme.example",))


class AcmeRenders:
    """Creates and polls one kind of Acme task over the host's own HTTP calls."""

    def __init__(self, r: ClientRequest) -> None:
        self.kind, self.session, self.base = r.kind, r.session, r.base_url
        self.headers = {"Authorization": f"Token {r.api_key}"}

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        body = dict(request) | ({"callback_url": callback_url} if callback_url else {})
        async with self.session.post(f"{self.base}/v2/renders", json=body,
                                     headers=self.headers) as resp:
            body = await resp.json(content_type=None)
            if resp.status >= 500:
                raise TransientError(f"acme answered {resp.status}", provider="acme")
            if resp.status != 201:
                raise BadRequest(str(body), provider="acme", status=resp.status)
        return str(body["render"]["id"])

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        async with self.session.get(f"{self.base}/v2/renders/{task_id}",
                                    headers=self.headers) as resp:
            if resp.status == 404:
                return NotFound(message=f"acme has no render {task_id}")
            if resp.status >= 500:
                raise TransientError(f"acme answered {resp.status}", provider="acme")
            render = (await resp.json(content_type=None))["render"]
        state = render["state"]
        if state in ("queued", "rendering"):
            return Running(raw_state=state)
        if state == "done":
            return Succeeded(media_urls=tuple(f["url"] for f in render["files"]))
        if state == "error":
            return Failed(error=render["error"]["message"], code="acme_error")
        raise MalformedResponse(f"acme render state {state!r}", provider="acme")


class AcmeCallbacks:
    """Acme's callbacks (a :class:`~callwarden.providers.webhooks.WebhookScheme`): a
    signal naming the render, authenticated by the job's token in the URL."""

    provider = "acme"
    kinds = ("acme-render",)
    trusts_body = False
    secret_env = "CALLWARDEN_ACME_WEBHOOK_SECRET"  # Acme signs nothing: never set
    tolerance_s = 300.0

    def verify(self, secret: str, task_id: str | None, headers: Mapping[str, str],
               body: bytes, *, now: float) -> str:
        raise SignatureError("Acme signs no callback: unset CALLWARDEN_ACME_WEBHOOK_SECRET")

    def parse(self, body: bytes, *,
              is_media: Callable[[str], bool] | None = None) -> Parsed | None:
        raise MalformedDelivery("an Acme callback is a signal: its body is never the outcome")

    def task_id(self, body: bytes) -> str:
        render = json_object(body).get("render")
        if not isinstance(render, dict):
            raise MalformedDelivery("an Acme callback is {\"render\": {\"id\": ...}}")
        return text_field(render.get("id"), "render.id")

    def callback_url(self, base_url: str, job_id: uuid.UUID, token: str | None
                     ) -> str | None:
        return f"{base_url.rstrip('/')}/webhooks/acme/{job_id}/{token}" if token else None


class HostReplicate:
    """The host's own Replicate client (predictions; this host runs no trainings). It
    identifies itself as ``acme-host/1.0``."""

    def __init__(self, r: ClientRequest) -> None:
        self.kind, self.session, self.base = r.kind, r.session, r.base_url
        self.headers = {"Authorization": f"Bearer {r.api_key}", "User-Agent": "acme-host/1.0"}

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        body = dict(request) | ({"webhook": callback_url} if callback_url else {})
        async with self.session.post(f"{self.base}/v1/predictions", json=body,
                                     headers=self.headers) as resp:
            answer = await resp.json(content_type=None)
            if resp.status >= 500 or resp.status == 429:
                raise TransientError(f"replicate answered {resp.status}", provider="replicate")
            if resp.status not in (200, 201):
                raise BadRequest(str(answer), provider="replicate", status=resp.status)
        return str(answer["id"])

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        async with self.session.get(f"{self.base}/v1/predictions/{task_id}",
                                    headers=self.headers) as resp:
            if resp.status == 404:
                return NotFound(message=f"replicate has no prediction {task_id}")
            if resp.status >= 500 or resp.status == 429:
                raise TransientError(f"replicate answered {resp.status}", provider="replicate")
            answer = await resp.json(content_type=None)
        status, output = answer["status"], answer.get("output")
        if status in ("starting", "processing"):
            return Running(raw_state=status)
        if status == "succeeded":
            urls = [output] if isinstance(output, str) else list(output or [])
            return Succeeded(media_urls=tuple(u for u in urls if isinstance(u, str)))
        return Failed(error=str(answer.get("error") or status), code=status)


PROVIDER = Provider(name="acme", kinds=(RENDER,), client=AcmeRenders,
                    default_url="https://api.acme.example", webhook=AcmeCallbacks())
# Replicate's kinds, thresholds, endpoint, media handling and webhook route stay
# callwarden's; its calls go through the host's client.
REPLICATE = Provider(name="replicate", client=HostReplicate)
PROVIDERS = [PROVIDER, REPLICATE]
