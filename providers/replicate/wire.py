"""Replicate's wire (``replicate-prediction``, ``replicate-training``): pure request builders
and answer parsers, no I/O.

Pure functions build each request (:class:`Request`) and parse each response into a
:mod:`callwarden.providers.outcomes` value or a typed :mod:`callwarden.providers.errors` error,
keeping
Replicate's own ``detail``. The clients (:mod:`callwarden.providers.replicate.client`) only glue
them to
:func:`callwarden.providers.transport.send`.

Mapping of a prediction/training object (reference §11, §14):

- ``starting`` / ``processing``                 -> ``Running``
- ``succeeded``                                 -> ``Succeeded``: ``output`` is any JSON.
  A ``data:`` URI anywhere in it (a string, a list, object values such as a training's
  ``weights``) is a file to store, and so is a URL on a host the kind's media come from
  (``is_media``: by default Replicate's ``replicate.delivery`` hosts; the engine adds the
  configured endpoint). Any other URL is text: model authors write outputs, and a caption,
  a JSON answer or a language model's tokens that cite a web page are an answer, not a
  file (the official SDKs take every ``https:`` string for a file; we do not). With no
  file, the output is text: a string, a list of string tokens joined (a language model),
  anything else as JSON
- ``succeeded`` with ``data_removed: true``     -> :class:`MediaExpired` (the output is
  gone after one hour: fail and refund)
- ``failed`` / ``canceled`` / ``aborted``       -> ``Failed(error=error or status)``
- HTTP 404 on GET                               -> ``NotFound``
- problem+json errors, as :func:`~callwarden.providers.errors.error_for_status` maps a
  status: 401/403 auth, 402 credits, 429 ``RateLimited`` (``Retry-After``, or the body's
  ``retry_after`` / "Expected available in N seconds" when the header is absent), 408
  and 5xx transient, other 4xx ``BadRequest``; anything else is
  :class:`MalformedResponse`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, Literal
from urllib.parse import quote, urlsplit

import msgspec

from callwarden.providers.data_uri import is_data_uri
from callwarden.providers.errors import (
    BadRequest,
    MalformedResponse,
    MediaExpired,
    ProviderError,
    error_for_status,
)
from callwarden.providers.kinds import REPLICATE_MEDIA_HOSTS
from callwarden.providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
    Usage,
    reported_number,
)
from callwarden.providers.raw import JSONTooDeep, RawResponse, decode_json

__all__ = ["PROVIDER", "IsMedia", "Request", "build_get_request", "build_prediction_request",
           "build_training_request", "classify_replicate", "classify_replicate_poll",
           "on_replicate_hosts", "output_text", "output_urls", "parse_created",
           "parse_prediction", "throttle_delay"]


PROVIDER: Final = "replicate"

Collection = Literal["predictions", "trainings"]

RUNNING_STATES: Final = frozenset({"starting", "processing"})

FAILED_STATES: Final = frozenset({"failed", "canceled", "aborted"})

DEFAULT_EVENTS: Final = ("completed",)

class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request to send, relative to the endpoint's base URL."""

    method: Literal["GET", "POST"]
    path: str
    headers: dict[str, str]
    json: dict[str, Any] | None = None

def auth_headers(api_key: str) -> dict[str, str]:
    """Replicate auth: ``Authorization: Bearer <token>``."""
    return {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}

def _owner_name(value: Any, field: str) -> tuple[str, str]:
    if not isinstance(value, str) or value.count("/") != 1 or not all(value.split("/")):
        raise BadRequest(f"{field} must be 'owner/name', got {value!r}", provider=PROVIDER)
    owner, name = value.split("/")
    return owner, name

def _input(request: Mapping[str, Any]) -> dict[str, Any]:
    inputs = request.get("input")
    if not isinstance(inputs, Mapping):
        raise BadRequest("request needs an 'input' object", provider=PROVIDER)
    return dict(inputs)

def _with_webhook(body: dict[str, Any], request: Mapping[str, Any],
                  callback_url: str | None) -> dict[str, Any]:
    if callback_url:
        body["webhook"] = callback_url
        body["webhook_events_filter"] = list(request.get("webhook_events_filter",
                                                         DEFAULT_EVENTS))
    return body

def build_prediction_request(request: Mapping[str, Any], *, api_key: str,
                             callback_url: str | None = None) -> Request:
    """Create a prediction: ``{"version": ..., "input": ...}`` goes to ``/v1/predictions``;
    ``{"model": "owner/name", "input": ...}`` to the official-model route."""
    body: dict[str, Any] = {"input": _input(request)}
    if request.get("version"):
        body["version"] = request["version"]
        path = "/v1/predictions"
    elif "model" in request:
        owner, name = _owner_name(request["model"], "model")
        path = f"/v1/models/{quote(owner)}/{quote(name)}/predictions"
    else:
        raise BadRequest("request needs 'version' or 'model'", provider=PROVIDER)
    return Request(method="POST", path=path, headers=auth_headers(api_key),
                   json=_with_webhook(body, request, callback_url))

