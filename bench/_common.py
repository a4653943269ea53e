"""Shared set-up for the benchmarks: a Postgres (``DATABASE_URL`` or a throwaway embedded
server) and a fresh, migrated database per benchmark run."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from callwarden.database.databases import create_database, drop_database
from callwarden.database.db import EmbeddedServer, connect
from callwarden.database.migrate import migrate
from callwarden.database.queries import load_queries

#: The benchmarks' own statements (bench/bench.sql).
SQL = load_queries((Path(__file__).parent / "bench.sql").read_text(encoding="utf-8"))


@contextmanager
def fresh_database(prefix: str = "bench") -> Iterator[str]:
    """Yield the URL of a new migrated database; drop it (and any embedded server) after."""
    server, folder = None, None
    admin = os.environ.get("DATABASE_URL")
    if not admin:
        folder = Path(tempfile.mkdtemp(prefix="cw-bench-"))
        server = EmbeddedServer(folder, cleanup="delete")
        admin = server.url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    url = create_database(admin, name)

    async def _migrate() -> None:
        async with await connect(url) as conn:
            await migrate(conn)

    asyncio.run(_migrate())
    try:
        yield url
    finally:
        drop_database(admin, name)
        if server is not None:
            server.stop()
        if folder is not None:  # the server deletes its data folder, not this one
            shutil.rmtree(folder, ignore_errors=True)


def conninfo_parts(url: str) -> dict[str, str]:
    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
