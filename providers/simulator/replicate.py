"""Replicate, simulated: predictions and trainings as the real ``api.replicate.com/v1``.

- ``POST /v1/predictions`` and ``/v1/models/{owner}/{name}/predictions`` -> 201 with a
  ``starting`` prediction; ``Prefer: wait[=N]`` holds the answer up to N (≤ 60) seconds of
  simulated time and sets ``Preference-Applied``.
- ``GET /v1/predictions/{id}``, ``POST .../cancel``; trainings under
  ``/v1/models/{o}/{n}/versions/{v}/trainings`` and ``/v1/trainings/{id}`` (the create
  answer's ``urls`` point at ``/v1/predictions/{id}``, as observed live; both paths serve).
- Status ``starting -> processing -> succeeded|failed|canceled`` with ``started_at``,
  ``completed_at``, ``metrics`` and growing ``logs``. Outputs are minted in the media host
  with a 1 h TTL (script ``media_ttl_s`` overrides); once it passes, the prediction has
  ``data_removed: true``, ``output: null`` and the URLs answer 404.
- Errors are ``application/problem+json``. A training destination that is malformed or
  whose name starts with ``nonexistent`` answers 404.
- Webhooks (``webhook`` + ``webhook_events_filter``): ``start`` and ``completed`` (and
  ``output`` when asked), Svix-signed; only the terminal delivery is retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

import msgspec
from aiohttp import web

from providers.signing import replicate_sign
from providers.simulator.core import Phase, Simulator, Task
from providers.simulator.media import fake_media

__all__ = ["NAME", "OUTPUT_TTL_S", "render_error", "routes"]

NAME = "replicate"
OUTPUT_TTL_S = 3600.0
MAX_WAIT_S = 60.0
UNAUTHENTICATED = "You did not pass a valid authentication token"
BAD_DESTINATION = "The specified training destination does not exist"
_ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_STATUS = {"queued": "starting", "running": "processing", "succeeded": "succeeded",
           "failed": "failed", "canceled": "canceled",
           "vanished": "starting"}  # only a create answer can show a task that vanishes
_DEFAULT_EVENTS = ("output", "completed")
_DESTINATION = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


# --- errors --------------------------------------------------------------------------------

def _throttled(retry_after: float | None) -> tuple[str, int]:
    seconds = max(1, math.ceil(retry_after if retry_after is not None else 1))
    unit = "second" if seconds == 1 else "seconds"
    return f"Request was throttled. Expected available in {seconds} {unit}.", seconds


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """An RFC 7807 problem as Replicate sends it (``in_body`` does not exist here)."""
    headers: dict[str, str] = {}
    detail = message
    if status == 429:
        detail, seconds = _throttled(retry_after)
        headers["Retry-After"] = str(seconds)
    elif retry_after is not None:
        headers["Retry-After"] = str(max(0, math.ceil(retry_after)))
    title = "Unauthenticated" if status == 401 else _phrase(status)
    body = {"title": title, "detail": detail, "status": status}
    return web.Response(status=status, body=msgspec.json.encode(body), headers=headers,
                        content_type="application/problem+json")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _authorized(sim: Simulator, request: web.Request) -> bool:
    return request.headers.get("Authorization", "") == f"Bearer {sim.api_key}"


# --- the prediction document ---------------------------------------------------------------

def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _new_id(sim: Simulator) -> str:
    return "".join(sim.rng.choice(_ID_ALPHABET) for _ in range(26))


def _version_for(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()


def _settle(sim: Simulator, task: Task, phase: Phase, now: float) -> None:
    """Record the moments a poll first sees: running (start) and terminal (outputs)."""
    extra = task.extra
    if phase.name in ("running", "succeeded", "failed", "canceled"):
        extra.setdefault("started_at", now)
    if phase.terminal and "completed_at" not in extra:
        extra["completed_at"] = task.canceled_at if task.canceled else now
        if phase.name == "succeeded":
            extra["output"] = _mint_output(sim, task)


def _mint_output(sim: Simulator, task: Task) -> Any:
    ttl = task.script.media_ttl_s if task.script.media_ttl_s is not None else OUTPUT_TTL_S
    urls = list(task.script.result_urls) if task.script.result_urls else [
        sim.media.put(fake_media("image/png", f"{task.id}/{i}"), "image/png", ttl,
                      script=task.script)
        for i in range(task.script.media_count)]
    task.media_urls = urls
    task.extra["removed_at"] = sim.clock.now() + ttl
    if task.family == "training":
        weights = urls[0] if urls else None
        return {"version": f"{task.extra['destination']}:{_version_for(task.id)}",
                "weights": weights}
    return urls[0] if len(urls) == 1 else urls


def _logs(phase: Phase, task: Task) -> str:
    if phase.name == "queued":
        return ""
    lines = ["Running predict()..."]
    lines += [f"progress {phase.progress:.0f}%"] if phase.progress is not None else []
    if phase.name == "succeeded":
        lines.append("Done.")
    elif phase.name == "failed":
        lines.append(f"Error: {task.script.error}")
    return "\n".join(lines) + "\n"


def _metrics(task: Task, phase: Phase) -> dict[str, float]:
    start, end = task.extra.get("started_at"), task.extra.get("completed_at")
    if phase.name != "succeeded" or start is None or end is None:
        return {}
    return {"predict_time": round(end - start, 3), "total_time": round(end - task.created_at, 3)}


def _urls(sim: Simulator, task: Task, collection: str) -> dict[str, str]:
    get = sim.provider_url(NAME, f"/v1/{collection}/{task.id}")
    return {"get": get, "cancel": f"{get}/cancel",
            "web": f"https://replicate.com/p/{task.id}"}


def document(sim: Simulator, task: Task, phase: Phase, *, collection: str) -> dict[str, Any]:
    """The prediction (or training) object as GET returns it at this moment."""
    now = sim.clock.now()
    _settle(sim, task, phase, now)
    extra = task.extra
    removed = phase.name == "succeeded" and now >= extra.get("removed_at", math.inf)
    doc: dict[str, Any] = {
        "id": task.id, "model": extra["model"], "version": extra["version"],
        "input": {} if removed else task.input, "logs": "" if removed else _logs(phase, task),
        "output": None if removed else extra.get("output"),
        "data_removed": removed,
        "error": task.script.error if phase.name == "failed" else None,
        "status": _STATUS[phase.name], "source": "api",
        "created_at": _iso(task.created_at), "started_at": _iso(extra.get("started_at")),
        "completed_at": _iso(extra.get("completed_at")), "metrics": _metrics(task, phase),
        "urls": _urls(sim, task, collection),
    }
    if task.family == "training":
        doc["destination"] = extra["destination"]
    if task.callback_url:
        doc["webhook"] = task.callback_url
        doc["webhook_events_filter"] = list(extra["events"])
    return doc


# --- webhooks ------------------------------------------------------------------------------

def _send(sim: Simulator, task: Task, doc: Mapping[str, Any], *, terminal: bool) -> None:
    assert task.callback_url is not None
    body = msgspec.json.encode(doc)
    msg_id = f"msg_{sim.rng.getrandbits(120):030x}"
    ts = int(sim.clock.now())
    headers = {
        "Content-Type": "application/json", "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": replicate_sign(sim.webhook_secrets[NAME], msg_id, ts, body),
    }
    sim.webhooks.deliver(task.callback_url, body, headers, task.script.webhook,
                         retries=3 if terminal else 0)


def _start_webhooks(sim: Simulator, task: Task, collection: str) -> None:
    events = set(task.extra["events"])

    async def on_phase(phase: Phase) -> None:
        doc = document(sim, task, phase, collection=collection)
        if phase.terminal and "completed" in events:
            _send(sim, task, doc, terminal=True)
        elif phase.name == "running" and "output" in events:
            _send(sim, task, doc, terminal=False)

    if "start" in events:
        _send(sim, task, document(sim, task, task.peek(sim.clock.now()),
                                  collection=collection), terminal=False)
    sim.drive(task, on_phase)


# --- handlers ------------------------------------------------------------------------------

async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        raise _problem(400, "Invalid JSON body") from None
    if not isinstance(data, dict):
        raise _problem(422, "Request body must be an object")
    return data


class _Problem(Exception):
    """Raised inside a handler; ``guarded`` turns it into a problem+json response."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _problem(status: int, detail: str) -> _Problem:
    return _Problem(status, detail)


