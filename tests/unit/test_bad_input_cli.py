"""Bad input at the doors an operator uses (issue 15, item 6): config files, environment
variables and command-line arguments. Each property's docstring states the invariant it
proves. What is known is read from the code, so the tests follow it: the settings and
their types from the config structs (``msgspec.structs.fields``), the tables from
:data:`callwarden.config.SECTIONS`, the commands and their options from the ``callwarden``
parser. No database is touched: ``DATABASE_URL`` points at a closed port and only values
that must be refused before any connection are generated; each in-process run is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal, InvalidOperation
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args, get_origin

import msgspec
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from callwarden.calls.config import ENV_PREFIX as CALL_PREFIX
from callwarden.calls.config import CallConfig, load_call_config
from callwarden.cli.main import build_parser, main
from callwarden.config import SECTIONS
from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.reconciler.config import ENV_PREFIX as RECONCILE_PREFIX
from callwarden.reconciler.config import ReconcileConfig, load_config
from callwarden.service.app import ListenConfig, load_listen_config
from callwarden.service.webhooks import WebhookConfig, load_webhook_config

ROOT = Path(__file__).parents[2]
DEAD_DB = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1


# -- the actors' settings, from the code ----------------------------------------------------

class Actor(NamedTuple):
    struct: type[msgspec.Struct]
    load: Callable[[Path | None, Mapping[str, str]], msgspec.Struct]
    prefix: str
    maps: Mapping[str, str]  # env name -> per-kind map field (checked below)


ACTORS: dict[str, Actor] = {
    "reconcile": Actor(ReconcileConfig, load_config, RECONCILE_PREFIX,
                       {"THRESHOLD": "thresholds_s"}),
    "calls": Actor(CallConfig, load_call_config, CALL_PREFIX,
                   {"POLL_INTERVAL": "poll_interval_s", "POLL_BUDGET": "poll_budget_s",
                    "AMBIGUOUS_CREATE": "ambiguous_create_by_kind"}),
    "webhooks": Actor(WebhookConfig, load_webhook_config, "CALLWARDEN_WEBHOOK_", {}),
    "serve": Actor(ListenConfig, load_listen_config, "CALLWARDEN_SERVE_", {}),
}
FIELDS: dict[str, dict[str, Any]] = {
    section: {f.name: f.type for f in msgspec.structs.fields(actor.struct)}
    for section, actor in ACTORS.items()}
ALL_FIELDS = sorted({name for fields in FIELDS.values() for name in fields})
ENV_KIND = {kind.upper().replace("-", "_"): kind for kind in KINDS}


def test_the_tables_here_are_the_codes() -> None:
    """Every table the loader knows has an actor here, and each actor's environment
    prefix and per-kind variables really set its settings (so the properties below
    cannot silently test names the code no longer reads)."""
    assert set(ACTORS) == set(SECTIONS)
    for section, actor in ACTORS.items():
        scalar = next(n for n, tp in FIELDS[section].items() if tp in (int, float))
        loaded = actor.load(None, {actor.prefix + scalar.upper(): "7"})
        assert getattr(loaded, scalar) == 7, section
        for env_map, field in actor.maps.items():
            value: Any = "recreate" if "AMBIGUOUS" in env_map else 1.0
            loaded = actor.load(None, {f"{actor.prefix}{env_map}_KIE_STANDARD": str(value)})
            assert getattr(loaded, field) == {"kie-standard": value}, (section, env_map)


# -- an oracle for "exactly the values given" ----------------------------------------------

class Ok(NamedTuple):
    value: Any
    sure: bool  # False: a lenient conversion (a string read as a number...) the code may refuse


REJECT = None  # expected(...) is None: the value is not of the setting's type


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        with contextlib.suppress(InvalidOperation, ValueError):
            d = Decimal(value.strip())
            return d if d.is_finite() else None
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(value) if math.isfinite(value) else None
    return None


def expected(value: Any, tp: Any) -> Ok | None:
    """What a setting of type ``tp`` holds when given ``value`` (from a file or, as a
    string, from a variable); ``None``: it must be refused."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is float:
        d = _number(value)
        if d is None or not math.isfinite(float(d)):
            return REJECT
        return Ok(float(value) if isinstance(value, str) else float(d),
                  sure=isinstance(value, int | float))
    if tp is int:
        d = _number(value)
        if d is None or d != d.to_integral_value():
            return REJECT
        return Ok(int(d), sure=isinstance(value, int))
    if tp is str:
        return Ok(value, sure=True) if isinstance(value, str) else REJECT
    if tp is bool:  # msgspec's lax reading: true/false any case, 1/0 as number or text
        if isinstance(value, bool):
            return Ok(value, sure=True)
        if isinstance(value, int) and value in (0, 1):
            return Ok(bool(value), sure=True)
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return Ok(value.lower() in ("true", "1"), sure=False)
        return REJECT
    if tp is dt.datetime:
        if isinstance(value, dt.datetime):
            return Ok(value, sure=True)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return Ok(dt.datetime.fromisoformat(value.upper()), sure=False)
        return REJECT
    if origin is Literal:
        return Ok(value, sure=True) if isinstance(value, str) and value in args else REJECT
    if origin in (types.UnionType, typing.Union):  # X | None
        if value is None:
            return Ok(None, sure=True)
        if value == "null":
            return Ok(None, sure=False)
        (inner,) = (a for a in args if a is not type(None))
        return expected(value, inner)
    if origin is tuple:
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return Ok(tuple(value), sure=True)
        return REJECT
    if origin in (Mapping, dict):
        if not isinstance(value, dict):
            return REJECT
        items = {k: expected(v, args[1]) for k, v in value.items()}
        if any(v is None for v in items.values()):
            return REJECT
        return Ok({k: v.value for k, v in items.items() if v is not None},
                  sure=all(v is not None and v.sure for v in items.values()))
    raise AssertionError(f"no oracle for settings of type {tp}: teach this test")


