"""The repository's folders as the installed package names them (pyproject's
``package-dir``): ``engine/`` is ``callwarden``, and ``events/``, ``projections/``,
``providers/`` and ``migrations/`` are ``callwarden.events`` and so on."""

from __future__ import annotations

import tomllib
from pathlib import Path

__all__ = ["FOLDERS", "ROOT", "module_of", "source_of"]

ROOT = Path(__file__).resolve().parents[1]
#: package name -> folder, from pyproject.toml (so the tests read what the wheel maps).
FOLDERS: dict[str, Path] = {
    name: ROOT / folder for name, folder in tomllib.loads(
        (ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-dir"].items()}


def module_of(path: Path) -> str:
    """``engine/store/write.py`` -> ``callwarden.store.write`` (the deepest mapping wins)."""
    path = path.resolve()
    best = max((n for n, f in FOLDERS.items() if f == path or f in path.parents),
               key=lambda n: len(FOLDERS[n].parts))
    rest = path.relative_to(FOLDERS[best]).with_suffix("").parts
    return ".".join((best, *rest)).removesuffix(".__init__")


def source_of(module: str) -> Path:
    """``callwarden.store.write`` -> ``engine/store/write.py`` (a package: its __init__)."""
    best = max((n for n in FOLDERS if module == n or module.startswith(n + ".")), key=len)
    path = FOLDERS[best].joinpath(*module[len(best):].strip(".").split(".")) \
        if module != best else FOLDERS[best]
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