def _model_and_version(body: Mapping[str, Any], match: Mapping[str, str]) -> tuple[str, str]:
    if "owner" in match:
        model = f"{match['owner']}/{match['name']}"
        return model, match.get("version") or _version_for(model)
    ref = body.get("version")
    if not isinstance(ref, str) or not ref:
        raise _problem(422, "- version: Required")
    if _HEX64.match(ref):
        return "unknown/model", ref
    model, _, version = ref.partition(":")
    if not _DESTINATION.match(model):
        raise _problem(422, f"Invalid version or model: {ref}")
    return model, version or _version_for(model)


def _create(sim: Simulator, body: Mapping[str, Any], match: Mapping[str, str],
            family: str) -> Task:
    model, version = _model_and_version(body, match)
    inputs = body.get("input") or {}
    if not isinstance(inputs, dict):
        raise _problem(422, "- input: Input should be a valid object")
    script = sim.script_for(NAME, body if "_sim" in body else inputs)
    webhook = body.get("webhook")
    task = sim.tasks.create(NAME, family, inputs, script, task_id=_new_id(sim),
                            callback_url=webhook if isinstance(webhook, str) else None)
    events = body.get("webhook_events_filter") or _DEFAULT_EVENTS
    task.extra.update(model=model, version=version, events=tuple(events))
    return task


