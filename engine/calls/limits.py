"""Admission limits as configuration (issue 42; docs/admission.md): the settings file's
``[limits.<account>]`` tables, validated, and written to ``callwarden.limits``, which every
start reads in the database (``callwarden.admit``, migrations/0018_admission.sql)::

    [limits.kie-main]                 # one provider account: the kinds sharing its key
    kinds = ["kie-standard", "kie-veo"]
    in_flight = 5                     # calls open upstream at once (start -> terminal)
    tenant_in_flight = 2              # of those, one user's at most
    creates = 20                      # creates per window ...
    per_s = 10                        # ... of this many seconds
    wait_s = 2                        # a refused start tries again after (a full account)

The database holds the limits, so a Node host's ``start_call`` and every Python process
obey the same rows; ``callwarden limits apply`` makes the table what the file says (an
account the file no longer names is removed), ``callwarden limits`` shows each account
with its calls in flight and the jobs waiting for it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from callwarden.database.boundary import transaction
from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.errors import ConfigError
from callwarden.rules.spelling import did_you_mean

__all__ = ["AccountLimit", "apply_limits", "limits_from", "shown_limits"]


class AccountLimit(msgspec.Struct, frozen=True, kw_only=True):
    """One provider account's caps (``None``: not limited on that count)."""

    kinds: tuple[str, ...]
    in_flight: int | None = None
    tenant_in_flight: int | None = None
    creates: int | None = None
    per_s: float | None = None
    wait_s: float = 2.0


_FIELDS = tuple(f.name for f in msgspec.structs.fields(AccountLimit))
_COUNTS = ("in_flight", "tenant_in_flight", "creates")


def limits_from(table: Mapping[str, Any], where: str = "[limits]") -> dict[str, AccountLimit]:
    """The accounts of a settings file's ``[limits]`` table; a :class:`ConfigError`
    naming the account and the setting for anything that cannot be held."""
    out: dict[str, AccountLimit] = {}
    owner: dict[str, str] = {}
    for account, raw in table.items():
        at = f"{where} {account}"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{at}: want a table ([limits.{account}]) with kinds and caps")
        for name in raw:
            if name not in _FIELDS:
                raise ConfigError(f"{at}: unknown setting {name!r}"
                                  f"{did_you_mean(name, _FIELDS)}")
        limit = _account(at, raw)
        for kind in limit.kinds:
            if kind in owner:
                raise ConfigError(f"{at}: {kind} is already limited by account "
                                  f"{owner[kind]!r} (a kind has one account)")
            owner[kind] = account
        out[account] = limit
    return out


def _account(at: str, raw: Mapping[str, Any]) -> AccountLimit:
    kinds = raw.get("kinds")
    if (not isinstance(kinds, list | tuple) or not kinds
            or not all(isinstance(k, str) and k for k in kinds)):
        raise ConfigError(f"{at}: kinds must be a non-empty list of provider kinds")
    for name in _COUNTS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigError(f"{at}: {name} must be a whole number >= 1, not {value!r}")
    for name in ("per_s", "wait_s"):
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{at}: {name} must be a number of seconds > 0, not {value!r}")
    if (raw.get("creates") is None) != (raw.get("per_s") is None):
        raise ConfigError(f"{at}: creates and per_s go together (creates per per_s seconds)")
    if not any(raw.get(name) is not None for name in _COUNTS):
        raise ConfigError(f"{at}: no cap (set in_flight, tenant_in_flight or creates/per_s)")
    tenant, total = raw.get("tenant_in_flight"), raw.get("in_flight")
    if tenant is not None and total is not None and tenant > total:
        raise ConfigError(f"{at}: tenant_in_flight ({tenant}) above in_flight ({total})")
    per_s, wait_s = raw.get("per_s"), raw.get("wait_s", 2.0)
    return AccountLimit(kinds=tuple(dict.fromkeys(kinds)), in_flight=total,
                        tenant_in_flight=tenant, creates=raw.get("creates"),
                        per_s=None if per_s is None else float(per_s), wait_s=float(wait_s))


async def apply_limits(conn: Conn, limits: Mapping[str, AccountLimit]) -> list[str]:
    """Make ``callwarden.limits`` the accounts given, in one transaction: each written,
    and every other account removed. Answers the accounts removed."""
    async with transaction(conn):
        for account, limit in limits.items():
            await execute(conn, "limits_upsert", {**msgspec.structs.asdict(limit),
                                                  "account": account,
                                                  "kinds": list(limit.kinds)})
        gone = await execute(conn, "limits_remove_others", {"accounts": list(limits)})
    return [r["account"] for r in gone]


async def shown_limits(conn: Conn) -> list[dict[str, Any]]:
    """Each account's row, with its calls in flight and the jobs waiting for it."""
    return [dict(r) for r in await execute(conn, "limits_show", {"now": None})]
