"""A headless Chromium driven over the Chrome DevTools Protocol (its websocket, with
aiohttp): navigate, evaluate JavaScript, size the viewport, take screenshots.

Debian's ``chromium`` is required; :func:`chromium` fails the test (never skips) with how
to install it. The browser runs with its own profile under the test's tmp path and is
killed by its own pid when the ``Browser`` closes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.debian import binary

__all__ = ["Page", "chromium", "open_page"]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def chromium() -> str:
    found = binary(("chromium", "chromium-browser"), "chromium")
    if found is None:
        pytest.fail("headless Chromium is required for the dashboard acceptance test: "
                    "install Debian's package with `apt-get update && apt-get install -y "
                    "chromium` (.ci/run does this)")
    return found


class Page:
    """One tab: ``send`` a CDP command and await its answer; the loaderIds of the
    documents that fired ``load`` are kept (:meth:`goto` waits for its own)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids = ws, itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.loaded: set[str] = set()  # the loaderIds whose document fired ``load``
        self.changed = asyncio.Event()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif data.get("method") == "Page.lifecycleEvent" \
                    and data["params"].get("name") == "load":
                self.loaded.add(data["params"]["loaderId"])
                self.changed.set()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[n] = fut
        await self.ws.send_json({"id": n, "method": method, "params": params})
        answer = await asyncio.wait_for(fut, timeout=30)
        assert "error" not in answer, (method, answer["error"])
        return dict(answer.get("result", {}))

    async def goto(self, url: str) -> None:
        """Navigate and wait for *this* navigation's ``load``: matched by its loaderId, so
        a late load of an earlier document (the page's own reload after an action) is
        never taken for it."""
        nav = await self.send("Page.navigate", url=url)
        assert "errorText" not in nav, (url, nav["errorText"])
        assert "loaderId" in nav, f"{url}: a same-document navigation loads nothing"
        loader = nav["loaderId"]
        async with asyncio.timeout(30):
            while loader not in self.loaded:
                self.changed.clear()
                await self.changed.wait()

    async def js(self, expression: str) -> Any:
        out = await self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        assert "exceptionDetails" not in out, out["exceptionDetails"]
        return out["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15.0) -> Any:
        """Poll ``expression`` until it is truthy (a condition, not a fixed sleep); while
        the page reloads it may throw or find no context: that counts as not yet."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            n = next(self.ids)
            fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self.waiting[n] = fut
            await self.ws.send_json({"id": n, "method": "Runtime.evaluate", "params": {
                "expression": expression, "returnByValue": True}})
            answer = (await asyncio.wait_for(fut, timeout=30)).get("result", {})
            value = None if "exceptionDetails" in answer else answer.get("result", {}).get(
                "value")
            if value:
                return value
            assert asyncio.get_running_loop().time() < deadline, f"never true: {expression}"
            await asyncio.sleep(0.1)

    async def viewport(self, width: int, height: int = 900) -> None:
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=width < 600)

    async def screenshot(self, path: Path) -> None:
        out = await self.send("Page.captureScreenshot", format="png",
                              captureBeyondViewport=True)
        await asyncio.to_thread(_write, path, base64.b64decode(out["data"]))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@asynccontextmanager
async def open_page(profile: Path) -> AsyncIterator[Page]:
    """A fresh Chromium and its first tab, closed (the process killed) afterwards."""
    proc = await asyncio.create_subprocess_exec(
        chromium(), *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}",
        "about:blank", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    drain: asyncio.Task[bytes] | None = None
    try:
        assert proc.stderr is not None
        port = None
        while port is None:
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
            assert line, "chromium exited before its DevTools endpoint came up"
            m = re.search(rb"DevTools listening on ws://[^:]+:(\d+)/", line)
            port = int(m[1]) if m else None
        drain = asyncio.get_running_loop().create_task(proc.stderr.read())  # never blocks it
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                tabs = [t for t in await resp.json() if t["type"] == "page"]
            async with http.ws_connect(tabs[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send("Page.enable")
                await page.send("Page.setLifecycleEventsEnabled", enabled=True)
                await page.send("Runtime.enable")
                try:
                    yield page
                finally:
                    page.reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await page.reader
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if drain is not None:
            await drain
