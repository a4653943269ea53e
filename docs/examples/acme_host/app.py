"""The host's web app (aiohttp): order a render, read it back.

    python app.py --port 8000      # DATABASE_URL, REDIS_URL as for the worker
    curl -X POST localhost:8000/renders -d '{"user_id": "u-1", "kind": "acme-render",
                                            "request": {"prompt": "a red fox"}}'
    curl localhost:8000/renders/<job id>

An order is a ``jobs`` row and its credit reservation (``callwarden.create_job``, one
statement), then a Celery message; a render is read back from the host's own row. The app
knows nothing else of callwarden: the worker runs the call, the reconciler finishes what a
dead worker left, and a job whose message was lost is refunded after 24 hours.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import uuid
from typing import Any

from aiohttp import web
from worker import run_call

from callwarden import create_job, open_pool
from events import RenderOrdered

CREDITS = {"acme-render": 5.0, "replicate-prediction": 8.0}


async def order(request: web.Request) -> web.Response:
    body: dict[str, Any] = await request.json()
    kind = str(body.get("kind", ""))
    if kind not in CREDITS:
        raise web.HTTPBadRequest(text=f"unknown kind {kind!r}")
    ordered = RenderOrdered(user_id=str(body["user_id"]),
                            prompt=str(body["request"].get("prompt", "")))
    async with request.app["pool"].connection() as conn:
        job_id = await create_job(conn, user_id=ordered.user_id, job_type="render",
                                  input_data=body["request"], credits=CREDITS[kind])
    await asyncio.to_thread(run_call.delay, str(job_id), kind, body["request"])
    return web.json_response({"job_id": str(job_id)}, status=202)


async def read(request: web.Request) -> web.Response:
    job_id = uuid.UUID(request.match_info["id"])
    async with request.app["pool"].connection() as conn:
        row = await (await conn.execute(
            "SELECT status, output_data, error_message FROM jobs WHERE id = %s",
            (job_id,))).fetchone()
    if row is None:
        raise web.HTTPNotFound()
    return web.json_response(row)


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port, printed) until SIGTERM or SIGINT."""
    app = web.Application()
    app.router.add_post("/renders", order)
    app.router.add_get("/renders/{id}", read)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with open_pool(os.environ["DATABASE_URL"]) as pool:
        app["pool"] = pool
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print(f"acme_host on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    asyncio.run(serve(parser.parse_args().port))
