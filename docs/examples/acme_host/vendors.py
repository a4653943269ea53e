"""The host's clients of its vendors, as it had them before callwarden: Acme Render (a
provider callwarden does not ship) and Replicate's predictions (one it does, whose client
the host keeps: it identifies itself as ``acme-host/1.0``). Plain aiohttp; an error status
is raised (``raise_for_status``). Nothing here knows callwarden: ``providers.py`` makes
them callwarden's adapters.

Acme's API (the host's own knowledge of it): ``POST /v2/renders`` with a JSON body starts a
render and answers ``201 {"render": {"id": ..., "state": "queued"}}``; ``GET
/v2/renders/{id}`` answers its state (``queued``, ``rendering``, ``done`` with ``files``,
``error`` with ``error.message``) or 404 for an id it does not know. Auth is ``Authorization:
Token <key>``. A render created with a ``callback_url`` is announced there when it ends
(``POST`` with ``{"render": {"id": ...}}``, unsigned).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp


class AcmeClient:
    """Renders at Acme: create one, read one back."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, key: str) -> None:
        self.session, self.base = session, base_url
        self.headers = {"Authorization": f"Token {key}"}

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        """Start a render; its id."""
        body = dict(request) | ({"callback_url": callback_url} if callback_url else {})
        async with self.session.post(f"{self.base}/v2/renders", json=body,
                                     headers=self.headers) as resp:
            resp.raise_for_status()
            return str((await resp.json(content_type=None))["render"]["id"])

    async def render(self, render_id: str) -> dict[str, Any] | None:
        """The render as Acme describes it; ``None`` when Acme does not know it."""
        async with self.session.get(f"{self.base}/v2/renders/{render_id}",
                                    headers=self.headers) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return dict((await resp.json(content_type=None))["render"])


class ReplicateClient:
    """Predictions at Replicate (this host runs no trainings)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str) -> None:
        self.session, self.base = session, base_url
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "acme-host/1.0"}

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        """Start a prediction; its id."""
        body = dict(request) | ({"webhook": callback_url} if callback_url else {})
        async with self.session.post(f"{self.base}/v1/predictions", json=body,
                                     headers=self.headers) as resp:
            resp.raise_for_status()
            return str((await resp.json(content_type=None))["id"])

    async def prediction(self, prediction_id: str) -> dict[str, Any] | None:
        """The prediction as Replicate describes it; ``None`` when Replicate does not know
        it."""
        async with self.session.get(f"{self.base}/v1/predictions/{prediction_id}",
                                    headers=self.headers) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return dict(await resp.json(content_type=None))