def build_training_request(request: Mapping[str, Any], *, api_key: str,
                           callback_url: str | None = None) -> Request:
    """Create a training of ``model`` at ``version`` into ``destination``."""
    owner, name = _owner_name(request.get("model"), "model")
    _owner_name(request.get("destination"), "destination")
    version = request.get("version")
    if not isinstance(version, str) or not version:
        raise BadRequest("a training needs a 'version' id", provider=PROVIDER)
    body = {"destination": request["destination"], "input": _input(request)}
    path = f"/v1/models/{quote(owner)}/{quote(name)}/versions/{quote(version)}/trainings"
    return Request(method="POST", path=path, headers=auth_headers(api_key),
                   json=_with_webhook(body, request, callback_url))

def build_get_request(collection: Collection, task_id: str, *, api_key: str) -> Request:
    """The status request; never creates anything."""
    return Request(method="GET", path=f"/v1/{collection}/{quote(task_id, safe='')}",
                   headers=auth_headers(api_key))

def _detail(raw: RawResponse) -> tuple[str, str | None]:
    """The problem's ``detail`` (or the body's text) and its ``title``."""
    try:
        body = decode_json(raw.body)
    except (msgspec.DecodeError, JSONTooDeep):
        return raw.body[:200].decode("utf-8", "replace") or f"HTTP {raw.status}", None
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("title") or f"HTTP {raw.status}"
        title = body.get("title")
        return str(detail), str(title) if title is not None else None
    return str(body), None

_THROTTLE = re.compile(r"(?:available in|resets in)\s*~?\s*(\d+(?:\.\d+)?)\s*s", re.I)

def throttle_delay(raw: RawResponse) -> float | None:
    """How long a 429 asks to wait: ``Retry-After`` when sent, else the body's numeric
    ``retry_after``, else the delay in its ``detail`` text (``Request was throttled.
    Expected available in 3 seconds.`` / ``... Your rate limit resets in ~5s.``)."""
    header = raw.retry_after()
    if header is not None:
        return header
    try:
        body = decode_json(raw.body)
    except (msgspec.DecodeError, JSONTooDeep):
        return None
    if not isinstance(body, dict):
        return None
    number = reported_number(body.get("retry_after"))
    if number is not None:
        return number
    found = _THROTTLE.search(str(body.get("detail") or ""))
    return float(found.group(1)) if found else None

def _error_for(raw: RawResponse) -> ProviderError:
    message, title = _detail(raw)
    return error_for_status(raw.status, message, provider=PROVIDER, code=title,
                            retry_after=throttle_delay(raw) if raw.status == 429 else None)

def classify_replicate(raw: RawResponse) -> ProviderError | None:
    """For creates and cancels: any non-2xx is an error (404 = bad model/destination)."""
    return None if 200 <= raw.status < 300 else _error_for(raw)

def classify_replicate_poll(raw: RawResponse) -> ProviderError | None:
    """For GETs: a 404 is an answer (:class:`NotFound`), not an error."""
    return None if raw.status == 404 else classify_replicate(raw)

def _document(raw: RawResponse) -> dict[str, Any]:
    body = raw.json(PROVIDER)
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {type(body).__name__}",
                                provider=PROVIDER, status=raw.status)
    return body

def parse_created(raw: RawResponse) -> str:
    """The new prediction's (or training's) id."""
    task_id = _document(raw).get("id")
    if not isinstance(task_id, str) or not task_id:
        raise MalformedResponse("create answer has no 'id'", provider=PROVIDER,
                                status=raw.status)
    return task_id

IsMedia = Callable[[str], bool]
"""Whether an ``http(s)`` URL is on a host the kind's result files come from."""

_URL_PREFIXES: Final = ("https://", "http://")


