"""The repository's folders as the installed package names them (pyproject's
``package-dir``): ``engine/`` is ``callwarden``, and ``events/``, ``projections/``,
``providers/`` and ``migrations/`` are ``callwarden.events`` and so on."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

__all__ = ["FOLDERS", "ROOT", "folders", "link_tree", "module_of", "source_of"]

ROOT = Path(__file__).resolve().parents[1]


def folders(root: Path) -> dict[str, Path]:
    """Package name -> folder, from ``root``'s pyproject.toml (what the wheel maps)."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}


FOLDERS = folders(ROOT)


def module_of(path: Path) -> str:
    """``engine/database/write.py`` -> ``callwarden.database.write`` (the deepest mapping wins)."""
    path = path.resolve()
    best = max((n for n, f in FOLDERS.items() if f == path or f in path.parents),
               key=lambda n: len(FOLDERS[n].parts))
    rest = path.relative_to(FOLDERS[best]).with_suffix("").parts
    return ".".join((best, *rest)).removesuffix(".__init__")


def source_of(module: str) -> Path:
    """``callwarden.database.write`` -> ``engine/database/write.py`` (a package: its __init__)."""
    best = max((n for n in FOLDERS if module == n or module.startswith(n + ".")), key=len)
    rest = module[len(best):].strip(".")
    path = FOLDERS[best].joinpath(*rest.split(".")) if rest else FOLDERS[best]
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def link_tree(dest: Path, root: Path = ROOT) -> Path:
    """Lay ``root``'s folders out under ``dest`` as the wheel lays them (``dest/callwarden``
    holds links to each entry of ``engine/``, and ``dest/callwarden/events`` links to
    ``events/``...), for what cannot follow the editable install's import hook: mypy, and
    a copy of the checkout whose code must shadow the installed one (tests.mutations).
    Returns ``dest``, the folder to put on the path."""
    shutil.rmtree(dest, ignore_errors=True)
    mapped = folders(root)
    top = dest / "callwarden"
    top.mkdir(parents=True)
    for entry in sorted(mapped["callwarden"].iterdir()):
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry.resolve())
    for name, folder in mapped.items():
        if name != "callwarden":
            (dest / name.replace(".", "/")).symlink_to(folder.resolve())
    return dest


if __name__ == "__main__":  # python -m tests.layout DEST
    import sys

    print(link_tree(Path(sys.argv[1]).resolve()))
