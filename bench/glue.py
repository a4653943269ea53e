"""How much of the example host is glue: the lines it writes because it uses callwarden,
for its first kind and for each next one (docs/embedding.md, "An example host, and how much
of it is glue"; issue 41 item 6).

Run: ``python bench/glue.py [HOST_FOLDER] [--markdown | --json]`` (default: the example
host, ``docs/examples/acme_host``). Nothing is timed or run: the host's files are read.

**The rule.** A line is a non-blank line that is not only a comment; a docstring's lines
and ``from __future__`` imports are never counted. :data:`FILES` says what each of the
host's files is to it (a file it does not list is an error):

- ``glue``: a file the host adds for callwarden — its adapters (its own clients answering
  in callwarden's terms), its settlement hook, callwarden's settings — counts whole;
- ``own``: a file the host has with or without callwarden — its web app, its queue app,
  its provider clients, its tables, its process list. A Python statement in it counts
  when it names callwarden: an import from ``callwarden``, a name such an import binds,
  or a name a glue file or a counted top-level statement of another host file binds
  (``run_call = register(app)`` in ``worker.py`` makes ``run_call`` callwarden's in
  ``app.py`` too); a compound statement (``def``, ``with``, ``if``...) counts its header
  lines by that rule and its body statement by statement. A line of any other file counts
  when it names callwarden (``callwarden migrate``, ``CALLWARDEN_...``).

**Per kind.** A top-level statement of a glue file belongs to the first kind unless it
binds a name :data:`PARTS` gives a next kind (``PREDICTIONS``) or an optional part
(Acme's webhook scheme: without it its calls are polled): then it is that part's. An import
is each part's whose statements alone use one of its names (``from vendors import
AcmeClient, ReplicateClient``: the first kind's and Replicate's, a line a host edits for
its next kind). A first-kind statement that names a next kind's names
(``PROVIDERS = [PROVIDER, REPLICATE]``) counts for that kind too. Everything in an own
file and in a glue file that is not Python is the first kind's.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
HOST = ROOT / "docs" / "examples" / "acme_host"
FIRST = "first kind"

Role = Literal["glue", "own"]

#: What each file of the example host is to the host, and why.
FILES: dict[str, tuple[Role, str]] = {
    "providers.py": ("glue", "its adapters: its clients answering in callwarden's terms"),
    "db/002_settled.sql": ("glue", "its credits follow each settlement"),
    "callwarden.env": ("glue", "callwarden's settings, read by every process"),
    "app.py": ("own", "its web app: an order, a read"),
    "worker.py": ("own", "its Celery app"),
    "vendors.py": ("own", "its clients of Acme and Replicate, as it had them"),
    "events.py": ("own", "its domain events"),
    "db/001_accounts.sql": ("own", "its accounts and their balance"),
    "Procfile": ("own", "its processes"),
}

#: The names each part other than the first kind binds in the glue files.
PARTS: dict[str, tuple[str, ...]] = {
    "replicate-prediction": ("PREDICTIONS", "REPLICATE"),
    "optional: Acme's callbacks": ("AcmeCallbacks",),
}
OPTIONAL = "optional: "


@dataclass
class Count:
    """The lines of one file, per part (:data:`FIRST`, a next kind, an optional part)."""

    path: str
    role: Role
    why: str
    lines: dict[str, int] = field(default_factory=dict)

    def add(self, part: str, n: int) -> None:
        if n:
            self.lines[part] = self.lines.get(part, 0) + n


# -- lines ----------------------------------------------------------------------------------

def _counted(source: list[str], first: int, last: int, skip: set[int]) -> int:
    """Lines ``first``..``last`` (1-based) that are neither blank, a comment nor in ``skip``."""
    return sum(1 for n in range(first, last + 1)
               if n not in skip and source[n - 1].strip()
               and not source[n - 1].strip().startswith("#"))


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every docstring (a module's, a class's, a function's)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                end = body[0].end_lineno or body[0].lineno
                lines.update(range(body[0].lineno, end + 1))
    return lines


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


def _bound(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _named(nodes: Iterable[ast.AST]) -> set[str]:
    """Every name read in ``nodes`` (a ``Name``; an attribute's root is one)."""
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _header(stmt: ast.stmt) -> tuple[list[ast.AST], list[list[ast.stmt]]]:
    """A compound statement's header parts (what its header lines name) and its bodies."""
    bodies = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if getattr(stmt, f, None)]
    bodies += [h.body for h in getattr(stmt, "handlers", [])]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        parts: list[ast.AST] = [*stmt.decorator_list, stmt.args]
        return parts + ([stmt.returns] if stmt.returns else []), bodies
    if isinstance(stmt, ast.ClassDef):
        return [*stmt.decorator_list, *stmt.bases, *stmt.keywords], bodies
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return list(stmt.items), bodies
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target, stmt.iter], bodies
    if isinstance(stmt, ast.If | ast.While):
        return [stmt.test], bodies
    if isinstance(stmt, ast.Try):
        return [h.type for h in stmt.handlers if h.type], bodies
    if isinstance(stmt, ast.Match):
        return [stmt.subject], [c.body for c in stmt.cases]
    return [stmt], []


