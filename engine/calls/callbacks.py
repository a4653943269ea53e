"""The URL a provider calls back for a job: the webhook scheme of the kind's provider
(:data:`callwarden.providers.registry.WEBHOOKS`) with the service's public base URL and,
for KIE, the job's secret token (created once, so a redelivered job keeps the URL its
upstream task was created with). The receiver is :mod:`callwarden.service.webhooks`."""

from __future__ import annotations

import secrets
import uuid

from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.providers.kinds import KINDS
from callwarden.providers.registry import WEBHOOKS

__all__ = ["CallbackUrls", "callback_url_for", "ensure_callback_token"]


def callback_url_for(base_url: str, job_id: uuid.UUID, kind: str, token: str | None
                     ) -> str | None:
    """The URL a provider should call back for ``job_id``'s call of ``kind`` (``None``:
    the provider has no per-request callback, or KIE without a token)."""
    spec = KINDS.get(kind)
    scheme = WEBHOOKS.get(spec.provider) if spec is not None and spec.mode == "async" else None
    return scheme.callback_url(base_url, job_id, token) if scheme is not None else None


async def ensure_callback_token(conn: Conn, job_id: uuid.UUID) -> str | None:
    """The job's callback token, created once (a redelivered job keeps its token);
    ``None`` if there is no such job."""
    rows = await execute(conn, "callback_token_ensure", {
        "job_id": job_id, "token": secrets.token_urlsafe(24)})
    return str(rows[0]["callback_token"]) if rows else None


class CallbackUrls:
    """``CallRunner(callback_url=urls)``: call ``await urls.prepare(conn, job_id)`` before
    ``runner.run(job_id, ...)``; a job never prepared gets no callback (it is polled)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._tokens: dict[uuid.UUID, str] = {}

    async def prepare(self, conn: Conn, job_id: uuid.UUID) -> None:
        token = await ensure_callback_token(conn, job_id)
        if token is not None:
            self._tokens[job_id] = token

    def forget(self, job_id: uuid.UUID) -> None:
        self._tokens.pop(job_id, None)

    def __call__(self, job_id: uuid.UUID, kind: str) -> str | None:
        return callback_url_for(self.base_url, job_id, kind, self._tokens.get(job_id))