def named(name: str, message: str) -> bool:
    """``message`` names ``name`` as a word (a key, a table, a variable, an option)."""
    return re.search(rf"(^|[\s\[(]){re.escape(name)}($|[\s.:,;)\]=])", message) is not None


# -- config files ---------------------------------------------------------------------------

def _toml_str(text: str) -> str:
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\'
                      else c for c in text)
    return f'"{escaped}"'


def _toml(value: Any) -> str | None:
    """``value`` as an inline TOML value (``None``: TOML has no such value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, dt.date):  # and datetimes
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(t for t in map(_toml, value) if t is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_str(k)} = {t}" for k, t in
                               ((k, _toml(v)) for k, v in value.items()) if t is not None) + "}"
    return None


def to_toml(doc: dict[str, Any]) -> str:
    """Top-level values first, then each table under its own ``["header"]``."""
    lines = [f"{_toml_str(k)} = {t}" for k, v in doc.items() if not isinstance(v, dict)
             for t in [_toml(v)] if t is not None]
    for key, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{_toml_str(key)}]")
            lines += [f"{_toml_str(k)} = {t}" for k, v in table.items()
                      for t in [_toml(v)] if t is not None]
    return "\n".join(lines) + "\n"


def to_json(doc: Any) -> str:
    return json.dumps(doc, default=lambda v: v.isoformat())


def good(tp: Any) -> st.SearchStrategy[Any]:
    """Values of a setting's own type (loading may still refuse them: ranges)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is float:
        return st.floats(0.5, 1e5) | st.integers(1, 10**5)
    if tp is int:
        return st.integers(1, 10**6)
    if tp is str:
        return st.text(max_size=8)
    if tp is bool:
        return st.booleans()
    if tp is dt.datetime:
        return st.datetimes(timezones=st.just(dt.UTC))
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (types.UnionType, typing.Union):
        return st.one_of(*(good(a) for a in args if a is not type(None)), st.none())
    if origin is tuple:
        return st.lists(st.text(max_size=8), max_size=3)
    if origin in (Mapping, dict):
        return st.dictionaries(st.sampled_from(sorted(KINDS)), good(args[1]), max_size=2)
    raise AssertionError(f"no values for settings of type {tp}: teach this test")


