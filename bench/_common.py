"""Shared set-up for the benchmarks: a Postgres (``DATABASE_URL`` or a throwaway embedded
server) and a fresh, migrated database per benchmark run."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from callwarden.database.databases import create_database, drop_database
from callwarden.database.db import EmbeddedServer, connect
from callwarden.database.migrate import migrate
from callwarden.database.queries import load_queries

#: The benchmarks' own statements (bench/bench.sql).
SQL = load_queries((Path(__file__).parent / "bench.sql").read_text(encoding="utf-8"))


@contextmanager
def postgres() -> Iterator[str]:
    """The admin URL of ``DATABASE_URL``'s server, or of a throwaway embedded one (stopped
    and its folder deleted after)."""
    admin = os.environ.get("DATABASE_URL")
    if admin:
        yield admin
        return
    folder = Path(tempfile.mkdtemp(prefix="cw-bench-"))
    server = EmbeddedServer(folder, cleanup="delete")
    try:
        yield server.url()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)  # the server deletes its data folder only


@contextmanager
def fresh_database(prefix: str = "bench", *, admin: str | None = None,
                   upto: int | None = None) -> Iterator[str]:
    """Yield the URL of a new database migrated (up to ``upto``, else all the way) on
    ``admin``'s server (else :func:`postgres`'s); drop it after."""
    with ExitStack() as stack:
        server = admin or stack.enter_context(postgres())
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        url = create_database(server, name)
        stack.callback(drop_database, server, name)

        async def _migrate() -> None:
            async with await connect(url) as conn:
                await migrate(conn, upto=upto)

        asyncio.run(_migrate())
        yield url


def conninfo_parts(url: str) -> dict[str, str]:
    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
