"""The host's web app (aiohttp): order a render, read it back.

    python app.py --port 8000      # DATABASE_URL, REDIS_URL as for the worker
    curl -X POST localhost:8000/renders -d '{"user_id": "u-1", "kind": "acme-render",
                                            "request": {"prompt": "a red fox"}}'
    curl localhost:8000/renders/<job id>

An order holds the render's price on the user's balance (the host's ``accounts``), inserts
the ``jobs`` row and its credit reservation (``callwarden.create_job``), in one
transaction, then sends a Celery message; a render is read back from the host's own rows,
its files at the URLs the media store serves them at. The app knows nothing else of
callwarden: the worker runs the call, the reconciler finishes what a dead worker left, a
job whose message was lost is refunded after 24 hours, and the balance gets back what a
settlement does not charge (``db/002_settled.sql``).
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
    async with request.app["pool"].connection() as conn, conn.transaction():
        held = await conn.execute(
            "UPDATE accounts SET balance = balance - %s WHERE user_id = %s AND balance >= %s",
            (CREDITS[kind], ordered.user_id, CREDITS[kind]))
        if held.rowcount != 1:
            raise web.HTTPPaymentRequired(text="not enough credits")
        job_id = await create_job(conn, user_id=ordered.user_id, job_type="render",
                                  input_data=body["request"], credits=CREDITS[kind])
    await asyncio.to_thread(run_call.delay, str(job_id), kind, body["request"])
    return web.json_response({"job_id": str(job_id)}, status=202)


async def read(request: web.Request) -> web.Response:
    job_id = uuid.UUID(request.match_info["id"])
    async with request.app["pool"].connection() as conn:
        row = await (await conn.execute(
            "SELECT status, error_message, array(SELECT url FROM assets WHERE job_id = j.id "
            "ORDER BY storage_key) AS files FROM jobs j WHERE id = %s", (job_id,))).fetchone()
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
