"""Field-by-field shape comparison: is the simulator's answer a shape the live API sends?

:func:`shape_of` merges one or more recorded bodies of the same answer (the variants
recordings show: an older and a newer serializer, a key present in some answers only) into
a :class:`Shape`: per object, the keys that appear in *every* variant (required), those
that appear in *some* (allowed), and per key the JSON types seen (``null`` is a type).
:func:`diff` lists every way a simulated body departs from it: a key the live API does not
send ("extra"), a key it always sends ("missing"), a value of a type it never sent
("type"), recursively through objects and list items. Paths given as ``opaque`` are only
type-checked (an echoed ``input``, a JSON-in-a-string ``param``): their content is the
request's, not the provider's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Shape", "diff", "json_type", "shape_of"]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r}")


@dataclass
class Shape:
    types: set[str] = field(default_factory=set)
    required: set[str] | None = None  # keys in every object variant (None: none seen)
    keys: dict[str, Shape] = field(default_factory=dict)  # every key seen, with its shape
    items: Shape | None = None  # the merged shape of list items


def _merge(shape: Shape, value: Any) -> None:
    kind = json_type(value)
    shape.types.add(kind)
    if kind == "object":
        present = set(value)
        shape.required = present if shape.required is None else shape.required & present
        for key, item in value.items():
            _merge(shape.keys.setdefault(key, Shape()), item)
    elif kind == "array":
        for item in value:
            if shape.items is None:
                shape.items = Shape()
            _merge(shape.items, item)


def shape_of(*variants: Any) -> Shape:
    """The merged shape of recorded bodies of one answer."""
    shape = Shape()
    for v in variants:
        _merge(shape, v)
    return shape


def _opaque(path: str, opaque: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[")
               for p in opaque)


def diff(shape: Shape, value: Any, *, opaque: Sequence[str] = (), path: str = "$"
         ) -> list[str]:
    """Every departure of ``value`` from ``shape`` (empty: the same shape)."""
    kind = json_type(value)
    if kind not in shape.types:
        return [f"{path}: type {kind}, recorded {sorted(shape.types)}"]
    if _opaque(path, opaque):
        return []
    out: list[str] = []
    if kind == "object":
        for key in sorted(set(value) - set(shape.keys)):
            out.append(f"{path}.{key}: extra key (not in any recording)")
        for key in sorted((shape.required or set()) - set(value)):
            out.append(f"{path}.{key}: missing (in every recording)")
        for key in sorted(set(value) & set(shape.keys)):
            out += diff(shape.keys[key], value[key], opaque=opaque, path=f"{path}.{key}")
    elif kind == "array" and shape.items is not None:
        for i, item in enumerate(value):
            out += diff(shape.items, item, opaque=opaque, path=f"{path}[{i}]")
    return out
