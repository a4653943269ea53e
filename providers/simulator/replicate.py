"""Replicate, simulated: predictions and trainings as ``api.replicate.com/v1`` answers them.

Every answer carries the keys its recording shows and no others. The sources are in
``/work/notes/replicate.md`` §1 and the fixtures in ``tests/fixtures/providers/replicate``;
``tests/integration/providers/test_sim_fidelity_replicate.py`` checks each one field by field.

- Create (``POST /v1/predictions``, ``/v1/models/{owner}/{name}/predictions``,
  ``/v1/models/{o}/{n}/versions/{v}/trainings``) answers 201 with nine keys only: id,
  model, version, input, ``logs: ""``, error, ``status: "starting"``, created_at and
  ``urls{get,cancel}``. A training's create ``urls`` point at ``/v1/predictions/{id}``
  (python cassettes, 2023-24). ``version`` is ``"hidden"`` when the request named none
  (an official model), as live answers and the API reference show.
- A prediction's GET grows keys over its life, as the live cassettes show: ``processing``
  adds ``started_at``. A finished one (succeeded, failed) adds output, data_removed,
  completed_at, ``metrics{predict_time,total_time}`` and ``urls.web`` (API reference, docs
  webhook example). A canceled one answers in the second live serializer: ``logs: null``,
  ``webhook_completed: null``, no data_removed. ``aborted`` has no started_at or metrics.
- Trainings answer ``GET /v1/trainings/{id}`` in that second serializer while they run (every
  key, nulls, ``metrics: {}``). A finished training looks like the pasted live object: no
  ``model``, with data_removed and ``urls.stream``. A training's cancel answer has
  ``/v1/predictions/`` urls and only ``predict_time``. No answer has ``source`` or
  ``destination``.
- Outputs are minted media URLs (a string for one file, a list for more) that expire after
  1 h (the script's ``media_ttl_s`` overrides this), or the script's ``output`` as it is
  (a language model's token list, a string, ``data:`` URIs). After the TTL the answer has
  ``data_removed: true``, output and logs null, and ``input: {}`` (docs data-retention).
- Ids are 26 characters of ``[a-z0-9]``. Live ids use RFC 4648 base32 before 2024 and a
  Crockford-like alphabet after.
- ``Prefer: wait[=N]`` holds the answer up to N (≤ 60) simulated seconds. A run that
  finished in time answers ``processing`` with its output complete, files as ``data:``
  URIs and ``urls.stream``. An unfinished one answers ``starting`` (API reference). A
  failed or canceled one answers its own document. ``Preference-Applied`` echoes the
  request's token verbatim (cassettes ``test_*_blocking``, 2024-10).
- ``Cancel-After: <duration>`` (``30s``, ``1m``, ``1h30m``, ``500ms``, plain seconds) sets
  ``deadline``. If the deadline comes before the prediction starts, the status is
  ``aborted``. If it comes while the prediction runs, the status is ``canceled``
  (changelog 2025-10-16). The simulator does not stream: ``urls.stream`` appears where
  the recordings show it, but that URL answers 404.
- Errors are problem+json as recorded. 401 ``Unauthenticated``, 402 ``Insufficient credit``.
  A bad training destination gives 404 ``{detail, status}`` with no title. 422 is ``Invalid
  version or not permitted``, or ``Input validation failed`` with ``invalid_fields``.
  429 is ``{"detail": "Request was throttled. Expected available in N second(s)."}`` (docs
  rate-limits). A fault ``in_body`` sends the live low-credit variant instead, with
  ``status`` and a numeric ``retry_after``. No source shows a ``Retry-After`` header or a
  title for any other status, so none is sent: an unknown id and 5xx get ``{detail,
  status}`` (unsourced).
- Webhooks (``webhook`` + ``webhook_events_filter``): ``start`` (the docs' example body),
  ``output`` once when the prediction runs, and ``completed``. They are Svix-signed
  (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``). Only the terminal
  delivery is retried. The docs (receive-webhook) say it is retried on any non-2xx or
  connection failure, with exponential backoff, the last retry about a minute after
  completion. Here the retries come after 5, 15 and 40 simulated seconds
  (:data:`RETRY_SCHEDULE_S`), so the last is 60 s after the first attempt. Every attempt
  has the same ``webhook-id`` and is signed afresh with its own ``webhook-timestamp``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import re
import string
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from aiohttp import web

from callwarden.providers.replicate.webhook import replicate_sign
from callwarden.providers.simulator.core import Phase, Simulator, Task
from callwarden.providers.simulator.media import fake_media

__all__ = ["NAME", "OUTPUT_TTL_S", "RETRY_SCHEDULE_S", "document", "parse_duration",
           "render_error", "routes"]

NAME: Final = "replicate"
OUTPUT_TTL_S: Final = 3600.0
MAX_WAIT_S: Final = 60.0
RETRY_SCHEDULE_S: Final = (5.0, 15.0, 40.0)
"""Delays (simulated seconds) before each retry of a terminal webhook: exponential, the
last one minute after the first attempt (docs receive-webhook; the counts are [I])."""

UNAUTHENTICATED: Final = "You did not pass a valid authentication token"
INSUFFICIENT_CREDIT: Final = (
    "You have insufficient credit to run this model. Go to "
    "https://replicate.com/account/billing#billing to purchase credit. Once you purchase "
    "credit, please wait a few minutes before trying again.")
BAD_DESTINATION: Final = "The specified training destination does not exist"
BAD_VERSION: Final = ("The specified version does not exist (or perhaps you don't have "
                      "permission to use it?)")
_ID_ALPHABET: Final = string.digits + string.ascii_lowercase
_MSG_ALPHABET: Final = string.digits + string.ascii_letters
_STATUS: Final = {"queued": "starting", "running": "processing", "stuck": "processing",
                  "succeeded": "succeeded", "failed": "failed", "canceled": "canceled",
                  "vanished": "starting"}  # only a create answer shows a vanishing task
_DEFAULT_EVENTS: Final = ("output", "completed")
_DESTINATION: Final = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_HEX64: Final = re.compile(r"^[0-9a-f]{64}$")
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


# --- errors --------------------------------------------------------------------------------

def _throttled(retry_after: float | None, *, low_credit: bool) -> dict[str, Any]:
    """The docs' 429 body (``detail`` only) or the live low-credit one (nodetool#5196)."""
    seconds = max(1, math.ceil(retry_after if retry_after is not None else 1))
    if low_credit:
        detail = ("Request was throttled. Your rate limit for creating predictions is "
                  "reduced to 6 requests per minute with a burst of 1 requests while you "
                  f"have less than $5.0 in credit. Your rate limit resets in ~{seconds}s.")
        return {"detail": detail, "status": 429, "retry_after": seconds}
    unit = "second" if seconds == 1 else "seconds"
    return {"detail": f"Request was throttled. Expected available in {seconds} {unit}."}


