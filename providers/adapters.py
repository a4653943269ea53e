"""A host's own providers, found where every actor finds them: the host's adapters.

A host that calls a provider callwarden does not ship (or calls a built-in one with its own
client) describes it as a :class:`~callwarden.providers.registry.Provider` — the kinds it
serves, with their thresholds, media hosts and result-URL lifetimes, and a factory of the
client that creates and polls its tasks — and makes it findable in one of two ways:

* an entry point in the group ``callwarden.providers`` of the host's package
  (``pyproject.toml``: ``[project.entry-points."callwarden.providers"] acme =
  "acme_app.providers:ACME"``), found by every process where the package is installed;
* the setting ``CALLWARDEN_PROVIDERS``: comma-separated ``module:attr`` references
  (``acme_app.providers:ACME``), imported from the process's path.

The object named is a ``Provider``, an iterable of them, or a callable returning either.
:func:`load_adapters` registers them all (once per source, so calling it again is cheap);
the worker, the reconciler, ``serve``, the Celery and arq processes and
``callwarden.config.provider_settings`` call it before they read their settings, so a
host's kind is known on every path: the runner creates and polls through the host's
client, the reconciler and webhook-triggered polls recover through it. A source that does
not load, or holds something that is not a provider, is an
:class:`~callwarden.providers.errors.AdapterError` naming it, and nothing of that source is
registered.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from functools import cache, partial
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from callwarden.providers.errors import AdapterError
from callwarden.providers.kinds import KINDS
from callwarden.providers.registry import PROVIDERS, WEBHOOKS, Provider, is_builtin, register

__all__ = ["GROUP", "SETTING", "load_adapters", "providers_in"]

#: The entry-point group a host's package declares its providers in.
GROUP = "callwarden.providers"
#: The setting (environment variable) naming providers as ``module:attr``, comma-separated.
SETTING = "CALLWARDEN_PROVIDERS"

_LOADED: set[str] = set()
V = TypeVar("V")


def _import(ref: str) -> object:
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise AdapterError(f"{SETTING}: {ref!r} is not module:attr")
    target: object = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def providers_in(obj: object, source: str) -> list[Provider]:
    """The providers ``obj`` holds: itself, each of an iterable, or what a callable
    returns; :class:`AdapterError` naming ``source`` for anything else."""
    if callable(obj) and not isinstance(obj, Provider | type):
        obj = obj()
    if isinstance(obj, Provider):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes | Mapping):
        found = list(obj)
        wrong = [type(item).__name__ for item in found if not isinstance(item, Provider)]
        if not wrong and found:
            return found
    raise AdapterError(f"{source}: expected a callwarden Provider, an iterable of them or a "
                       f"callable returning them; got {type(obj).__name__}")


@cache
def _entry_points() -> tuple[EntryPoint, ...]:
    """The group's entry points, read once per process (reading them scans every
    installed distribution: milliseconds)."""
    return tuple(entry_points(group=GROUP))


def _sources(env: Mapping[str, str]) -> list[tuple[str, Callable[[], object]]]:
    found: list[tuple[str, Callable[[], object]]] = [
        (f"entry point {ep.name} = {ep.value} (group {GROUP})", ep.load)
        for ep in _entry_points()]
    for ref in (r.strip() for r in env.get(SETTING, "").split(",")):
        if ref:
            found.append((f"{SETTING} {ref}", partial(_import, ref)))
    return found


def _restore(table: dict[str, V], saved: dict[str, V]) -> None:
    table.clear()
    table.update(saved)


def _register_all(providers: list[Provider], source: str) -> None:
    """Register every one of ``providers`` or none (the registry is put back). A name
    another host provider already holds is refused: two adapters for one provider (an
    entry point and the setting naming different objects) would otherwise replace each
    other silently, in an order nobody chose."""
    kinds, registered, hooks = dict(KINDS), dict(PROVIDERS), dict(WEBHOOKS)
    try:
        for provider in providers:
            held = PROVIDERS.get(provider.name)
            if held is not None and held is not provider and not is_builtin(held):
                raise AdapterError(f"provider {provider.name!r} is already registered by "
                                   "another adapter")
            register(provider)
    except Exception as exc:
        _restore(KINDS, kinds)
        _restore(PROVIDERS, registered)
        _restore(WEBHOOKS, hooks)
        if isinstance(exc, AdapterError):
            raise AdapterError(f"{source}: {exc}") from exc
        raise AdapterError(f"{source}: cannot register it: {type(exc).__name__}: "
                           f"{exc}") from exc


def load_adapters(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Register the host's providers from the entry-point group and ``CALLWARDEN_PROVIDERS``
    in ``env`` (``os.environ`` by default); the sources loaded by this call (one already
    loaded in this process is not loaded again)."""
    loaded = []
    for source, load in _sources(os.environ if env is None else env):
        if source in _LOADED:
            continue
        try:
            providers = providers_in(load(), source)  # the host's code runs here
        except AdapterError:
            raise
        except Exception as exc:  # any failure of the host's module or factory
            raise AdapterError(f"{source}: cannot load it: {type(exc).__name__}: "
                               f"{exc}") from exc
        _register_all(providers, source)
        _LOADED.add(source)
        loaded.append(source)
    return tuple(loaded)