def _header_end(stmt: ast.stmt, bodies: list[list[ast.stmt]]) -> int:
    first_body = min((b[0].lineno for b in bodies if b), default=stmt.end_lineno or stmt.lineno)
    return first_body - 1 if bodies else (stmt.end_lineno or stmt.lineno)


def _start(stmt: ast.stmt) -> int:
    decorators: list[ast.expr] = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


# -- own Python files: the statements that name callwarden --------------------------------

def _callwarden_names(tree: ast.Module, glue: dict[str, set[str]]) -> set[str]:
    """The names the file's imports bind from callwarden, or of glue from a host module."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in stmt.names
                      if a.name.split(".")[0] == "callwarden"}
        elif isinstance(stmt, ast.ImportFrom) and stmt.module:
            top = stmt.module.split(".")[0]
            names |= {a.asname or a.name for a in stmt.names
                      if top == "callwarden" or a.name in glue.get(stmt.module, set())}
    return names


def _own_statements(stmts: list[ast.stmt], names: set[str], source: list[str],
                    skip: set[int]) -> Iterator[tuple[ast.stmt, int]]:
    """Each statement (at any depth) that names one of ``names``, with its counted lines."""
    for stmt in stmts:
        if _is_future(stmt):
            continue
        header, bodies = _header(stmt)
        imports = isinstance(stmt, ast.Import | ast.ImportFrom)
        if (_bound(stmt) if imports else _named(header)) & names:
            yield stmt, _counted(source, _start(stmt), _header_end(stmt, bodies), skip)
        for body in bodies:
            yield from _own_statements(body, names, source, skip)


# -- glue Python files: every statement, by part ------------------------------------------

def _parts_of(tree: ast.Module) -> dict[int, set[str]]:
    """Each top-level statement's parts (by ``id``), by the rule in the module's docstring."""
    listed = {name: part for part, names in PARTS.items() for name in names}
    stmts = [s for s in tree.body if not _is_future(s)]
    imports = [s for s in stmts if isinstance(s, ast.Import | ast.ImportFrom)]
    own = {id(s): {listed[n] for n in _bound(s) if n in listed} or {FIRST}
           for s in stmts if s not in imports}
    out: dict[int, set[str]] = {}
    for stmt in stmts:
        if stmt in imports:
            parts: set[str] = set()
            for name in _bound(stmt):
                users = [own[id(s)] for s in stmts if s not in imports and name in _named([s])]
                parts |= {FIRST} if not users or any(FIRST in u for u in users) \
                    else set().union(*users)
            out[id(stmt)] = parts
        else:
            parts = set(own[id(stmt)])
            if FIRST in parts:  # a line the host edits for a next kind counts for it too
                parts |= {listed[n] for n in _named([stmt]) - _bound(stmt)
                          if n in listed and not listed[n].startswith(OPTIONAL)}
            out[id(stmt)] = parts
    return out


# -- files ------------------------------------------------------------------------------------

def _python(path: Path, role: Role, count: Count, glue: dict[str, set[str]]) -> set[str]:
    """Count a Python file; the top-level names it makes callwarden's (for other files)."""
    text = path.read_text(encoding="utf-8")
    source, tree = text.splitlines(), ast.parse(text)
    skip = _docstring_lines(tree)
    if role == "glue":
        parts = _parts_of(tree)
        names: set[str] = set()
        for stmt in tree.body:
            if _is_future(stmt):
                continue
            n = _counted(source, _start(stmt), stmt.end_lineno or stmt.lineno, skip)
            for part in parts[id(stmt)]:
                count.add(part, n)
            names |= _bound(stmt)
        return names
    names = _callwarden_names(tree, glue)
    made: set[str] = set()
    for stmt, n in _own_statements(tree.body, names, source, skip):
        count.add(FIRST, n)
        if stmt in tree.body:
            made |= _bound(stmt)
    return made