def safe(section: str, name: str) -> st.SearchStrategy[Any]:
    """Values ``section``'s ``name`` accepts whatever the other settings are (its default,
    spelt as an int when whole; small values in maps and optionals), to see loads succeed."""
    info = next(f for f in msgspec.structs.fields(ACTORS[section].struct) if f.name == name)
    tp, origin, args = info.type, get_origin(info.type), get_args(info.type)
    if tp in (int, float):
        values = [info.default, *([int(info.default)] if float(info.default).is_integer()
                                  else [])]
        return st.sampled_from(values)
    if origin in (Mapping, dict):
        return st.dictionaries(st.sampled_from(sorted(KINDS)), good(args[1]).filter(
            lambda v: not isinstance(v, int | float) or 1 <= v <= 60), max_size=3)
    if origin in (types.UnionType, typing.Union) and float in args:
        return st.none() | st.floats(0.5, 10)
    return good(tp)


KEYS = st.sampled_from(ALL_FIELDS) | st.text(max_size=10)
SCALARS = st.one_of(
    st.integers(), st.integers(-2**70, 2**70), st.booleans(), st.text(max_size=12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1", "2.5", "-3", "0", "nan", "inf", "-inf", "1e400", "null", "",
                     "sweep", "recreate", "2026-05-19T00:00:00Z", *sorted(KINDS)]),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)), st.dates())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(sorted(KINDS)) | st.text(max_size=6),
                                        inner, max_size=3), max_leaves=6)


@st.composite
def tables(draw: st.DrawFn, section: str | None) -> dict[str, Any]:
    """A table: known keys with values of their type or any value, and unknown keys."""
    fields = FIELDS[section] if section is not None else {n: None for n in ALL_FIELDS}
    out: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)):
        tp = fields[name]
        out[name] = draw(good(tp) if tp is not None and draw(st.booleans()) else VALUES)
    out.update(draw(st.dictionaries(KEYS, VALUES, max_size=2)))
    return out


@st.composite
def safe_tables(draw: st.DrawFn, section: str) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(FIELDS[section])), max_size=4, unique=True))
    return {name: draw(safe(section, name)) for name in names}


DOCUMENTS = st.one_of(
    st.tuples(st.just("doc"), st.fixed_dictionaries({}, optional={
        s: safe_tables(s) for s in SECTIONS})),  # settings every actor accepts
    st.tuples(st.just("doc"), st.sampled_from(SECTIONS).flatmap(safe_tables)),
    st.tuples(st.just("bytes"), st.binary(max_size=40)),
    st.tuples(st.just("text"), st.text(max_size=40)),
    st.tuples(st.just("doc"), st.sampled_from(SECTIONS).flatmap(
        lambda s: st.dictionaries(st.just(s), tables(s), min_size=1))),
    st.tuples(st.just("doc"), st.dictionaries(
        st.sampled_from(SECTIONS) | st.text(max_size=8),
        st.sampled_from(SECTIONS).flatmap(tables) | VALUES, max_size=3)),
    st.tuples(st.just("doc"), tables(None)),  # a file with no tables: one actor's settings
)


def write(path: Path, document: tuple[str, Any]) -> bytes:
    shape, content = document
    data: bytes
    if shape == "bytes":
        data = content
    elif shape == "text":
        data = content.encode("utf-8")
    else:
        data = (to_json(content) if path.suffix == ".json" else to_toml(content)).encode()
    path.write_bytes(data)
    return data


def parse(path: Path, data: bytes) -> Any:
    """The file as its format reads it (``None``: it cannot be read)."""
    try:
        text = data.decode("utf-8")
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except Exception:  # anything: the loader must then refuse the file
        return None


