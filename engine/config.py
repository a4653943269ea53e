"""One way every actor reads its settings: defaults < file < environment, validated.

A settings struct (``ReconcileConfig``, ``CallConfig``, ``WebhookConfig``) declares its
fields and defaults and validates itself in ``__post_init__``; :func:`load` fills it:

* the file (``--config``, TOML or JSON) holds one table per actor — ``[reconcile]``,
  ``[calls]``, ``[webhooks]``, ``[serve]`` (the service's listeners) — so one file can
  configure a whole deployment. A *flat* file (none of those tables) is split by name:
  each actor takes the settings that are its own (its struct's fields, :func:`register`
  ed by the module that defines it), and a name that is no registered actor's setting is
  an error (a typo never passes silently);
* the file is ``--config`` where a command takes one, else ``CALLWARDEN_CONFIG`` (a path):
  set it once for every process of a deployment — workers, queue processes, the
  reconciler, ``serve``, the host's own-call code — and they all read the same file;
* the environment overrides the file: ``<PREFIX><FIELD>`` (``CALLWARDEN_RECONCILE_BATCH_SIZE``),
  and for a per-kind map ``<PREFIX><MAP>_<KIND>`` with the kind's ``-`` spelled ``_``
  (``CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD=600``); a list field is comma-separated.

Every problem is a :class:`~callwarden.errors.ConfigError` naming the setting and its source.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args, get_origin

import msgspec

from callwarden.errors import ConfigError
from callwarden.providers.base import ProviderSettings
from callwarden.providers.errors import AdapterError
from callwarden.providers.kinds import KINDS
from callwarden.rules.spelling import did_you_mean

if TYPE_CHECKING:
    from callwarden.providers.storage import MediaStore

__all__ = ["CONFIG_VAR", "MEDIA_SETTINGS", "SECTIONS", "TABLES", "config_path", "configured_media",
           "load", "load_providers", "named_media", "provider_settings", "read_section",
           "register"]

T = TypeVar("T", bound=msgspec.Struct)
SECTIONS = ("reconcile", "calls", "webhooks", "serve")
#: Tables beside the actors' that no actor's struct reads: ``[limits.<account>]``, the
#: provider accounts' admission limits (:mod:`callwarden.calls.limits`).
TABLES = (*SECTIONS, "limits")
#: The settings file every actor reads when it is given none (``--config`` wins).
CONFIG_VAR = "CALLWARDEN_CONFIG"
#: section -> its settings struct's field names (:func:`register`): how a flat file is split.
_FIELDS: dict[str, frozenset[str]] = {}


def config_path(given: Path | None, env: Mapping[str, str]) -> Path | None:
    """The settings file: ``given`` (a command's ``--config``), else ``CALLWARDEN_CONFIG``
    in ``env``, else none."""
    if given is not None:
        return given
    named = env.get(CONFIG_VAR, "").strip()
    return Path(named) if named else None


def register(section: str, cls: type[msgspec.Struct]) -> None:
    """Declare ``cls`` the settings of ``section`` (called where the struct is defined)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r} (known: {', '.join(SECTIONS)})")
    _FIELDS[section] = frozenset(f.name for f in msgspec.structs.fields(cls))


