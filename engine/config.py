"""One way every actor reads its settings: defaults < file < environment, validated.

A settings struct (``ReconcileConfig``, ``CallConfig``, ``WebhookConfig``) declares its
fields and defaults and validates itself in ``__post_init__``; :func:`load` fills it:

* the file (``--config``, TOML or JSON) holds one table per actor — ``[reconcile]``,
  ``[calls]``, ``[webhooks]`` — so one file can configure a whole deployment (a file with
  no tables at all is read as the one actor's settings);
* the environment overrides the file: ``<PREFIX><FIELD>`` (``CALLWARDEN_RECONCILE_BATCH_SIZE``),
  and for a per-kind map ``<PREFIX><MAP>_<KIND>`` with the kind's ``-`` spelled ``_``
  (``CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD=600``); a list field is comma-separated.

Every problem is a :class:`~engine.errors.ConfigError` naming the setting and its source.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from engine.errors import ConfigError
from providers.kinds import KINDS

__all__ = ["SECTIONS", "load", "read_section"]

T = TypeVar("T", bound=msgspec.Struct)
SECTIONS = ("reconcile", "calls", "webhooks")
_ENV_KIND = {name.upper().replace("-", "_"): name for name in KINDS}


def read_section(path: Path, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a TOML or JSON file (the whole file if it has none of
    the actors' tables)."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a table/object")
    if not any(name in data for name in SECTIONS):
        return data
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"config {path}: unknown table(s) {', '.join(unknown)} "
                          f"(known: {', '.join(SECTIONS)})")
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config {path}: [{section}] must be a table")
    return dict(table)


def _kind(name: str, key: str) -> str:
    kind = _ENV_KIND.get(key) or _ENV_KIND.get(key.removesuffix("_S"))
    if kind is None:
        raise ConfigError(f"{name}: unknown provider_kind")
    return kind


def _from_env(cls: type[msgspec.Struct], env: Mapping[str, str], prefix: str,
              maps: Mapping[str, str]) -> dict[str, Any]:
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    out: dict[str, Any] = {}
    for name, value in sorted(env.items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        field = rest.lower()
        if field in fields:
            listed = isinstance(fields[field].default, tuple)
            out[field] = tuple(v.strip() for v in value.split(",") if v.strip()) \
                if listed else value
            continue
        for env_map, map_field in maps.items():
            if rest.startswith(env_map + "_"):
                out.setdefault(map_field, {})[_kind(name, rest[len(env_map) + 1:])] = value
                break
        else:
            raise ConfigError(f"{name}: no such setting")
    return out


def load(cls: type[T], *, path: Path | None, env: Mapping[str, str], prefix: str,
         section: str, maps: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> T:
    """``cls`` from its defaults, ``path``'s ``[section]``, the ``prefix`` variables of
    ``env`` (``maps``: env name -> per-kind map field, e.g. ``{"THRESHOLD": "thresholds_s"}``)
    and finally ``overrides`` (a command's flags); validated."""
    merged: dict[str, Any] = read_section(path, section) if path is not None else {}
    for layer in (_from_env(cls, env, prefix, maps or {}), dict(overrides or {})):
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    try:
        return msgspec.convert(merged, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid {section} configuration: {exc}") from exc