def _error_body(status: int, message: str, retry_after: float | None,
                low_credit: bool) -> dict[str, Any]:
    if status == 429:
        return _throttled(retry_after, low_credit=low_credit)
    if status == 401:
        return {"title": "Unauthenticated", "detail": UNAUTHENTICATED, "status": 401}
    if status == 402:
        return {"title": "Insufficient credit", "detail": INSUFFICIENT_CREDIT, "status": 402}
    return {"detail": message, "status": status}  # no title: none is recorded


def _problem_response(status: int, body: Mapping[str, Any]) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body),
                        content_type="application/problem+json")


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """An RFC 7807 problem as Replicate sends it. The 401, 402 and 429 texts are the
    recorded ones whatever ``message`` says. ``in_body`` picks the 429 that carries
    ``retry_after`` in its body. No ``Retry-After`` header is ever sent."""
    return _problem_response(status, _error_body(status, message, retry_after, in_body))


class _Problem(Exception):
    """Raised inside a handler. ``guarded`` turns it into a problem+json response."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail"))
        self.status = status
        self.body = body


def _plain(status: int, detail: str) -> _Problem:
    return _Problem(status, {"detail": detail, "status": status})


def _invalid_version() -> _Problem:
    """Live 422 for a bad version ref such as ``owner/name:latest``."""
    return _Problem(422, {"title": "Invalid version or not permitted", "detail": BAD_VERSION,
                          "status": 422})


def _invalid_input(description: str, kind: str) -> _Problem:
    """Live 422 for an input that fails validation: ``- input: <why>`` lines and
    ``invalid_fields``. The texts for a non-object input are [I]."""
    return _Problem(422, {"detail": f"- input: {description}\n", "status": 422,
                          "title": "Input validation failed",
                          "invalid_fields": [{"type": kind, "field": "input",
                                              "description": description}]})


def _not_found() -> _Problem:
    return _plain(404, "Not found.")  # unsourced: DRF's text, like the recorded 404 shape


def _authorized(sim: Simulator, request: web.Request) -> bool:
    return request.headers.get("Authorization", "") == f"Bearer {sim.api_key}"


# --- the answer's forms: which keys each recorded answer carries ----------------------------

@dataclass(frozen=True)
class _Form:
    """The keys one kind of answer carries (in order), its ``urls`` and ``metrics`` keys,
    whether its ``logs`` is null, and whether its files are inlined as ``data:`` URIs."""

    keys: tuple[str, ...]
    urls: tuple[str, ...] = ("get", "cancel")
    metrics: tuple[str, ...] = ("predict_time", "total_time")
    null_logs: bool = False
    inline_files: bool = False


_CORE: Final = ("id", "model", "version", "input", "logs", "error", "status", "created_at",
                "urls")
_FINISHED: Final = (*_CORE, "output", "data_removed", "started_at", "completed_at", "metrics")
_LEGACY: Final = (*_CORE, "output", "started_at", "completed_at", "metrics", "webhook_completed")

_CREATE: Final = _Form(_CORE)  # create_response*.json, training_create_response.json
_SYNC: Final = _Form((*_CORE, "output", "data_removed"), urls=("get", "cancel", "stream"),
                     inline_files=True)  # prediction_sync_*.json
_FORMS: Final[dict[tuple[str, str], _Form]] = {
    ("prediction", "starting"): _Form(_CORE),  # prediction_starting.json
    ("prediction", "processing"): _Form((*_CORE, "started_at")),  # prediction_processing
    ("prediction", "succeeded"): _Form(_FINISHED, urls=("get", "cancel", "web")),
    ("prediction", "failed"): _Form(_FINISHED, urls=("get", "cancel", "web")),
    ("prediction", "canceled"): _Form(_LEGACY, null_logs=True),  # prediction_canceled
    ("prediction", "aborted"): _Form(  # prediction_aborted.json
        (*_CORE, "output", "data_removed", "completed_at"), urls=("get", "cancel", "web")),
    ("training", "starting"): _Form(_LEGACY, metrics=(), null_logs=True),  # [I]
    ("training", "processing"): _Form(_LEGACY, metrics=(), null_logs=True),
    ("training", "succeeded"): _Form(  # training_succeeded.json (pasted live, no model)
        tuple(k for k in _FINISHED if k != "model"), urls=("get", "cancel", "stream")),
    ("training", "failed"): _Form(_LEGACY),  # [I]: no recording of a failed training
    ("training", "canceled"): _Form(_LEGACY, metrics=("predict_time",), null_logs=True),
}


@dataclass(frozen=True)
class _Moment:
    """A task at the instant one answer is rendered."""

    sim: Simulator
    task: Task
    phase: Phase
    status: str
    collection: str
    removed: bool


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _logs(m: _Moment, form: _Form) -> str | None:
    if form.null_logs or m.removed:
        return None
    if m.phase.name == "queued" or m.status == "aborted":
        return ""
    lines = ["Running predict()..."]
    lines += [f"progress {m.phase.progress:.0f}%"] if m.phase.progress is not None else []
    if m.phase.name == "succeeded":
        lines.append("Done.")
    elif m.phase.name == "failed":
        lines.append(f"Error: {m.task.script.error}")
    return "\n".join(lines) + "\n"


def _output(m: _Moment, form: _Form) -> Any:
    if m.removed or m.phase.name != "succeeded":
        return None
    output = m.task.extra.get("output")
    return _inline(m.sim, m.task, output) if form.inline_files else output


def _metrics(m: _Moment, form: _Form) -> dict[str, float]:
    start, end = m.task.extra.get("started_at"), m.task.extra.get("completed_at")
    values: dict[str, float] = {}
    if start is not None and end is not None:
        values["predict_time"] = round(end - start, 6)
    if end is not None:
        values["total_time"] = round(end - m.task.created_at, 6)
    return {key: values[key] for key in form.metrics if key in values}


def _urls(m: _Moment, form: _Form) -> dict[str, str]:
    task_id = m.task.id
    get = m.sim.provider_url(NAME, f"/v1/{m.collection}/{task_id}")
    links = {"get": get, "cancel": f"{get}/cancel",
             "web": f"https://replicate.com/p/{task_id}",
             "stream": m.sim.provider_url(NAME, f"/v1/streams/{task_id}")}  # not served
    return {key: links[key] for key in form.urls}


_FIELDS: Final[dict[str, Callable[[_Moment, _Form], Any]]] = {
    "id": lambda m, f: m.task.id,
    "model": lambda m, f: m.task.extra["model"],
    "version": lambda m, f: m.task.extra["version"],
    "input": lambda m, f: {} if m.removed else m.task.input,
    "logs": _logs,
    "output": _output,
    "data_removed": lambda m, f: m.removed,
    "error": lambda m, f: m.task.script.error if m.status == "failed" else None,
    "status": lambda m, f: m.status,
    "created_at": lambda m, f: _iso(m.task.created_at),
    "started_at": lambda m, f: _iso(m.task.extra.get("started_at")),
    "completed_at": lambda m, f: _iso(m.task.extra.get("completed_at")),
    "metrics": _metrics,
    "urls": _urls,
    "webhook_completed": lambda m, f: None,
}


# --- the task's life: deadline, settling, outputs -------------------------------------------

def _status(task: Task, phase: Phase) -> str:
    if phase.name == "canceled" and task.extra.get("aborted"):
        return "aborted"
    return _STATUS[phase.name]


def _apply_deadline(task: Task, now: float) -> None:
    """Once ``now`` passes the ``Cancel-After`` deadline, end the task as it was then:
    ``aborted`` if it had not started, ``canceled`` if it was running. Called before every
    observation, so the task's script has not been walked past the deadline yet."""
    deadline = task.extra.get("deadline")
    if deadline is None or now < deadline or task.canceled:
        return
    then = task.peek(deadline)
    if then.terminal:
        return
    if then.name == "queued":
        task.extra["aborted"] = True
    else:
        task.extra.setdefault("started_at", deadline)
    task.cancel(deadline)