def check_table_loads(section: str, path: Path, given: dict[str, Any], label: str) -> None:
    """Load ``section`` from ``path``, whose table for it is ``given``."""
    fields = FIELDS[section]
    oracle = {k: (expected(v, fields[k]) if k in fields else REJECT) for k, v in given.items()}
    try:
        loaded = ACTORS[section].load(path, {})
    except ConfigError as exc:
        event("a table refused")
        message = str(exc)
        assert str(path) in message, message
        assert label in message, message
        bad = [k for k, o in oracle.items() if o is None or not o.sure]
        if any(o is None for o in oracle.values()):
            assert any(named(k, message) for k in bad), (bad, message)
        else:
            assert any(named(k, message) for k in given), (sorted(given), message)
        return
    event(f"a table loaded ({'some' if given else 'no'} settings)")
    for key, want in oracle.items():
        assert want is not None, f"{section} accepted {key} = {given[key]!r}"
        got = getattr(loaded, key)
        assert (dict(got) if isinstance(got, Mapping) else got) == want.value, (key, got)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
@given(document=DOCUMENTS)
@example(document=("text", "a = " + "[" * 5000))  # nested past the recursion limit
@example(document=("text", "[" * 100_000))
@example(document=("text", "a = 1\r"))  # a lone CR is no TOML newline (read as written)
@example(document=("doc", {"reconcile": {"scan_interval_s": math.nan}}))
@example(document=("doc", {"calls": {"poll_interval_s": {"kie-standard": -1}}}))
@example(document=("doc", {"webhooks": {"secrets": "x"}}))
@example(document=("doc", {"reconcile": 3, "calls": {}}))
def test_a_config_file_loads_as_written_or_is_refused_naming_the_setting(
        suffix: str, document: tuple[str, Any], tmp_path: Path) -> None:
    """Invariant: for every table (``[reconcile]``, ``[calls]``, ``[webhooks]``), loading
    a TOML or JSON file of any content (a flat file: the table's share of it, its own
    names and those no actor has) either succeeds with exactly the values the file
    gives (every key a setting of that table, every value of the setting's type) or raises
    :class:`ConfigError` naming the file, and then the table (``[calls]``) and the key at
    fault (a key that is unknown or of the wrong type, when there is one); never any
    other exception."""
    path = tmp_path / f"callwarden{suffix}"
    doc = parse(path, write(path, document))
    for section in SECTIONS:
        if not isinstance(doc, dict):  # unreadable, or not a table
            with pytest.raises(ConfigError) as caught:
                ACTORS[section].load(path, {})
            assert str(path) in str(caught.value)
            continue
        if not any(name in doc for name in SECTIONS):  # flat: split by the actors' names
            others = {n for other, f in FIELDS.items() if other != section for n in f}
            share = {k: v for k, v in doc.items() if k in FIELDS[section] or k not in others}
            check_table_loads(section, path, share, str(path))
            continue
        unknown = sorted(set(doc) - set(SECTIONS))
        table = doc.get(section, {})
        if unknown or not isinstance(table, dict):
            with pytest.raises(ConfigError) as caught:
                ACTORS[section].load(path, {})
            message = str(caught.value)
            assert str(path) in message, message
            assert (any(named(name, message) for name in unknown) if unknown
                    else f"[{section}]" in message), message
            continue
        check_table_loads(section, path, table, f"[{section}]")


@pytest.mark.parametrize("table", ["max_body_bytes = 0", "max_body_bytes = -1",
                                   "poll_timeout_s = 0", "secrets = { nosuch = 'x' }"])
def test_out_of_range_webhook_settings_are_refused(table: str, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[webhooks]\n{table}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=table.split()[0]):
        load_webhook_config(path, {})


# -- environment variables ------------------------------------------------------------------

def env_names(section: str) -> st.SearchStrategy[str]:
    actor = ACTORS[section]
    kinds = st.sampled_from(sorted(ENV_KIND)) | st.from_regex(r"[A-Z0-9_]{0,8}", fullmatch=True)
    return st.one_of(
        st.sampled_from([actor.prefix + name.upper() for name in FIELDS[section]]),
        st.tuples(st.sampled_from(sorted(actor.maps) or ["X"]), kinds,
                  st.sampled_from(["", "_S"])).map(lambda t: f"{actor.prefix}{t[0]}_{t[1]}{t[2]}"),
        st.from_regex(r"[A-Z0-9_]{0,12}", fullmatch=True).map(lambda s: actor.prefix + s))


