"""The error trees drawn in ``callwarden.errors`` and ``callwarden.providers.errors`` are the
classes the modules define: every class is drawn, under its real parent, and nothing drawn
is missing (a new error class that the drawing forgets fails here)."""

from __future__ import annotations

import importlib
import re

import pytest

TREE_LINE = re.compile(r"^(?P<indent>[\s│]*)(?:[├└]── )?(?:[a-z_]+\.)*(?P<name>[A-Z]\w+)\b")


def drawn(doc: str, prefix: str = "") -> dict[str, str | None]:
    """name -> drawn parent, from the ``::`` block of a module docstring (the tree's own
    columns: a name's parent is the nearest line above it drawn one level shallower)."""
    block = doc.split("::", 1)[1]
    out: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip() or line.strip().startswith("``"):
            continue
        m = TREE_LINE.match(line)
        if m is None:
            continue
        if "──" not in line and line[:len(m["indent"])].strip(" │"):
            continue
        depth = len(m["indent"]) + (4 if "──" in line else 0)
        if "──" not in line and m["indent"].strip(" ") == "" and len(m["indent"]) > 4:
            continue  # a wrapped comment, not a node
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out[m["name"]] = stack[-1][1] if stack else None
        stack.append((depth, m["name"]))
    return out


def _find(name: str) -> type:
    """A class drawn in a tree but defined elsewhere (``callwarden.calls.own.OwnCallError``)."""
    for module in ("callwarden.calls.own", "callwarden.events.states",
                   "callwarden.events.codec"):
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type):
            return found
    raise AssertionError(f"{name} is drawn but defined nowhere")


@pytest.mark.parametrize(("module", "roots"), [
    ("callwarden.providers.errors", {"ProviderError", "StorageError", "SignatureError",
                                      "AdapterError"}),
    ("callwarden.errors", {"CallwardenError"}),
])
def test_every_error_class_is_drawn_under_its_parent(module: str, roots: set[str]) -> None:
    mod = importlib.import_module(module)
    assert mod.__doc__ is not None
    tree = drawn(mod.__doc__)
    defined = {name: cls for name, cls in vars(mod).items()
               if isinstance(cls, type) and issubclass(cls, BaseException)
               and cls.__module__ == module}
    assert set(defined) <= set(tree), set(defined) - set(tree)
    for name, parent in tree.items():  # what is drawn exists, under the parent drawn
        cls = getattr(mod, name, None) or _find(name)
        assert parent is None or cls.__mro__[1].__name__ == parent, (name, parent)
    for name, cls in defined.items():
        parent = tree[name]
        if name in roots:
            assert parent is None, name
        else:
            assert parent == cls.__mro__[1].__name__, (name, parent)