def _text(path: Path, role: Role, count: Count) -> None:
    comment = "--" if path.suffix == ".sql" else "#"
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text or text.startswith(comment):
            continue
        if role == "glue" or "callwarden" in text.lower():
            count.add(FIRST, 1)


def count_host(host: Path = HOST) -> list[Count]:
    """Every listed file's count (a file absent from ``host`` counts nothing); a file of
    ``host`` that :data:`FILES` does not list is a ``ValueError``."""
    found = {p.relative_to(host).as_posix() for p in host.rglob("*")
             if p.is_file() and not any(part.startswith((".", "__")) for part in
                                        p.relative_to(host).parts)}
    unlisted = sorted(found - set(FILES))
    if unlisted:
        raise ValueError(f"{host}: files the count does not classify: {', '.join(unlisted)}")
    counts = {name: Count(name, role, why) for name, (role, why) in FILES.items()}
    glue: dict[str, set[str]] = {}
    # glue files first, then own ones: a name a file makes callwarden's is known to the next
    order = sorted(FILES, key=lambda name: (FILES[name][0] != "glue", name))
    for _ in range(2):  # twice: a module may import glue from one read after it
        for name in order:
            path = host / name
            counts[name] = count = Count(name, *FILES[name])
            if not path.is_file():
                continue
            if path.suffix == ".py":
                glue[path.stem] = _python(path, FILES[name][0], count, glue)
            else:
                _text(path, FILES[name][0], count)
    return [counts[name] for name in FILES]


def totals(counts: list[Count]) -> dict[str, int]:
    """Lines per part over every file: the first kind, each next kind, each optional part."""
    out = {FIRST: 0, **dict.fromkeys(PARTS, 0)}
    for c in counts:
        for part, n in c.lines.items():
            out[part] += n
    return out


# -- output ------------------------------------------------------------------------------------

def markdown(counts: list[Count]) -> str:
    """The table docs/embedding.md shows (tests/unit/test_glue_count.py keeps them equal)."""
    parts = [FIRST, *PARTS]
    rows = ["| file | what it is to the host | " + " | ".join(parts) + " |",
            "|---|---|" + "---:|" * len(parts)]
    for c in counts:
        cells = [str(c.lines.get(p, 0)) for p in parts]
        rows.append(f"| `{c.path}` | {c.role}: {c.why} | " + " | ".join(cells) + " |")
    total = totals(counts)
    rows.append("| **total** | | " + " | ".join(f"**{total[p]}**" for p in parts) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("host", nargs="?", type=Path, default=HOST)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--markdown", action="store_true", help="the table of the docs")
    shown.add_argument("--json", action="store_true", help="the totals and each file's")
    args = parser.parse_args(argv)
    counts = count_host(args.host)
    if args.json:
        print(json.dumps({"totals": totals(counts),
                          "files": {c.path: c.lines for c in counts}}, indent=2))
    elif args.markdown:
        print(markdown(counts), end="")
    else:
        parts = [FIRST, *PARTS]
        width = max(len(c.path) for c in counts)
        print(f"{'file':<{width}}  {'role':<4}  " + "  ".join(parts))
        for c in counts:
            print(f"{c.path:<{width}}  {c.role:<4}  " + "  ".join(
                f"{c.lines.get(p, 0):>{len(p)}}" for p in parts))
        total = totals(counts)
        print(f"{'total':<{width}}        " + "  ".join(f"{total[p]:>{len(p)}}" for p in parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
