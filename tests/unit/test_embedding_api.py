"""The public API is one list, kept equal everywhere it is written: ``callwarden.__all__``,
the ``TYPE_CHECKING`` imports a type checker reads, docs/api.md, and what the docs, the
README and the example hosts import (nothing internal). Every exported name resolves to
the object its module defines, and ``import callwarden`` alone loads no I/O library."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import callwarden

ROOT = Path(__file__).resolve().parents[2]
INIT = Path(callwarden.__file__)
API_PAGE = ROOT / "docs" / "api.md"
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
IMPORT_LINE = re.compile(r"^\s*(?:from\s+(callwarden[\w.]*)\s+import\s+\(?([\w, ]+)|"
                         r"import\s+(callwarden[\w.]*))", re.M)


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


def _page_rows(heading: str) -> list[str]:
    """The first column's names of the table under ``heading`` in docs/api.md."""
    section = API_PAGE.read_text(encoding="utf-8").split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w.]+)` \|", section, re.M)


def _imports() -> list[tuple[str, str, set[str]]]:
    """(file, module, names) of every ``callwarden`` import in the docs' Python blocks, the
    README's and the example hosts' files."""
    found = []
    sources = [(p, CODE_BLOCK.findall(p.read_text(encoding="utf-8")))
               for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    sources += [(p, [p.read_text(encoding="utf-8")])
                for p in sorted((ROOT / "docs" / "examples").rglob("*.py"))]
    for path, blocks in sources:
        for block in blocks:
            for m in IMPORT_LINE.finditer(block):
                module = m.group(1) or m.group(3)
                names = {n.strip() for n in (m.group(2) or "").split(",") if n.strip()}
                found.append((str(path.relative_to(ROOT)), module, names))
    return found


def test_every_exported_name_is_the_object_its_module_defines() -> None:
    for name, (module, attribute) in _typed_names().items():
        assert getattr(callwarden, name) is getattr(importlib.import_module(module), attribute)


def test_the_names_a_type_checker_sees_are_the_exported_ones() -> None:
    assert sorted(_typed_names()) == sorted(callwarden.__all__)
    assert len(callwarden.__all__) <= 24, "the public API is what a host needs, about 20 names"


def test_the_api_page_lists_exactly_the_public_names_and_modules() -> None:
    assert sorted(_page_rows("## `from callwarden import ...`")) == sorted(callwarden.__all__)
    assert sorted(_page_rows("## Modules a host imports by name")) \
        == sorted(callwarden.PUBLIC_MODULES)
    for module in callwarden.PUBLIC_MODULES:
        importlib.import_module(module)


def test_the_docs_and_example_hosts_import_only_the_public_api() -> None:
    imports = _imports()
    assert len(imports) >= 10, imports  # the scan finds the docs' imports at all
    wrong = [(where, module, sorted(names - set(callwarden.__all__)))
             for where, module, names in imports
             if module == "callwarden" and not names <= set(callwarden.__all__)]
    wrong += [(where, module, []) for where, module, _ in imports
              if module != "callwarden" and module not in callwarden.PUBLIC_MODULES]
    assert wrong == []


def test_the_error_tree_holds_the_own_call_errors() -> None:
    from callwarden import errors
    from callwarden.calls import own
    for name in ("OwnCallError", "TaskIdConflict", "WrongKind", "CallNotStarted",
                 "CallAlreadyStarted"):
        assert getattr(own, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), callwarden.CallwardenError)


def test_an_unknown_or_internal_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        callwarden.NoSuchThing  # noqa: B018
    with pytest.raises(AttributeError, match="Finalizer"):
        callwarden.Finalizer  # noqa: B018


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


def test_every_package_says_whether_it_is_internal() -> None:
    """Visibly internal: each package's docstring (what an editor shows on hover) says it
    is internal, naming the public modules it holds."""
    import pkgutil
    packages = [m.name for m in pkgutil.walk_packages(callwarden.__path__, "callwarden.")
                if m.ispkg and m.name.count(".") == 1 and m.name != "callwarden.events"
                and m.name != "callwarden.migrations"]
    assert len(packages) >= 10, packages
    for name in packages:
        doc = importlib.import_module(name).__doc__ or ""
        assert "Internal" in doc, name
        for public in callwarden.PUBLIC_MODULES:
            if public.startswith(name + "."):
                assert public in doc, (name, public)


OUTCOMES = ("Running", "Succeeded", "Failed", "NotFound", "PollOutcome")


def test_a_docs_block_that_uses_the_outcome_types_imports_them_from_their_module() -> None:
    """``Running``, ``Succeeded``, ``Failed`` and ``NotFound`` (and ``PollOutcome``) are
    imported from ``callwarden.providers.outcomes``, a public module: every Python block of
    the docs, the README and every example file that uses one imports it from there
    (issue 41 item 6: a host found them nowhere it looked; the adapter's block used them
    with no import)."""
    outcomes = importlib.import_module("callwarden.providers.outcomes")
    assert "callwarden.providers.outcomes" in callwarden.PUBLIC_MODULES
    assert set(OUTCOMES) <= set(outcomes.__all__)
    sources = [(p, CODE_BLOCK.findall(p.read_text(encoding="utf-8")))
               for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    sources += [(p, [p.read_text(encoding="utf-8")])
                for p in sorted((ROOT / "docs" / "examples").rglob("*.py"))]
    unimported = []
    for path, blocks in sources:
        for block in blocks:
            used = {n for n in OUTCOMES if re.search(rf"\b{n}\(|-> {n}\b", block)}
            imported = {n.strip() for m in re.finditer(
                r"from callwarden\.providers\.outcomes import \(?([\w, \n]+)", block)
                for n in m.group(1).replace("\n", ",").split(",") if n.strip()}
            if used - imported:
                unimported.append((str(path.relative_to(ROOT)), sorted(used - imported)))
    assert unimported == []
