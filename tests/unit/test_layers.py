"""engine's units keep their declared order (``callwarden.LAYERS``): a unit imports only
units of strictly lower layers, so there is no import cycle among them and nothing imports
upward; every unit is declared; the repository's other folders (events, projections,
providers, migrations) import nothing of engine. Every import counts: module level,
inside functions, and under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import callwarden
from tests.layout import FOLDERS, module_of

ENGINE = FOLDERS["callwarden"]
OUTSIDE = {"events", "projections", "providers", "migrations"}
RANK = {unit: i for i, layer in enumerate(callwarden.LAYERS) for unit in layer}


def _unit(path: Path) -> str:
    rel = path.relative_to(ENGINE).parts
    return rel[0].removesuffix(".py")


def _imported_units(path: Path) -> list[tuple[str, int]]:
    """The engine units ``path`` imports, with the line of each import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        units = {parts[1] for parts in (n.split(".") for n in names)
                 if parts[0] == "callwarden" and len(parts) > 1 and parts[1] in RANK}
        found += [(unit, node.lineno) for unit in sorted(units)]
    return found


ENGINE_SOURCES = sorted(p for p in ENGINE.rglob("*.py")
                        if "__pycache__" not in p.parts and p != ENGINE / "__init__.py")


def test_every_unit_is_declared_once() -> None:
    units = {_unit(p) for p in ENGINE_SOURCES}
    declared = [u for layer in callwarden.LAYERS for u in layer]
    assert len(declared) == len(set(declared))
    assert units == set(declared)


@pytest.mark.parametrize("path", ENGINE_SOURCES, ids=lambda p: module_of(p))
def test_a_unit_imports_only_lower_layers(path: Path) -> None:
    unit = _unit(path)
    upward = [f"line {line}: {unit} -> {other}" for other, line in _imported_units(path)
              if other != unit and RANK[other] >= RANK[unit]]
    assert upward == []


@pytest.mark.parametrize("folder", sorted(OUTSIDE))
def test_the_other_folders_import_nothing_of_engine(folder: str) -> None:
    found = [f"{module_of(p)} line {line}: {unit}"
             for p in sorted(FOLDERS[f"callwarden.{folder}"].rglob("*.py"))
             for unit, line in _imported_units(p)]
    assert found == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker is not vacuous: a store module importing the reconciler is caught."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from callwarden.reconciler import loop\n", encoding="utf-8")
    assert _imported_units(bad) == [("reconciler", 2)]
    assert RANK["reconciler"] >= RANK["database"]