def _observe(sim: Simulator, task: Task) -> Phase:
    now = sim.clock.now()
    _apply_deadline(task, now)
    return task.observe(now)


def _peek(sim: Simulator, task: Task) -> Phase:
    now = sim.clock.now()
    _apply_deadline(task, now)
    return task.peek(now)


def _settle(sim: Simulator, task: Task, phase: Phase, now: float) -> None:
    """Record the moments an answer first shows: the start, and the end (with outputs)."""
    extra = task.extra
    if phase.name in ("running", "succeeded", "failed"):
        extra.setdefault("started_at", now)
    if phase.terminal and "completed_at" not in extra:
        ended = task.canceled_at if task.canceled else None
        extra["completed_at"] = now if ended is None else ended
        if phase.name == "succeeded":
            extra["output"] = _produce_output(sim, task)


def _produce_output(sim: Simulator, task: Task) -> Any:
    """The script's ``output`` as it is, else minted media, which expire after the TTL."""
    script = task.script
    ttl = script.media_ttl_s if script.media_ttl_s is not None else OUTPUT_TTL_S
    task.extra["removed_at"] = sim.clock.now() + ttl
    if script.output is not None:
        return script.output
    urls = list(script.result_urls) if script.result_urls else [
        sim.media.put(fake_media("image/png", f"{task.id}/{i}"), "image/png", ttl,
                      script=script)
        for i in range(script.media_count)]
    task.media_urls = urls
    if task.family == "training":
        version = hashlib.sha256(task.id.encode()).hexdigest()
        return {"version": f"{task.extra['destination']}:{version}",
                "weights": urls[0] if urls else None}
    return urls[0] if len(urls) == 1 else urls


