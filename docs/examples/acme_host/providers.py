"""The host's adapters: its own clients (``vendors.py``) answering in callwarden's terms,
for every process that runs or recovers a call — the worker that creates and polls a task,
the reconciler that recovers it after that worker died, the webhook receiver.

Registered through the ``callwarden.providers`` entry point of the host's package (or
``CALLWARDEN_PROVIDERS=providers:PROVIDERS``, ``callwarden.env``). Acme's endpoint comes
from ``CALLWARDEN_ACME_URL`` and ``ACME_API_KEY`` (else its ``default_url``); Replicate's
from ``CALLWARDEN_REPLICATE_URL`` and ``REPLICATE_API_TOKEN``, as for callwarden's own
client. An error status the clients raise needs no mapping here: callwarden reads it (a
4xx refused, a 429 throttled, a 5xx transient).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from vendors import AcmeClient, ReplicateClient

from callwarden.providers.errors import SignatureError
from callwarden.providers.registry import KindSpec, Polled, Provider
from callwarden.providers.webhooks import MalformedDelivery, Parsed, json_object, text_field

RENDER = KindSpec(name="acme-render", provider="acme", mode="async", family="render",
                  stale_threshold_s=600, result_url_lifetime_s=6 * 3600,  # files kept 6 h
                  poll_interval_s=1.0, poll_budget_s=900, media_hosts=("files.acme.example",))
# A render's state told as a poll outcome (queued and rendering: still running).
RENDERS = Polled(AcmeClient, AcmeClient.render, state=lambda r: r["state"], succeeded={"done"},
                 failed={"error"}, media=lambda r: [f["url"] for f in r["files"]],
                 error=lambda r: r["error"]["message"])
# A prediction's status told as a poll outcome (starting and processing: still running).
PREDICTIONS = Polled(ReplicateClient, ReplicateClient.prediction, state=lambda p: p["status"],
                     succeeded={"succeeded"}, failed={"failed", "canceled"},
                     media=lambda p: p["output"] if isinstance(p["output"], list)
                     else [p["output"]], error=lambda p: p.get("error"))


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


PROVIDER = Provider(name="acme", kinds=(RENDER,), client=RENDERS,
                    default_url="https://api.acme.example", webhook=AcmeCallbacks())
# Replicate's kinds, thresholds, endpoint, media handling and webhook route stay
# callwarden's; its calls go through the host's client.
REPLICATE = Provider(name="replicate", client=PREDICTIONS)
PROVIDERS = [PROVIDER, REPLICATE]