def on_replicate_hosts(url: str) -> bool:
    """Whether ``url`` is on Replicate's own media hosts (``replicate.delivery`` and its
    subdomains): the default :data:`IsMedia`."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return False
    if parts.username is not None or "\\" in url:  # what the media guard refuses is text
        return False
    return any(host == p or (p.startswith("*.") and host.endswith(p[1:]) and host != p[2:])
               for p in REPLICATE_MEDIA_HOSTS)


def _is_file(value: str, is_media: IsMedia) -> bool:
    if value[:5].lower() == "data:":
        return is_data_uri(value)
    return value[:8].lower().startswith(_URL_PREFIXES) and is_media(value)

def _walk_files(value: Any, is_media: IsMedia) -> Iterator[str]:
    if isinstance(value, str):
        if _is_file(value, is_media):
            yield value
    elif isinstance(value, list):
        for item in value:
            yield from _walk_files(item, is_media)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk_files(item, is_media)

def output_urls(output: Any, is_media: IsMedia = on_replicate_hosts) -> tuple[str, ...]:
    """Every file in ``output`` — a ``data:`` URI, or a URL ``is_media`` says is on a
    media host, anywhere in a string, a list or an object's values — in order, without
    repeats. Any other URL is text."""
    return tuple(dict.fromkeys(_walk_files(output, is_media)))

def output_text(output: Any) -> str | None:
    """A result with no file as text: a string as is, a list of string tokens joined (a
    language model's output), anything else as JSON; ``None`` for no output."""
    if output is None:
        return None
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(t, str) for t in output):
        return "".join(output)
    return msgspec.json.encode(output).decode()

def _placed(value: Any, index: dict[str, int]) -> Any:
    """``value`` with each file replaced by ``{"media": i}``, its place among the
    result's media (the SDK likewise keeps the structure, with file objects in place)."""
    if isinstance(value, str):
        return {"media": index[value]} if value in index else value
    if isinstance(value, list):
        return [_placed(v, index) for v in value]
    if isinstance(value, dict):
        return {k: _placed(v, index) for k, v in value.items()}
    return value

def structured_text(output: Any, files: tuple[str, ...]) -> str | None:
    """The text of an output that has files: ``None`` when the files are all it holds (a
    URL, or a list of URLs); otherwise the whole structure as JSON with each file as
    ``{"media": i}`` — a caption beside an image, text around a link, a training's new
    ``version`` beside its ``weights`` are kept, not dropped."""
    if isinstance(output, str) or (isinstance(output, list)
                                   and all(isinstance(v, str) and v in files
                                           for v in output)):
        return None
    return msgspec.json.encode(_placed(output, {f: i for i, f in enumerate(files)})).decode()

def _redacted(value: Any) -> Any:
    """``value`` with ``data:`` URIs cut to their header (the bytes are in the outcome's
    media, not worth a second copy in ``raw``)."""
    if isinstance(value, str) and is_data_uri(value):
        return value.split(",", 1)[0] + f",... ({len(value)} characters)"
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value

def _usage(doc: dict[str, Any]) -> Usage:
    usage: Usage = {}
    metrics = doc.get("metrics")
    if isinstance(metrics, dict):
        for ours, theirs in (("predict_time_s", "predict_time"),
                             ("input_tokens", "input_token_count"),
                             ("output_tokens", "output_token_count")):
            number = reported_number(metrics.get(theirs))
            if number is not None:
                usage[ours] = number
    for key in ("model", "version"):
        if isinstance(doc.get(key), str) and doc[key]:
            usage[key] = doc[key]
    return usage

def _succeeded(doc: dict[str, Any], raw: RawResponse, is_media: IsMedia) -> Succeeded:
    if doc.get("data_removed") is True:
        raise MediaExpired(f"output of {doc.get('id')} was removed (data_removed)",
                           provider=PROVIDER, status=raw.status)
    output = doc.get("output")
    files = output_urls(output, is_media)
    trimmed = {k: _redacted(v) for k, v in doc.items() if k != "logs"}
    text = structured_text(output, files) if files else output_text(output)
    return Succeeded(media_urls=files, text=text, cost=None, raw=trimmed, usage=_usage(doc))

def parse_prediction(raw: RawResponse, *,
                     is_media: IsMedia = on_replicate_hosts) -> PollOutcome:
    """A GET (or cancel) answer for a prediction or training; ``is_media`` tells which
    URLs in the output are files (the rest is text)."""
    if raw.status == 404:
        return NotFound(message=_detail(raw)[0])
    doc = _document(raw)
    status = doc.get("status")
    if not isinstance(status, str):
        raise MalformedResponse(f"prediction status is not a string: {status!r}",
                                provider=PROVIDER, status=raw.status)
    if status in RUNNING_STATES:
        return Running(raw_state=status)
    if status == "succeeded":
        return _succeeded(doc, raw, is_media)
    if status in FAILED_STATES:
        error = doc.get("error")
        message = error if isinstance(error, str) and error else status
        return Failed(error=message, code=status,
                      raw={k: v for k, v in doc.items() if k != "logs"})
    raise MalformedResponse(f"unknown Replicate status {status!r}", provider=PROVIDER,
                            status=raw.status)