def _data_uri(sim: Simulator, url: str) -> str:
    item = sim.media.lookup(url)
    if item is None:
        return url
    return f"data:{item.content_type};base64,{base64.b64encode(item.data).decode()}"


def _inline(sim: Simulator, task: Task, value: Any) -> Any:
    """``value`` with every file the simulator minted for ``task`` as a ``data:`` URI (what
    a sync answer carries; other strings stay as they are)."""
    if isinstance(value, str):
        return _data_uri(sim, value) if value in task.media_urls else value
    if isinstance(value, list):
        return [_inline(sim, task, item) for item in value]
    if isinstance(value, dict):
        return {key: _inline(sim, task, item) for key, item in value.items()}
    return value


# --- documents -----------------------------------------------------------------------------

def document(sim: Simulator, task: Task, phase: Phase, *, collection: str,
             form: _Form | None = None, status: str | None = None) -> dict[str, Any]:
    """The prediction (or training) object at this moment, in the form its recording
    shows for its status (or ``form``, with ``status`` shown instead of the real one)."""
    now = sim.clock.now()
    _settle(sim, task, phase, now)
    shown = status or _status(task, phase)
    chosen = form or _FORMS[(task.family, shown)]
    removed = shown == "succeeded" and now >= task.extra.get("removed_at", math.inf)
    moment = _Moment(sim, task, phase, shown, collection, removed)
    doc = {key: _FIELDS[key](moment, chosen) for key in chosen.keys}
    if "deadline" in task.extra:
        doc["deadline"] = _iso(task.extra["deadline"])
    if task.callback_url:
        doc["webhook"] = task.callback_url
        doc["webhook_events_filter"] = list(task.extra["events"])
    return doc


