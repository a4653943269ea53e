"""ai-writer: a sync and a streaming LLM route in aiohttp, each calling the provider with
the host's own HTTP client inside callwarden's context manager (docs/embedding.md).

    callwarden migrate                        # once per database, as a deploy step
    DATABASE_URL=postgresql://... ANTHROPIC_API_KEY=... KIE_API_KEY=... \\
        python docs/examples/ai_writer_app.py --port 8000
    curl -X POST localhost:8000/ai-writer -d '{"user_id": "u-1", "prompt": "a haiku"}'
    curl -N -X POST localhost:8000/ai-writer/stream -d '{"user_id": "u-1", "prompt": "a poem"}'

``CALLWARDEN_ANTHROPIC_URL`` / ``CALLWARDEN_KIE_URL`` point elsewhere than the real APIs (the
tests: at the simulator). The sync route calls Anthropic directly (kind ``anthropic-sync``),
the streaming one KIE's Claude proxy (``kie-llm``); the seed's ai-writer picks one of the
two by its routing flag. Run ``callwarden reconcile`` next to it: a call this process was
killed inside is swept and refunded, once, past its kind's threshold (5 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from psycopg.types.json import Jsonb

from callwarden import OwnCalls, Pool, ProviderSettings, Rate, RateTable, open_pool

MODEL = "claude-sonnet-4-6"
RESERVE = 10.0  # credits held per call until callwarden commits (by usage) or refunds them
# The host's price list: a completed call is charged from the usage it reports, never above
# its reservation (docs/pricing.md).
PRICES = RateTable(rates=(
    Rate(kind="anthropic-sync", unit="input_tokens", credits=0.01),
    Rate(kind="anthropic-sync", unit="output_tokens", credits=0.02),
    Rate(kind="kie-llm", unit="provider_credits", credits=100.0)))

PROVIDERS = web.AppKey("providers", ProviderSettings)
POOL = web.AppKey("pool", Pool)
HTTP = web.AppKey("http", aiohttp.ClientSession)
CALLS = web.AppKey("calls", OwnCalls)


async def resources(app: web.Application) -> AsyncIterator[None]:
    """One pool, one HTTP client and one ``OwnCalls`` per process: opened at startup, closed
    at cleanup (after the open requests have ended)."""
    async with open_pool(os.environ["DATABASE_URL"], max_size=10) as pool, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await pool.wait()  # fail at start, not on the first request
        app[POOL], app[HTTP] = pool, http
        app[CALLS] = OwnCalls(pool, settings=app[PROVIDERS], pricing=PRICES)
        yield


async def reserve_credits_for_job(pool: Pool, user_id: str, prompt: str) -> uuid.UUID:
    """The host's own job row and credit reservation (plain SQL, one transaction)."""
    job_id = uuid.uuid4()
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO jobs (id, user_id, job_type, status, input_data) "
            "VALUES (%s, %s, 'ai-writer', 'processing', %s)",
            (job_id, user_id, Jsonb({"prompt": prompt})))
        await conn.execute(
            "INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
            "VALUES (%s, %s, 'reserved', %s)", (job_id, user_id, RESERVE))
    return job_id


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """The ``(event, data)`` pairs of a server-sent event stream, as they arrive."""
    event = ""
    async for raw in resp.content:  # one line at a time
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, json.loads(line[5:])
            event = ""


# -- POST /ai-writer: one request, one answer ----------------------------------------------

async def ai_writer(request: web.Request) -> web.Response:
    """``{"user_id", "prompt"}`` -> ``{"job_id", "result", "text"}``."""
    body, app = await request.json(), request.app
    anthropic = app[PROVIDERS].anthropic
    job_id = await reserve_credits_for_job(app[POOL], body["user_id"], body["prompt"])
    try:  # nothing between the reservation and the call's start (see ai_writer_stream)
        # CallStarted on enter (the call is recorded before the request); from here callwarden
        # settles the reservation exactly once: commit if a result was set, else refund.
        async with app[CALLS].sync_call(job_id, "anthropic-sync") as call:
            async with app[HTTP].post(f"{anthropic.base_url}/v1/messages", json={
                    "model": MODEL, "max_tokens": 1024,
                    "messages": [{"role": "user", "content": body["prompt"]}]},
                    headers={"x-api-key": anthropic.api_key,
                             "anthropic-version": "2023-06-01"}) as resp:
                resp.raise_for_status()
                answer = await resp.json()
            text, usage = answer["content"][0]["text"], answer["usage"]
            call.succeeded(text=text, stop_reason=answer["stop_reason"], usage={
                "model": answer["model"], "input_tokens": usage["input_tokens"],
                "output_tokens": usage["output_tokens"]})
        # exit: UpstreamSucceeded -> Completed, committed at PRICES' charge for the usage
    except aiohttp.ClientError as exc:  # recorded failed (code: its class), refunded
        raise web.HTTPBadGateway(text=f"the LLM call failed: {exc}") from exc
    assert call.outcome is not None  # set by the exit
    return web.json_response({"job_id": str(job_id), "result": call.outcome.result,
                              "text": text})


