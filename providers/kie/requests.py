"""KIE.ai requests, pure: the create and poll request of each task family and the
``kie-llm`` call (``stream`` always off), with KIE's bearer auth."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import quote

import msgspec

from callwarden.providers.errors import BadRequest
from callwarden.providers.kie.wire import (
    PROVIDER,
)

__all__ = ["CREATE_PATHS", "POLL_PATHS", "Request", "auth_headers", "build_create_request",
           "build_llm_request", "build_poll_request"]


CREATE_PATHS: Final[Mapping[str, str]] = {
    "market": "/api/v1/jobs/createTask",
    "veo": "/api/v1/veo/generate",
    "suno": "/api/v1/generate",
    "kontext": "/api/v1/flux/kontext/generate",
    "luma": "/api/v1/modify/generate",
    "runway": "/api/v1/runway/generate",
}

POLL_PATHS: Final[Mapping[str, str]] = {
    "market": "/api/v1/jobs/recordInfo",
    "veo": "/api/v1/veo/record-info",
    "suno": "/api/v1/generate/record-info",
    "kontext": "/api/v1/flux/kontext/record-info",
    "luma": "/api/v1/modify/record-info",
    "runway": "/api/v1/runway/record-detail",
}

class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request to send, relative to the endpoint's base URL."""

    method: Literal["GET", "POST"]
    path: str
    headers: dict[str, str]
    params: dict[str, str] | None = None
    json: dict[str, Any] | None = None

def auth_headers(api_key: str) -> dict[str, str]:
    """KIE auth: ``Authorization: Bearer <key>``."""
    return {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}

def _family(family: str) -> str:
    if family not in CREATE_PATHS:
        raise ValueError(f"unknown KIE family {family!r}")
    return family

def build_create_request(
    family: str, request: Mapping[str, Any], *, api_key: str, callback_url: str | None = None,
) -> Request:
    """The create request: ``request`` is the provider body as documented (market:
    ``{"model", "input"}``); ``callback_url`` becomes ``callBackUrl``. Suno refuses a
    request without one, so we refuse it first (:class:`BadRequest`)."""
    body = dict(request)
    if callback_url:
        body["callBackUrl"] = callback_url
    if _family(family) == "suno" and not body.get("callBackUrl"):
        raise BadRequest("kie-suno requires a callBackUrl (pass callback_url or configure "
                         "a default)", provider=PROVIDER)
    return Request(method="POST", path=CREATE_PATHS[family], headers=auth_headers(api_key),
                   json=body)

def build_poll_request(family: str, task_id: str, *, api_key: str) -> Request:
    """The status request for ``task_id``; never creates anything."""
    return Request(method="GET", path=POLL_PATHS[_family(family)],
                   headers=auth_headers(api_key), params={"taskId": task_id})

def build_llm_request(request: Mapping[str, Any], *, api_key: str) -> Request:
    """``/claude/v1/messages`` (Anthropic shape), or ``/{model}/v1/chat/completions`` when
    ``request["api"] == "chat"``. ``stream`` is always forced to false (KIE defaults it to
    true)."""
    body = {k: v for k, v in request.items() if k != "api"}
    body["stream"] = False
    if request.get("api") != "chat":
        return Request(method="POST", path="/claude/v1/messages", headers=auth_headers(api_key),
                       json=body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("kie-llm chat request without a model", provider=PROVIDER)
    return Request(method="POST", path=f"/{quote(model, safe='')}/v1/chat/completions",
                   headers=auth_headers(api_key), json=body)