def _created(sim: Simulator, task: Task) -> dict[str, Any]:
    """The create answer: always ``starting``, whatever the script has done already."""
    phase = _peek(sim, task)
    return document(sim, task, phase, collection="predictions", form=_CREATE,
                    status="starting")


def _synchronous(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """The ``Prefer: wait`` answer: a finished run says ``processing`` with its output."""
    if phase.terminal and phase.name != "succeeded":
        return document(sim, task, phase, collection="predictions")
    shown = "processing" if phase.name == "succeeded" else "starting"
    return document(sim, task, phase, collection="predictions", form=_SYNC, status=shown)


def _start_body(task: Task) -> dict[str, Any]:
    """The ``start`` webhook: the docs' example of an unfinished prediction (every key,
    nulls, ``metrics: {}``; no model or urls)."""
    return {"id": task.id, "version": task.extra["version"],
            "created_at": _iso(task.created_at), "started_at": None, "completed_at": None,
            "status": "starting", "input": task.input, "output": None, "error": None,
            "logs": None, "metrics": {}}


# --- webhooks ------------------------------------------------------------------------------

def _msg_id(sim: Simulator) -> str:
    """A Svix-style message id, ``msg_`` + base62, like the official test vector's."""
    return "msg_" + "".join(sim.rng.choice(_MSG_ALPHABET) for _ in range(24))


def _send(sim: Simulator, task: Task, doc: Mapping[str, Any], *, terminal: bool) -> None:
    """POST ``doc`` to the task's webhook. A terminal one is retried on
    :data:`RETRY_SCHEDULE_S`, with the same id and each attempt signed at its own time."""
    assert task.callback_url is not None
    body = msgspec.json.encode(doc)
    msg_id = _msg_id(sim)
    secret = sim.webhook_secrets[NAME]

    def sign(ts: int) -> dict[str, str]:
        return {"Content-Type": "application/json", "webhook-id": msg_id,
                "webhook-timestamp": str(ts),
                "webhook-signature": replicate_sign(secret, msg_id, ts, body)}

    sim.webhooks.deliver(task.callback_url, body, sign, task.script.webhook,
                         schedule=RETRY_SCHEDULE_S if terminal else ())


def _start_webhooks(sim: Simulator, task: Task, collection: str) -> None:
    events = set(task.extra["events"])

    async def on_phase(phase: Phase) -> None:
        if phase.terminal and "completed" in events:
            _send(sim, task, document(sim, task, phase, collection=collection), terminal=True)
        elif phase.name == "running" and "output" in events:
            _send(sim, task, document(sim, task, phase, collection=collection),
                  terminal=False)

    if "start" in events:
        _send(sim, task, _start_body(task), terminal=False)
    # The Cancel-After deadline is applied before each observation: one made after the
    # deadline must not move the script past the point where the deadline fell.
    sim.drive(task, on_phase, observer=lambda: _observe(sim, task))


# --- requests ------------------------------------------------------------------------------

async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        raise _plain(400, "Invalid JSON body") from None  # unsourced
    if not isinstance(data, dict):
        raise _plain(400, "Request body must be a JSON object")  # unsourced
    return data


def _model_and_version(body: Mapping[str, Any], match: Mapping[str, str]) -> tuple[str, str]:
    """The model and version an answer reports: a route's owner/name (``hidden`` version
    unless the route names one), a 64-hex version, or ``owner/name[:<64 hex>]``."""
    if "owner" in match:
        return f"{match['owner']}/{match['name']}", match.get("version") or "hidden"
    ref = body.get("version")
    if not isinstance(ref, str) or not ref:
        raise _invalid_version()
    if _HEX64.match(ref):
        return "unknown/model", ref
    model, colon, version = ref.partition(":")
    if not _DESTINATION.match(model) or (colon and not _HEX64.match(version)):
        raise _invalid_version()
    return model, version or "hidden"


def _inputs(body: Mapping[str, Any]) -> dict[str, Any]:
    inputs = body.get("input")
    if inputs is None:
        return {}
    if not isinstance(inputs, dict):
        given = type(inputs).__name__
        raise _invalid_input(f"Invalid type. Expected: object, given: {given}", "invalid_type")
    return inputs


def _create(sim: Simulator, body: Mapping[str, Any], match: Mapping[str, str],
            family: str) -> Task:
    model, version = _model_and_version(body, match)
    inputs = _inputs(body)
    script = sim.script_for(NAME, body if "_sim" in body else inputs)
    webhook = body.get("webhook")
    task = sim.tasks.create(NAME, family, inputs, script, task_id=_new_id(sim),
                            callback_url=webhook if isinstance(webhook, str) else None)
    events = body.get("webhook_events_filter") or _DEFAULT_EVENTS
    task.extra.update(model=model, version=version, events=tuple(events))
    return task


def _new_id(sim: Simulator) -> str:
    return "".join(sim.rng.choice(_ID_ALPHABET) for _ in range(26))


def parse_duration(value: str) -> float | None:
    """Seconds in a ``Cancel-After`` value: Go-style ``1h30m``, ``5m``, ``30s``, ``500ms``, or
    plain seconds. None if it is not a duration. The changelog's example is ``1m``; the
    other forms are [I]."""
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _cancel_after(request: web.Request) -> float | None:
    raw = request.headers.get("Cancel-After")
    if raw is None:
        return None
    seconds = parse_duration(raw)
    if seconds is None or seconds <= 0:
        raise _plain(400, f"Invalid Cancel-After header: {raw!r}")  # unsourced
    return seconds


def _prefer_wait(request: web.Request) -> tuple[str, float] | None:
    """The request's ``wait`` preference: its token as sent, and the seconds it allows."""
    for part in request.headers.get("Prefer", "").split(","):
        token = part.strip()
        if token == "wait":
            return token, MAX_WAIT_S
        name, sep, value = token.partition("=")
        if name.strip() == "wait" and sep:
            try:
                return token, min(MAX_WAIT_S, max(1.0, float(value.strip())))
            except ValueError:
                return None
    return None


async def _wait(sim: Simulator, task: Task, seconds: float) -> Phase:
    """Watch ``task`` for up to ``seconds`` of simulated time (and at most
    :data:`MAX_WAIT_S` of real time)."""
    deadline = sim.clock.now() + seconds
    loop = asyncio.get_running_loop()
    real_deadline = loop.time() + min(sim.clock.real_seconds(seconds), MAX_WAIT_S)
    while True:
        phase = _observe(sim, task)
        if phase.terminal or sim.clock.now() >= deadline or loop.time() >= real_deadline:
            return phase
        await asyncio.sleep(0.02)


def _find(sim: Simulator, request: web.Request) -> Task:
    task = sim.tasks.get(NAME, request.match_info["id"])
    if task is None or _peek(sim, task).name == "vanished":
        raise _not_found()
    return task


def _json(doc: Mapping[str, Any], status: int = 200,
          headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(doc),
                        content_type="application/json", headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every Replicate route, behind the Bearer-token check."""
    def guarded(handler: Handler) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            if not _authorized(sim, request):
                return render_error(401, UNAUTHENTICATED)
            try:
                return await handler(request)
            except _Problem as exc:
                return _problem_response(exc.status, exc.body)
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

    async def create_prediction(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        deadline_s = _cancel_after(request)
        task = _create(self.sim, body, request.match_info, "prediction")
        if deadline_s is not None:
            task.extra["deadline"] = task.created_at + deadline_s
        if task.callback_url:
            _start_webhooks(self.sim, task, "predictions")
        wait = _prefer_wait(request)
        if wait is None:
            return _json(_created(self.sim, task), 201)
        token, seconds = wait
        phase = await _wait(self.sim, task, seconds)
        return _json(_synchronous(self.sim, task, phase), 201, {"Preference-Applied": token})

    async def create_training(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        destination = body.get("destination")
        if not isinstance(destination, str) or not _DESTINATION.match(destination) \
                or destination.split("/")[1].startswith("nonexistent"):
            raise _plain(404, BAD_DESTINATION)
        task = _create(self.sim, body, request.match_info, "training")
        task.extra["destination"] = destination
        if task.callback_url:
            _start_webhooks(self.sim, task, "trainings")
        return _json(_created(self.sim, task), 201)

    async def get(self, request: web.Request) -> web.StreamResponse:
        return self._observed(_find(self.sim, request), "predictions")

    async def get_training(self, request: web.Request) -> web.StreamResponse:
        task = _find(self.sim, request)
        if task.family != "training":
            raise _not_found()
        return self._observed(task, "trainings")

    def _observed(self, task: Task, collection: str) -> web.Response:
        phase = _observe(self.sim, task)
        return _json(document(self.sim, task, phase, collection=collection))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        return self._cancel(_find(self.sim, request), "predictions")

    async def cancel_training(self, request: web.Request) -> web.StreamResponse:
        # A training's cancel answer points at /v1/predictions/ (trainings-cancel.yaml).
        return self._cancel(_find(self.sim, request), "predictions")

    def _cancel(self, task: Task, collection: str) -> web.Response:
        now = self.sim.clock.now()
        if not _peek(self.sim, task).terminal:
            task.cancel(now)
        return _json(document(self.sim, task, task.peek(now), collection=collection))

    async def secret(self, request: web.Request) -> web.StreamResponse:
        return _json({"key": self.sim.webhook_secrets[NAME]})
