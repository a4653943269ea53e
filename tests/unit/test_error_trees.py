"""The error trees drawn in ``callwarden.errors`` and ``callwarden.providers.errors`` are the
classes the modules define: every class is drawn, under its real parent, and nothing drawn
is missing (a new error class that the drawing forgets fails here). And there is one root
(issue 43, item 2): every exception class callwarden defines is a ``CallwardenError``, but
the few that never leave the module that raises them (control flow, named with the
reason), and the tree in ``callwarden.errors`` names every public one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import callwarden
from callwarden import errors
from callwarden.errors import CallwardenError

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
                   "callwarden.events.codec", "callwarden.projections.columns",
                   "callwarden.projections.timeline", "callwarden.providers.errors",
                   "callwarden.providers.webhooks", "callwarden.providers.raw",
                   "callwarden.providers.storage", "callwarden.providers.simulator.anthropic",
                   "callwarden.service.dashboard.calls", "callwarden.service.dashboard.bulk"):
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


#: callwarden's packages, each walked from its own folder (the top-level folders).
PACKAGES = ("callwarden", "callwarden.events", "callwarden.projections",
            "callwarden.providers", "callwarden.migrations")
#: Modules that cannot be imported bare (besides each ``__main__``, which runs a command):
#: a queue app that reads its settings at import.
SKIP = {"callwarden.demo.arq_app", "callwarden.demo.celery_app"}
#: Exceptions used as control flow inside one module, caught there, never raised to a host.
INTERNAL = {
    "callwarden.calls.finalize._GiveUp": "the finalizer's early exit, caught by itself",
    "callwarden.database.write._NotAppended": "rolls back the Citus append, caught there",
    "callwarden.service.webhooks.Reject": "an HTTP answer (4xx) the receiver writes",
    "callwarden.service.webhooks.Reply": "an HTTP answer the receiver writes",
    "callwarden.providers.simulator.replicate._Problem": "the simulator's problem+json "
                                                         "answer, written by its handler",
}


def _modules() -> list[ModuleType]:
    seen: dict[str, ModuleType] = {}
    for top in PACKAGES:
        package = importlib.import_module(top)
        seen[top] = package
        for info in pkgutil.walk_packages(package.__path__, f"{top}."):
            if (info.name not in SKIP and not info.name.endswith(".__main__")
                    and info.name not in seen):
                seen[info.name] = importlib.import_module(info.name)
    return list(seen.values())


def _exception_classes() -> dict[str, type[BaseException]]:
    return {f"{m.__name__}.{name}": cls for m in _modules()
            for name, cls in vars(m).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException)
            and cls.__module__ == m.__name__}


def test_every_error_class_hangs_from_the_one_root() -> None:
    found = _exception_classes()
    assert len(found) > 40  # the walk reached every package (not just the engine's)
    outside = sorted(name for name, cls in found.items()
                     if not issubclass(cls, CallwardenError) and name not in INTERNAL)
    assert outside == []
    assert set(INTERNAL) <= set(found)  # (an entry for a class that is gone is dropped)


def test_the_drawn_tree_names_every_public_error() -> None:
    tree = errors.__doc__ or ""
    public = sorted(name.rsplit(".", 1)[1] for name in _exception_classes()
                    if name not in INTERNAL and not name.rsplit(".", 1)[1].startswith("_")
                    and not name.startswith("callwarden.providers.errors."))
    missing = [name for name in public if name not in tree]
    assert missing == []
    assert callwarden.CallwardenError is CallwardenError
