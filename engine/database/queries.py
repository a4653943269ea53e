"""Named SQL queries, loaded once from the ``.sql`` files beside the code that runs them
(``engine/<package>/*.sql``, ``-- name: x`` headers; a name is defined once).

A ``-- fragment: x`` block is a piece of SQL written once and spliced into every query
that says ``{{x}}`` (the projection columns' ``SET`` list, shared by the append and the
rebuild); a query naming an unknown fragment fails at import."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from typing import LiteralString

__all__ = ["FRAGMENTS", "QUERIES", "fragment", "load_queries"]

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"^-- fragment: (\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"\{\{(\w+)\}\}")


def load_queries(text: str) -> dict[str, LiteralString]:
    """Split a ``.sql`` file into ``{name: statement}``."""
    parts = _HEADER.split(text)
    out: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise RuntimeError(f"query {name!r} defined twice in one file")
        # without comment lines and indentation: psycopg parses a statement once and
        # caches it only up to 4,096 bytes (the append grew past it: a parse per call)
        lines = [ln.strip() for ln in body.strip().splitlines()
                 if ln.strip() and not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


PACKAGES = ("database", "calls", "service", "replay", "queue", "demo")


def _fragments(text: str) -> tuple[str, dict[str, str]]:
    """``text`` without its ``-- fragment:`` blocks (each runs to the next header), and
    the fragments by name."""
    found: dict[str, str] = {}
    kept: list[str] = []
    blocks = re.split(r"^(?=-- (?:name|fragment): )", text, flags=re.MULTILINE)
    for block in blocks:
        m = _FRAGMENT.match(block)
        if m is None:
            kept.append(block)
            continue
        body = block[m.end():]
        found[m[1]] = "\n".join(ln.strip() for ln in body.splitlines()
                                if ln.strip() and not ln.lstrip().startswith("--"))
    return "".join(kept), found


def _splice(name: str, sql: str, fragments: dict[str, str]) -> LiteralString:
    """``sql`` with its fragments spliced in (a fragment may use another, to a depth of 4)."""
    def one(m: re.Match[str]) -> str:
        if m[1] not in fragments:
            raise RuntimeError(f"query {name!r} uses an unknown fragment {{{{{m[1]}}}}}")
        return fragments[m[1]]

    for _ in range(4):
        if _USE.search(sql) is None:
            break
        sql = _USE.sub(one, sql)
    else:
        if _USE.search(sql) is not None:
            raise RuntimeError(f"query {name!r}: fragments nested too deep")
    return sql  # text of our own .sql files, as every query


def _load_all() -> tuple[dict[str, LiteralString], dict[str, str]]:
    """Every package's queries, spliced, and the fragments they were spliced from."""
    out: dict[str, LiteralString] = {}
    texts: list[str] = []
    fragments: dict[str, str] = {}
    for package in PACKAGES:
        for entry in sorted(resources.files("callwarden").joinpath(package).iterdir(),
                            key=lambda e: e.name):
            if not entry.name.endswith(".sql"):
                continue
            text, found_fragments = _fragments(entry.read_text(encoding="utf-8"))
            fragments.update(found_fragments)
            texts.append(text)
    for text in texts:
        found = load_queries(text)
        twice = sorted(set(found) & set(out))
        if twice:
            raise RuntimeError(f"queries defined twice: {', '.join(twice)}")
        out.update({name: _splice(name, sql, fragments) for name, sql in found.items()})
    return out, fragments


def _shapes(loaded: tuple[dict[str, LiteralString], dict[str, str]]
            ) -> dict[str, LiteralString]:
    """Each append statement's own shape, so that Postgres keeps one generic plan for each
    and none carries a fence its events can never need (queries.sql, fragment
    ``append_upd``):

    - ``append_start`` is ``append_move`` without ``settled_fence`` (a start is fenced on
      version 0 and on the host's status, never on settled reservations, and settles
      nothing); on Citus ``append_upd_start_citus`` from ``append_upd_citus``;
    - every other append drops ``start_fence`` (only a start may find a task on the row);
    - ``append_completion`` (a ``Completed``, never a host's decision: ``write.append``
      checks it) fences on ``open_fence`` and writes ``seed_set_owned``: shorter, it fits
      psycopg's cache of converted queries (4 KB). ``append_completion_host_seed`` is the
      same with ``seed_set`` kept, for the rare call whose seed columns stay the host's (a
      legacy row the reconciler adopted: ``owns_seed`` false).

    A fragment a shape is derived from must be in its statement exactly once."""
    queries, fragments = loaded

    def text(fragment: str) -> str:
        return _splice(fragment, fragments[fragment], fragments)

    def swap(name: str, sql: str, fragment: str, by: str) -> LiteralString:
        if sql.count(text(fragment)) != 1:
            raise RuntimeError(f"{name} must splice {fragment} once")
        return sql.replace(text(fragment), by)

    out = dict(queries)
    for start, append in (("append_start", "append_move"),
                          ("append_upd_start_citus", "append_upd_citus")):
        out[start] = swap(start, queries[append], "settled_fence", "")
    out["append_start"] = _admitted(out["append_start"], text)
    for name in ("append_move", "append_event", "append_completion", "append_upd_citus"):
        out[name] = swap(name, queries[name], "start_fence", "")
    done = swap("append_completion", out["append_completion"], "host_fence",
                text("open_fence"))
    out["append_completion_host_seed"] = done
    out["append_completion"] = swap("append_completion", done, "seed_set",
                                    text("seed_set_owned"))
    return out


def _admitted(start: str, text: Callable[[str], str]) -> LiteralString:
    """``append_start`` with its admission (migrations/0018_admission.sql): the ``adm``
    CTE first, its fence beside ``start_fence``, and its answer's two columns last (on
    Citus ``admit_citus`` is a statement of its own, run first)."""
    head = text("append_ctes").splitlines()[0]  # the CTE of the update: WITH upd AS (
    fence, tail = text("start_fence"), "AS reservations"
    for part in (head, fence, tail):
        if start.count(part) != 1:
            raise RuntimeError(f"append_start must have {part!r} once")
    if not start.rstrip(" ;\n").endswith(tail):
        raise RuntimeError("append_start must end with its reservations column")
    return (start.rstrip(" ;\n")
            .replace(head, text("admit_cte").rstrip())
            .replace(fence, f"{fence}\n{text('admit_fence').strip()}")
            + f"\n{text('admit_cols').strip()}")


_LOADED = _load_all()
QUERIES: dict[str, LiteralString] = _shapes(_LOADED)
#: The fragments as written (comment lines dropped), before any is spliced into another.
FRAGMENTS: dict[str, str] = _LOADED[1]


def fragment(name: str) -> str:
    """The fragment ``name`` with the fragments it uses spliced in."""
    return _splice(name, FRAGMENTS[name], FRAGMENTS)