def _prefer_wait(request: web.Request) -> float | None:
    value = request.headers.get("Prefer", "").strip()
    if value == "wait":
        return MAX_WAIT_S
    if value.startswith("wait="):
        try:
            return min(MAX_WAIT_S, max(1.0, float(value[5:])))
        except ValueError:
            return None
    return None


async def _wait(sim: Simulator, task: Task, seconds: float) -> Phase:
    """Watch ``task`` up to ``seconds`` of simulated time (bounded in real time)."""
    deadline = sim.clock.now() + seconds
    real_budget = min(sim.clock.real_seconds(seconds), MAX_WAIT_S)
    loop = asyncio.get_running_loop()
    real_deadline = loop.time() + real_budget
    while True:
        phase = task.observe(sim.clock.now())
        if phase.terminal or sim.clock.now() >= deadline or loop.time() >= real_deadline:
            return phase
        await asyncio.sleep(0.02)


def _find(sim: Simulator, request: web.Request) -> Task:
    task = sim.tasks.get(NAME, request.match_info["id"])
    if task is None or task.peek(sim.clock.now()).name == "vanished":
        raise _problem(404, "Not found.")
    return task


def _json(doc: Mapping[str, Any], status: int = 200,
          headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(doc),
                        content_type="application/json", headers=headers)


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every Replicate route, behind the Bearer-token check."""
    def guarded(handler: Any) -> Any:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            if not _authorized(sim, request):
                return render_error(401, UNAUTHENTICATED)
            try:
                return await handler(request)  # type: ignore[no-any-return]
            except _Problem as exc:
                return render_error(exc.status, exc.detail)
        return wrapper

    h = _Handlers(sim)
    return [
        web.post("/v1/predictions", guarded(h.create_prediction), name="create"),
        web.post("/v1/models/{owner}/{name}/predictions", guarded(h.create_prediction),
                 name="create.by_model"),
        web.get("/v1/predictions/{id}", guarded(h.get), name="poll"),
        web.post("/v1/predictions/{id}/cancel", guarded(h.cancel), name="cancel"),
        web.post("/v1/models/{owner}/{name}/versions/{version}/trainings",
                 guarded(h.create_training), name="create_training"),
        web.get("/v1/trainings/{id}", guarded(h.get_training), name="poll_training"),
        web.post("/v1/trainings/{id}/cancel", guarded(h.cancel_training),
                 name="cancel_training"),
        web.get("/v1/webhooks/default/secret", guarded(h.secret), name="webhook_secret"),
    ]


class _Handlers:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    async def create_prediction(self, request: web.Request) -> web.Response:
        task = _create(self.sim, await _body(request), request.match_info, "prediction")
        if task.callback_url:
            _start_webhooks(self.sim, task, "predictions")
        wait = _prefer_wait(request)
        if wait is None:
            phase = task.peek(self.sim.clock.now())
            return _json(document(self.sim, task, phase, collection="predictions"), 201)
        phase = await _wait(self.sim, task, wait)
        doc = document(self.sim, task, phase, collection="predictions")
        return _json(doc, 201, {"Preference-Applied": f"wait={int(wait)}"})

    async def create_training(self, request: web.Request) -> web.Response:
        body = await _body(request)
        destination = body.get("destination")
        if not isinstance(destination, str) or not _DESTINATION.match(destination) \
                or destination.split("/")[1].startswith("nonexistent"):
            raise _problem(404, BAD_DESTINATION)
        task = _create(self.sim, body, request.match_info, "training")
        task.extra["destination"] = destination
        if task.callback_url:
            _start_webhooks(self.sim, task, "trainings")
        phase = task.peek(self.sim.clock.now())
        return _json(document(self.sim, task, phase, collection="predictions"), 201)

    async def get(self, request: web.Request) -> web.Response:
        return self._observed(_find(self.sim, request), "predictions")

    async def get_training(self, request: web.Request) -> web.Response:
        task = _find(self.sim, request)
        if task.family != "training":
            raise _problem(404, "Not found.")
        return self._observed(task, "trainings")

    def _observed(self, task: Task, collection: str) -> web.Response:
        phase = task.observe(self.sim.clock.now())
        return _json(document(self.sim, task, phase, collection=collection))

    async def cancel(self, request: web.Request) -> web.Response:
        return self._cancel(_find(self.sim, request), "predictions")

    async def cancel_training(self, request: web.Request) -> web.Response:
        return self._cancel(_find(self.sim, request), "trainings")

    def _cancel(self, task: Task, collection: str) -> web.Response:
        now = self.sim.clock.now()
        if not task.peek(now).terminal:
            task.cancel(now)
        return _json(document(self.sim, task, task.peek(now), collection=collection))

    async def secret(self, request: web.Request) -> web.Response:
        return _json({"key": self.sim.webhook_secrets[NAME]})