ENV_VALUES = st.one_of(
    st.text(max_size=12), st.integers().map(str), st.floats().map(str),
    st.sampled_from(["", " ", "1", "-1", "0", "2.5", "1e3", "1e400", "nan", "inf", "-inf",
                     "null", "sweep", "recreate", "a,b", "2026-05-19T00:00:00Z", "true"]))


def env_target(section: str, name: str) -> tuple[str, str | None] | None:
    """The setting a variable sets, as the documented spelling says (``None``: none)."""
    actor = ACTORS[section]
    rest = name[len(actor.prefix):]
    if rest.lower() in FIELDS[section]:
        return rest.lower(), None
    for env_map, field in actor.maps.items():
        if rest.startswith(env_map + "_"):
            key = rest[len(env_map) + 1:]
            kind = ENV_KIND.get(key) or ENV_KIND.get(key.removesuffix("_S"))
            return (field, kind) if kind is not None else None
    return None


def spelt(value: Any) -> str:
    """A value as a variable spells it."""
    if isinstance(value, list | tuple):
        return ",".join(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return "null" if value is None else str(value)


@st.composite
def safe_variables(draw: st.DrawFn, section: str) -> dict[str, str]:
    """Variables that set settings to values they accept (per kind for a map)."""
    actor, env = ACTORS[section], {}
    by_map = {field: env_map for env_map, field in actor.maps.items()}
    for name, value in draw(safe_tables(section)).items():
        if name in by_map:
            for kind, item in value.items():
                env[f"{actor.prefix}{by_map[name]}_{kind.upper().replace('-', '_')}"] = \
                    spelt(item)
        elif not isinstance(value, dict):  # a map with no variable of its own
            env[actor.prefix + name.upper()] = spelt(value)
    return env


def effective_variables(section: str, env: Mapping[str, str]
                        ) -> tuple[list[str], dict[tuple[str, str | None], str]]:
    """(the variables that set nothing, the variable each setting ends up from): in name
    order, a later variable wins; a variable setting a per-kind map whole (never valid)
    outweighs its kinds' own."""
    unknown: list[str] = []
    whole: dict[str, str] = {}
    kinds: dict[tuple[str, str | None], str] = {}
    for name in sorted(env):
        target = env_target(section, name)
        if target is None:
            unknown.append(name)
        elif target[1] is None:
            whole[target[0]] = name
        else:
            kinds[target] = name
    return unknown, {**{t: n for t, n in kinds.items() if t[0] not in whole},
                     **{(f, None): n for f, n in whole.items()}}


@pytest.mark.parametrize("section", SECTIONS)
@given(data=st.data())
def test_a_bad_variable_is_refused_naming_it(section: str, data: st.DataObject) -> None:
    """Invariant: for every actor, any ``CALLWARDEN_<ACTOR>_*`` variables (a setting's
    name, a per-kind ``<MAP>_<KIND>``, or anything else under the prefix) with any values
    either load to exactly the values they spell (a list comma-separated) or raise
    :class:`ConfigError` naming a variable — one that is unknown or of the wrong type,
    when there is one; never any other exception."""
    env = data.draw(st.dictionaries(env_names(section), ENV_VALUES, min_size=1, max_size=3)
                    | safe_variables(section), label="env")
    check_variables(section, env)


def check_variables(section: str, env: Mapping[str, str]) -> None:
    fields = FIELDS[section]
    unknown, effective = effective_variables(section, env)

    def oracle(target: tuple[str, str | None], name: str) -> Ok | None:
        field, kind = target
        tp = fields[field] if kind is None else get_args(fields[field])[1]
        value: Any = env[name]
        if get_origin(tp) is tuple:
            value = [v.strip() for v in value.split(",") if v.strip()]
        return expected(value, tp)

    wants = {t: oracle(t, n) for t, n in effective.items()}
    try:
        loaded = ACTORS[section].load(None, env)
    except ConfigError as exc:
        event("refused")
        message = str(exc)
        rejected = unknown + [effective[t] for t, w in wants.items() if w is None]
        maybe = [effective[t] for t, w in wants.items() if w is not None and not w.sure]
        candidates = rejected + maybe if rejected else sorted(env)
        assert any(re.search(rf"{re.escape(n)}(?![A-Z0-9_])", message) for n in candidates), \
            (candidates, message)
        return
    event("loaded")
    assert not unknown, f"accepted {unknown}"
    for (field, kind), want in wants.items():
        name = effective[(field, kind)]
        assert want is not None, f"accepted {name}={env[name]!r}"
        got = getattr(loaded, field) if kind is None else getattr(loaded, field)[kind]
        assert got == want.value, (name, got)


def test_a_map_set_whole_and_by_kind_is_refused_naming_the_variable() -> None:
    """Found by the property above: ``THRESHOLDS_S=x`` with ``THRESHOLD_KIE_STANDARD=600``
    raised ``TypeError`` (the kind was written into the string)."""
    with pytest.raises(ConfigError, match=f"{RECONCILE_PREFIX}THRESHOLDS_S"):
        load_config(None, {f"{RECONCILE_PREFIX}THRESHOLDS_S": "x",
                           f"{RECONCILE_PREFIX}THRESHOLD_KIE_STANDARD": "600"})


# -- command-line arguments -----------------------------------------------------------------

PARSER = build_parser()
SUB = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
COMMANDS = sorted(SUB.choices)
ALWAYS_VALID = {Path}  # any text is a path (a missing --config is checked on its own)
#: text types: garbage is what they refuse
GARBAGE_ONLY = {"UUID", "parse_since", "window", "_job_ref", "states"}

#: what each numeric option accepts: (int or float, lowest, highest, lowest excluded)
RANGES: dict[str, tuple[type, float | None, float | None, bool]] = {
    "concurrency": (int, 1, None, False), "max_deliveries": (int, 1, None, False),
    "limit": (int, 1, None, False),
    "batch": (int, 1, None, False), "pool_size": (int, 1, None, False),
    "jobs": (int, 1, None, False), "workers": (int, 1, None, False),
    "count": (int, 0, None, False), "seed": (int, None, None, False),
    "port": (int, 0, 65535, False), "metrics_port": (int, 0, 65535, False),
    "operator_port": (int, 0, 65535, False),
    "grace": (float, 0, None, False), "credits": (float, 0, None, False),
    "kill_rate": (float, 0, None, False),
    **{name: (float, 0, None, True) for name in (
        "visibility", "poll_empty", "poll_interval", "poll_budget", "finalize_lease",
        "media_timeout", "store_timeout", "lease_margin", "heartbeat_every", "duration",
        "chaos_every", "clock_factor")},
}
#: options whose text the command itself checks before connecting: what it must refuse
POLICIES = ("sweep", "recreate")
CHECKED: dict[tuple[str, str], st.SearchStrategy[str]] = {
    ("enqueue", "kind"): st.text(max_size=12).filter(lambda s: s not in KINDS),
    ("enqueue", "request"): st.text(max_size=12).filter(
        lambda s: not isinstance(parse(Path("x.json"), s.encode()), dict)),
    ("worker", "ambiguous_create_for"): (st.text(max_size=12) | st.tuples(
        st.text(max_size=8) | st.sampled_from(sorted(KINDS)),
        st.text(max_size=8) | st.sampled_from(POLICIES)).map("=".join)).filter(
        lambda s: not (s.partition("=")[0] in KINDS and s.partition("=")[2] in POLICIES)),
}
#: a valid value of each required argument (checked below), so a bad one is the error
BASE: dict[str, dict[str, list[str]]] = {
    "audit": {"job_id": [str(uuid.UUID(int=1))]},
    "enqueue": {"kind": ["--kind", "kie-standard"], "request": ["--request", "{}"]},
    "rebuild": {"job": ["--all"]},
    "grant": {"role": ["callwarden_runtime"]},
}


def actions(command: str) -> list[argparse.Action]:
    return [a for a in SUB.choices[command]._actions
            if not isinstance(a, argparse._HelpAction | argparse._VersionAction)]


def refuses(action: argparse.Action, text: str) -> bool:
    if action.choices is not None:
        return text not in action.choices
    assert callable(action.type)
    try:
        action.type(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return True
    return False


def out_of_range(dest: str) -> st.SearchStrategy[str]:
    kind, low, high, open_low = RANGES[dest]
    if kind is int:
        parts = ([st.integers(max_value=int(low) - 1)] if low is not None else []) + \
                ([st.integers(min_value=int(high) + 1)] if high is not None else [])
        return st.one_of(*parts).map(str) if parts else st.nothing()
    below = st.floats(max_value=low or 0, allow_nan=False).filter(
        lambda v: v <= (low or 0) if open_low else v < (low or 0))
    return (below | st.sampled_from([math.nan, math.inf, -math.inf])).map(repr) \
        | st.sampled_from(["nan", "inf", "-inf", "Infinity", "NaN"])


def classified(action: argparse.Action) -> str:
    """How the test treats an option: by its range, as garbage-only, or not at all."""
    if action.choices is not None:
        return "choices"
    if action.type is None or action.type in ALWAYS_VALID:
        return "untyped"
    if getattr(action.type, "__name__", "") in GARBAGE_ONLY:
        return "garbage"
    assert action.dest in RANGES, f"{action.option_strings or action.dest}: say its range"
    return "range"


def test_every_typed_option_is_classified_and_every_command_has_its_base() -> None:
    """A new numeric option must get a range above; a new required argument a base
    value (the properties below would otherwise test nothing, or test the wrong error)."""
    for command in COMMANDS:
        for action in actions(command):
            classified(action)
        argv = [command, *(arg for fragment in BASE.get(command, {}).values()
                           for arg in fragment)]
        PARSER.parse_args(argv)
    known = {(c, a.dest) for c in COMMANDS for a in actions(c)}
    assert set(CHECKED) <= known
    assert {dest for _, dest in known} >= set(RANGES)


def bad_arguments(command: str) -> st.SearchStrategy[tuple[list[str], str]]:
    """(argv, the option stderr must name): one bad value, or an unknown option."""
    cases: list[st.SearchStrategy[tuple[list[str], str]]] = []
    options = {o for a in SUB.choices[command]._actions for o in a.option_strings}

    def argv_for(action: argparse.Action) -> Callable[[str], tuple[list[str], str]]:
        base = [arg for dest, fragment in BASE.get(command, {}).items()
                if dest != action.dest for arg in fragment]
        if not action.option_strings:  # a positional
            return lambda value: ([command, *base, "--", value], action.dest)
        flag = max(action.option_strings, key=len)
        return lambda value: ([command, *base, f"{flag}={value}"], flag)

    for action in actions(command):
        how = classified(action)
        values: list[st.SearchStrategy[str]] = []
        if how in ("choices", "garbage", "range"):
            values.append(st.text(max_size=12).filter(partial(refuses, action)))
        if how == "range":
            values.append(out_of_range(action.dest))
        if (command, action.dest) in CHECKED:
            values.append(CHECKED[(command, action.dest)])
        if values:
            cases.append(st.one_of(*values).map(argv_for(action)))
    base = [arg for fragment in BASE.get(command, {}).values() for arg in fragment]
    unknown = st.from_regex(r"--[a-z][a-z0-9-]{0,10}", fullmatch=True).filter(
        lambda o: not any(known.startswith(o) for known in options))
    cases.append(unknown.map(lambda o: ([command, *base, o], o)))
    return st.one_of(*cases)


class Unbounded(AssertionError):
    """A command ran past its bound: it did not refuse its bad input up front."""


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Raise :class:`Unbounded` in this (the main) thread after ``seconds``; the timer
    pytest-timeout may hold is given back, less the time spent."""
    def expire(signum: int, frame: Any) -> None:
        raise Unbounded(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    held, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if held:
            signal.setitimer(signal.ITIMER_REAL,
                             max(held - (time.monotonic() - started), 0.001))


@pytest.fixture
def dead_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No CALLWARDEN_* from the caller's environment, a database nobody listens for,
    and the loggers a command sets up put back as they were."""
    for name in list(os.environ):
        if name.startswith("CALLWARDEN_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", DEAD_DB)
    loggers = [logging.getLogger(n) for n in ("callwarden", "aiohttp.access")]
    saved = [(lg, list(lg.handlers), lg.level) for lg in loggers]
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """``callwarden <argv>`` in this process: its exit status and stderr."""
    capsys.readouterr()
    with bounded(15):
        try:
            status: object = main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
@given(data=st.data())
@pytest.mark.usefixtures("dead_database")
def test_a_bad_argument_exits_2_naming_the_option(
        command: str, data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: for every command of ``callwarden``, a value its option refuses (text
    that is not of the option's type or choices, a number outside its range, a non-finite
    number, text the command checks itself) or an unknown option exits with status 2, and
    stderr names the option, with no traceback — before the command connects to anything
    or starts anything."""
    argv, option = data.draw(bad_arguments(command), label="argv")
    status, err = run(argv, capsys)
    assert status == 2, (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    assert named(option, err), (argv, err)


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS
                                           if any(a.dest == "config" for a in actions(c))))
@given(document=st.one_of(
    st.tuples(st.just("text"), st.text(max_size=30)).filter(
        lambda d: parse(Path("x.toml"), d[1].encode()) is None),
    st.tuples(st.just("text"), st.just("[1, 2]")),
    st.tuples(st.just("doc"), st.dictionaries(st.sampled_from(SECTIONS), st.just({}))
              .map(lambda d: {**d, "reconciler": {}})),  # a misspelt table
    st.tuples(st.just("doc"), st.fixed_dictionaries({s: tables(s) for s in SECTIONS}).map(
        lambda d: {s: {**t, "no_such_key": 1} for s, t in d.items()})),
    st.tuples(st.just("missing"), st.none())))
@pytest.mark.usefixtures("dead_database")
def test_a_bad_config_file_exits_2_naming_it(
        command: str, document: tuple[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: every command with ``--config`` given a file it cannot use (unreadable,
    missing, not a table, an unknown table, an unknown key in every table) exits with
    status 2 and names the file on stderr, with no traceback, before connecting."""
    path = tmp_path / "bad.toml"
    path.unlink(missing_ok=True)
    if document[0] != "missing":
        write(path, document)
    argv = [command, "--config", str(path)]
    status, err = run(argv, capsys)
    assert status == 2, (status, err)
    assert "Traceback" not in err
    assert str(path) in err, err


# -- the same path in a real process --------------------------------------------------------

@pytest.mark.parametrize(("config", "names"), [
    ("[reconcile]\nbatch_sise = 5\n", ["[reconcile]", "batch_sise"]),
    ("[reconcile]\nscan_interval_s = \"soon\"\n", ["[reconcile]", "scan_interval_s"]),
    ("[reconcile]\nscan_interval_s = = 3\n", ["cannot read config"]),
    ("[calls]\nfinalize_lease_s = -1\n", ["[calls]", "finalize_lease_s"]),
    ("reconcile = 3\n", ["[reconcile]"]),
], ids=["unknown-key", "wrong-type", "unparseable", "bad-calls-table", "not-a-table"])
def test_reconcile_once_with_a_bad_config_exits_2_naming_the_setting(
        config: str, names: list[str], tmp_path: Path) -> None:
    """Invariant: ``python -m callwarden.cli reconcile --once --config BAD.toml`` exits 2 and
    names the file and the setting on stderr, on one line, with no traceback."""
    path = tmp_path / "bad.toml"
    path.write_text(config, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLWARDEN_")}
    env["DATABASE_URL"] = DEAD_DB
    proc = subprocess.run([sys.executable, "-m", "callwarden.cli", "reconcile", "--once",
                           "--config", str(path)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    line = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    for name in [str(path), *names]:
        assert name in line, proc.stderr
