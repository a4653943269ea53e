"""``callwarden`` re-exports the embedding API: a host writes one import. Every exported name
resolves to the object its module defines, the names mypy sees (the ``TYPE_CHECKING``
imports) are exactly the exported ones, and ``import callwarden`` alone loads no I/O
library (the names load on first use)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import callwarden

INIT = Path(callwarden.__file__)


def _typed_names() -> dict[str, tuple[str, str]]:
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module
        for alias in node.names:
            names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def test_every_exported_name_is_the_object_its_module_defines() -> None:
    for name, (module, attribute) in callwarden.EXPORTS.items():
        assert getattr(callwarden, name) is getattr(importlib.import_module(module), attribute)
    assert sorted(callwarden.__all__) == sorted(callwarden.EXPORTS)


def test_the_names_mypy_sees_are_the_exported_ones() -> None:
    assert _typed_names() == callwarden.EXPORTS


def test_the_embedding_api_names_what_a_worker_needs() -> None:
    for name in ("CallRunner", "CallConfig", "Reconciler", "open_pool", "ProviderSettings",
                 "media_from_env", "LocalFolderStore", "S3Store", "create_job", "migrate"):
        assert name in callwarden.__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        callwarden.NoSuchThing  # noqa: B018


def test_importing_engine_loads_no_io_library() -> None:
    code = ("import sys, callwarden\n"
            "print(sorted(m for m in ('psycopg', 'psycopg_pool', 'aiohttp', 'boto3') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_events_package_exports_every_event_type() -> None:
    from callwarden import events
    assert {t.__name__ for t in events.EVENT_TYPES.values()} <= set(events.__all__)
