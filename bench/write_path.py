"""The write path a reader follows: the frames and files from ``CallRunner.run`` to each
statement it sends, for one happy async call (``kie-standard``: create, poll, finalize).

Run: ``python bench/write_path.py``

One call on a fresh database (``DATABASE_URL`` or a throwaway embedded server) against the
provider simulator on 127.0.0.1. Each statement psycopg sends is caught where it is sent
(``AsyncCursor.execute``), and the stack from ``CallRunner.run`` down to it is read back:
its frames, the files they pass, and the frames that *only forward* the call (a function
whose body, its docstring aside, is one ``return``/``await`` of another call; one that
takes a connection around it does work of its own). Nothing is timed: the figures are
counts, the same on every machine (docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from _common import fresh_database
from psycopg import AsyncCursor
from rich.console import Console
from rich.table import Table

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import open_pool
from callwarden.database.jobs import create_job
from callwarden.providers.simulator.core import running_simulator
from callwarden.providers.storage import LocalFolderStore

KIND = "kie-standard"
REQUEST: dict[str, Any] = {"model": "nano-banana-pro", "input": {
    "prompt": "frames", "_sim": {"steps": [{"phase": "running", "polls": 1}],
                                 "end": "succeeded"}}}
ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("engine", "events", "projections", "providers")
WRITE = Path("engine/database/write.py")


@functools.cache
def _source(filename: str) -> Path | None:
    """The repository file a frame runs (an editable install may run it through a link)."""
    path = Path(filename).resolve()
    if not path.is_relative_to(ROOT):
        return None
    inside = path.relative_to(ROOT)
    return inside if inside.parts[0] in PACKAGE and "simulator" not in inside.parts else None


def _ours(frame: traceback.FrameSummary) -> bool:
    return _source(frame.filename) is not None


@functools.cache
def _functions(filename: str) -> dict[int, ast.FunctionDef | ast.AsyncFunctionDef]:
    """line -> the function defined there (its ``def`` line and every line of its body)."""
    tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
    found: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                if line not in found or found[line].lineno < node.lineno:  # innermost
                    found[line] = node
    return found


def _forwards(frame: traceback.FrameSummary) -> bool:
    """The frame's function does nothing but call on (see the module's docstring)."""
    node = _functions(frame.filename).get(frame.lineno or 0)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
        return False
    value = body[0].value
    if isinstance(value, ast.Await):
        value = value.value
    return isinstance(value, ast.Call)


def _in_append(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "append" and _source(frame.f_code.co_filename) == WRITE:
            return True
        frame = frame.f_back
    return False


class Caught:
    """Every statement's stack, from ``CallRunner.run`` down (our frames only), and the
    files of every function the append called on its way to it (``sys.setprofile``)."""

    def __init__(self) -> None:
        self.stacks: list[tuple[str, list[traceback.FrameSummary], set[Path]]] = []
        self.touched: set[Path] = set()

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            source = _source(frame.f_code.co_filename)
            if source is not None and _in_append(frame):
                self.touched.add(source)

    @staticmethod
    def _path(stack: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
        start = next(i for i, f in enumerate(stack) if f.name == "run"
                     and f.filename.endswith("calls/runner.py"))
        return [f for f in stack[start:] if _ours(f)]

    @contextmanager
    def install(self) -> Iterator[None]:
        original = AsyncCursor.execute
        caught = self

        async def execute(cursor: AsyncCursor[Any], query: Any, *args: Any,
                          **kwargs: Any) -> Any:
            stack = traceback.extract_stack()
            if any(f.name == "run" and f.filename.endswith("calls/runner.py") for f in stack):
                text = query.as_string(cursor) if hasattr(query, "as_string") else str(query)
                caught.stacks.append((" ".join(text.split())[:60], caught._path(stack),
                                      caught.touched))
                caught.touched = set()
            return await original(cursor, query, *args, **kwargs)

        AsyncCursor.execute = execute  # type: ignore[method-assign, assignment]
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(None)
            AsyncCursor.execute = original  # type: ignore[method-assign]


async def one_call(url: str, caught: Caught) -> None:
    with tempfile.TemporaryDirectory(prefix="cw-frames-") as tmp:
        async with (running_simulator() as sim, aiohttp.ClientSession() as http,
                    open_pool(url, min_size=1, max_size=2) as pool):
            async with pool.connection() as conn:
                job = await create_job(conn, credits=5)
            async with CallRunner(pool, http, sim.settings, LocalFolderStore(Path(tmp)),
                                  config=CallConfig(poll_interval_s={KIND: 1e-6})) as runner:
                with caught.install():
                    out = await runner.run(job, KIND, REQUEST)
            if out.result != "completed":
                raise RuntimeError(f"the call ended {out.result}: {out.detail}")


def report(console: Console, caught: Caught) -> None:
    table = Table(title="CallRunner.run -> each statement it sends (one happy async call)")
    for column in ("statement", "frames", "files", "forward only", "files the append calls"):
        table.add_column(column, justify="left" if column == "statement" else "right")
    for text, path, touched in caught.stacks:
        files = {_source(f.filename) for f in path}
        table.add_row(text, str(len(path)), str(len(files)),
                      str(sum(1 for f in path if _forwards(f))),
                      str(len(touched | files)) if touched else "")
    console.print(table)
    text, path, touched = max(caught.stacks, key=lambda s: len(s[1]))
    console.print(f"the deepest ({text[:40]}...):")
    for f in path:
        console.print(f"  {_source(f.filename)}:{f.lineno} {f.name}"
                      f"{'  (forwards)' if _forwards(f) else ''}")
    others = sorted(str(p) for p in touched - {_source(f.filename) for f in path})
    console.print(f"and the files the append called into on the way: {', '.join(others)}")


def main() -> None:
    caught = Caught()
    with fresh_database("frames") as url:
        asyncio.run(one_call(url, caught))
    report(Console(width=120), caught)


if __name__ == "__main__":
    main()