def read_section(path: Path, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a TOML or JSON file (the whole file if it has none of
    the actors' tables)."""
    return _read(path, section)[0]


def _read(path: Path, section: str) -> tuple[dict[str, Any], str]:
    """The table and how errors name it (``FILE [section]``, or ``FILE``)."""
    try:
        text = path.read_bytes().decode("utf-8")  # as written: no newline translation
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError, RecursionError) as exc:  # TOML/JSON errors are ValueErrors
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a table/object")
    if not any(name in data for name in TABLES):
        return _flat_share(data, section, path), str(path)
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        named = ", ".join(f"[{u}]{did_you_mean(u, TABLES, show='[{}]'.format)}"
                          for u in unknown)
        raise ConfigError(f"config {path}: unknown table(s) {named} "
                          f"(known: {', '.join(TABLES)})")
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config {path}: [{section}] must be a table")
    return dict(table), f"{path} [{section}]"


def _flat_share(data: dict[str, Any], section: str, path: Path) -> dict[str, Any]:
    """``section``'s share of a flat file: its own settings, without those another
    registered actor owns (a name no actor owns is left in, to fail as unknown)."""
    own = _FIELDS.get(section)
    if own is None:
        return data
    others = frozenset().union(*(f for s, f in _FIELDS.items() if s != section))
    return {k: v for k, v in data.items() if k in own or k not in others}


def _kind(name: str, key: str) -> str:
    by_env = {kind.upper().replace("-", "_"): kind for kind in KINDS}  # a host's kinds too
    kind = by_env.get(key) or by_env.get(key.removesuffix("_S"))
    if kind is None:
        variable = name.removesuffix(key)  # the suggestion is shown as a whole variable
        raise ConfigError(f"{name}: unknown provider_kind"
                          + did_you_mean(key, by_env, show=lambda k: variable + k))
    return kind


Entry = tuple[str, str | None]
"""A setting: a field, or one kind's value in a per-kind map field."""


def _from_env(cls: type[msgspec.Struct], env: Mapping[str, str], prefix: str,
              maps: Mapping[str, str]) -> tuple[dict[str, Any], dict[Entry, str]]:
    """The ``prefix`` variables as settings, and the variable that set each one."""
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    out: dict[str, Any] = {}
    names: dict[Entry, str] = {}
    for name, value in sorted(env.items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        field = rest.lower()
        if field in fields:
            listed = isinstance(fields[field].default, tuple)
            out[field] = tuple(v.strip() for v in value.split(",") if v.strip()) \
                if listed else value
            names[(field, None)] = name
            continue
        for env_map, map_field in maps.items():
            if rest.startswith(env_map + "_"):
                kind = _kind(name, rest[len(env_map) + 1:])
                table = out.setdefault(map_field, {})
                if isinstance(table, dict):  # else the whole field's variable is reported
                    table[kind] = value
                    names[(map_field, kind)] = name
                break
        else:
            raise ConfigError(f"{name}: no such setting" + did_you_mean(
                name, _env_names(prefix, fields, maps), prefix=prefix))
    return out, names


def _env_names(prefix: str, fields: Iterable[str], maps: Mapping[str, str]) -> list[str]:
    """Every variable under ``prefix``: a field's, and each kind's of a per-kind map."""
    kinds = [kind.upper().replace("-", "_") for kind in KINDS]
    return [*(prefix + field.upper() for field in fields),
            *(f"{prefix}{env_map}_{kind}" for env_map in maps for kind in kinds)]


def _is_map(info: msgspec.structs.FieldInfo | None) -> bool:
    return info is not None and get_origin(info.type) in (Mapping, dict)


def _layer(merged: dict[str, Any], where: dict[Entry, str], values: Mapping[str, Any],
           fields: Mapping[str, msgspec.structs.FieldInfo], name: Callable[[Entry], str]
           ) -> None:
    """Put one layer's ``values`` over ``merged``, a per-kind map entry by entry;
    ``where[entry]``: what errors call the setting's source."""
    for field, value in values.items():
        if _is_map(fields.get(field)) and isinstance(value, Mapping):
            if not isinstance(merged.setdefault(field, {}), dict):
                continue  # the lower layer's non-table is reported as it is
            for kind, item in value.items():
                merged[field][kind] = item
                where[(field, kind)] = name((field, kind))
            continue
        merged[field] = value
        for entry in [e for e in where if e[0] == field]:
            del where[entry]
        where[(field, None)] = name((field, None))


def _without(merged: dict[str, Any], entry: Entry) -> dict[str, Any]:
    field, kind = entry
    out = dict(merged)
    if kind is None:
        del out[field]
    else:
        out[field] = {k: v for k, v in out[field].items() if k != kind}
    return out


def _problem(cls: type[T], merged: dict[str, Any]) -> str | None:
    try:
        msgspec.convert(merged, cls, strict=False)
    except (ConfigError, msgspec.ValidationError) as exc:
        return str(exc)
    return None


def _a_number(value: Any) -> bool:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return isinstance(value, int | float)


def _check_each(fields: Mapping[str, msgspec.structs.FieldInfo], merged: dict[str, Any],
                where: dict[Entry, str], section: str, known: Iterable[str]) -> None:
    """Each setting alone: a known name (else the ``known`` one it is closest to), a value
    of its field's type, a finite number, a time written as a time (msgspec would read
    ``2026`` as seconds since 1970)."""
    for (field, kind), source in where.items():
        info = fields.get(field)
        if info is None:
            hint = did_you_mean(field, known)
            if not hint and isinstance(merged[field], Mapping):  # a flat file's misspelt table
                hint = did_you_mean(field, SECTIONS, show="[{}]".format)
            raise ConfigError(f"invalid {section} configuration: {source}: no such setting"
                              + hint)
        tp, value = info.type, merged[field]
        if kind is not None:
            tp, value = get_args(info.type)[1], value[kind]
        try:
            converted = msgspec.convert(value, tp, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid {section} configuration: {source}: {exc}") from exc
        if isinstance(converted, float) and not math.isfinite(converted):
            raise ConfigError(f"invalid {section} configuration: {source}: "
                              f"must be a finite number, got {converted}")
        if isinstance(converted, datetime) and _a_number(value):
            raise ConfigError(f"invalid {section} configuration: {source}: want a time "
                              f"(e.g. 2026-05-19T00:00:00Z), got {value!r}")


def load(cls: type[T], *, path: Path | None, env: Mapping[str, str], prefix: str,
         section: str, maps: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None,
         origins: Mapping[str, str] | None = None) -> T:
    """``cls`` from its defaults, ``path``'s ``[section]`` (``None``: the file
    ``CALLWARDEN_CONFIG`` names, if any: :func:`config_path`), the ``prefix`` variables of
    ``env`` (``maps``: env name -> per-kind map field, e.g. ``{"THRESHOLD": "thresholds_s"}``)
    and finally ``overrides`` (a command's flags; ``origins`` names each one's source in
    errors, e.g. ``{"finalize_lease_s": "--finalize-lease"}``); validated. An error names
    the setting at fault by its source: ``FILE [section] key``, the variable, the flag.
    The host's providers are registered first (:func:`load_providers`), so a per-kind
    setting may name a host's kind."""
    load_providers(env)
    path = config_path(path, env)
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    merged: dict[str, Any] = {}
    where: dict[Entry, str] = {}
    known: set[str] = set(fields)
    if path is not None:
        table, label = _read(path, section)
        if label == str(path):  # a flat file: a typo may be any actor's setting
            known = known.union(*_FIELDS.values())
        _layer(merged, where, table, fields,
               lambda e: f"{label} {e[0]}" + (f".{e[1]}" if e[1] is not None else ""))
    values, names = _from_env(cls, env, prefix, maps or {})
    _layer(merged, where, values, fields, names.__getitem__)
    named = dict(origins or {})
    _layer(merged, where, dict(overrides or {}), fields,
           lambda e: named.get(e[0], f"{e[0]} (given by the caller)"))
    _check_each(fields, merged, where, section, known)
    try:
        return msgspec.convert(merged, cls, strict=False)
    except (ConfigError, msgspec.ValidationError) as exc:  # the struct's own checks
        # the settings at fault: those without which this problem goes away
        culprits = [source for entry, source in where.items()
                    if _problem(cls, _without(merged, entry)) != str(exc)]
        raise ConfigError(f"invalid {section} configuration: {exc}"
                          + (f" (set by {'; '.join(culprits)})" if culprits else "")) from exc


def load_providers(env: Mapping[str, str]) -> tuple[str, ...]:
    """Register the host's providers (:func:`callwarden.providers.adapters.load_adapters`:
    its entry points and ``CALLWARDEN_PROVIDERS`` in ``env``); one that does not load is a
    :class:`ConfigError` naming it."""
    # imported here: the registry brings the clients (aiohttp), and pure modules read
    # their settings structs from this module
    from callwarden.providers.adapters import load_adapters

    try:
        return load_adapters(env)
    except AdapterError as exc:
        raise ConfigError(f"provider adapter: {exc}") from exc


def provider_settings(env: Mapping[str, str]) -> ProviderSettings:
    """The providers' endpoints, keys and answer limit from ``env``
    (:meth:`ProviderSettings.from_env`), a host's registered providers included
    (:func:`load_providers` first), each read under the host's own variable names where
    its ``Provider`` gives them and callwarden's are unset; a bad value is a
    :class:`ConfigError` naming its variable."""
    from callwarden.providers.registry import host_providers, host_variables

    load_providers(env)
    try:
        return ProviderSettings.from_env(env, hosts=host_providers(), names=host_variables())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


#: The settings that name a media store (one of them, or ``--media-dir``, is required).
MEDIA_SETTINGS = ("CALLWARDEN_MEDIA_DIR", "CALLWARDEN_MEDIA_S3_BUCKET")


def configured_media(env: Mapping[str, str], media_dir: Path | None, command: str, *,
                     flag: str | None = "--media-dir") -> MediaStore:
    """The store ``env`` (or ``--media-dir``) names; :class:`ConfigError` naming the
    settings (and ``flag``, the command's own option, if it has one) when none does and a
    registered kind's results may be files."""
    if media_dir is not None:
        env = {**env, "CALLWARDEN_MEDIA_DIR": str(media_dir)}
    store = named_media(env)
    if store is not None:
        return store
    media_kinds = sorted(k for k, spec in KINDS.items() if spec.media_results)
    if media_kinds:
        shown = ", ".join(media_kinds[:3]) + (", ..." if len(media_kinds) > 3 else "")
        raise ConfigError(
            f"{command}: no media store configured: set CALLWARDEN_MEDIA_DIR (a folder the "
            f"host's app reads) or CALLWARDEN_MEDIA_S3_BUCKET"
            f"{f', or pass {flag}' if flag else ''}; calls of {shown} complete with files, "
            f"and this process would store them")
    return _media(env)  # text results only: never written


def named_media(env: Mapping[str, str]) -> MediaStore | None:
    """The store ``env`` names (``None``: none is named; nothing is guessed)."""
    if not any(env.get(name, "").strip() for name in MEDIA_SETTINGS):
        return None
    return _media(env)


def _media(env: Mapping[str, str]) -> MediaStore:
    """:func:`~callwarden.providers.storage.media_from_env`; a bad value is a
    :class:`ConfigError` naming its variable (``CALLWARDEN_MEDIA_BASE_URL``)."""
    from callwarden.providers.storage import media_from_env

    try:
        return media_from_env(env, default_dir=Path("."))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