# -- POST /ai-writer/stream: the same, as server-sent events --------------------------------

async def write_stream(app: web.Application, job_id: uuid.UUID,
                       prompt: str) -> AsyncGenerator[bytes, None]:
    """The client's SSE chunks, every one yielded from inside the call."""
    kie = app[PROVIDERS].kie
    async with app[CALLS].sync_call(job_id, "kie-llm") as call:
        yield sse("job", {"job_id": str(job_id)})
        parts: list[str] = []
        stop: str | None = None
        async with app[HTTP].post(f"{kie.base_url}/claude/v1/messages", json={
                "model": MODEL, "max_tokens": 1024, "stream": True,
                "messages": [{"role": "user", "content": prompt}]},
                headers={"Authorization": f"Bearer {kie.api_key}"}) as resp:
            resp.raise_for_status()
            async for event, data in sse_events(resp):
                if event == "message_start":  # the usage, as the stream reports it
                    message = data["message"]
                    call.usage.update(model=message["model"],
                                      input_tokens=message["usage"]["input_tokens"],
                                      provider_credits=message["credits_consumed"])
                elif event == "content_block_delta":
                    parts.append(data["delta"].get("text", ""))
                elif event == "message_delta":
                    call.usage["output_tokens"] = data["usage"]["output_tokens"]
                    stop = data["delta"]["stop_reason"]
                elif event == "error":  # an in-stream error (e.g. overloaded_error)
                    call.failed(data["error"]["message"], code=data["error"]["type"])
                # If the client is gone, the route closes this generator: GeneratorExit is
                # raised here, inside the call, which records failed (stream_closed), refunded.
                yield sse(event, data)
        if stop is not None:  # the whole answer arrived; without it: failed, refunded
            call.succeeded(text="".join(parts), stop_reason=stop)


async def ai_writer_stream(request: web.Request) -> web.StreamResponse:
    """``{"user_id", "prompt"}`` -> ``text/event-stream``: a ``job`` event, then the LLM's."""
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)  # first: a client gone already fails here, nothing reserved
    # A job row with a reservation and no call is the host's, never swept: keep the gap
    # between the reservation and the call's start to these two statements.
    job_id = await reserve_credits_for_job(request.app[POOL], body["user_id"], body["prompt"])
    try:
        # aclosing: a loop that stops early closes the generator now, in this handler (not
        # later, from the garbage collector), so the call is recorded before we return.
        async with contextlib.aclosing(write_stream(request.app, job_id,
                                                    body["prompt"])) as chunks:
            async for chunk in chunks:
                await resp.write(chunk)  # raises once the client has gone
    except ConnectionResetError:  # the client went away: failed (stream_closed), refunded
        return resp
    except aiohttp.ClientError as exc:  # the LLM call failed: failed, refunded
        await resp.write(sse("error", {"message": f"the LLM call failed: {exc}"}))
    await resp.write_eof()
    return resp


def build_app() -> web.Application:
    app = web.Application()
    app[PROVIDERS] = ProviderSettings.from_env()  # CALLWARDEN_<P>_URL, <P>_API_KEY
    app.cleanup_ctx.append(resources)
    app.router.add_post("/ai-writer", ai_writer)
    app.router.add_post("/ai-writer/stream", ai_writer_stream)
    return app


async def serve(host: str, port: int) -> None:
    runner = web.AppRunner(build_app())
    await runner.setup()  # resources(): the pool is open
    await web.TCPSite(runner, host, port).start()
    print(f"listening on http://{host}:{runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # open requests end (their calls are recorded), then the pool


def main() -> None:
    parser = argparse.ArgumentParser(description="the ai-writer example app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
