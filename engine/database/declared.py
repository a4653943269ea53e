"""The state machine's declaration rendered as SQL, for the host API's functions
(``migrations/0014_host_api.sql``, rendered again in ``0016_host_api_hardened.sql``):
which event may follow which state and where it leads, each event type's payload
version, the host status a state projects to, and the redaction every recorded error
passes (:mod:`callwarden.rules.redact`'s substitutions, translated to PostgreSQL's regular
expressions by :func:`pg_regex`).

One declaration (:mod:`callwarden.events.states`, :mod:`callwarden.events.types`, the
fold's status table): this module renders it; the newest migration that carries a
rendering (migrations are immutable: a new rendering comes in a new one) has it between
``-- BEGIN GENERATED`` and ``-- END GENERATED``, and ``tests/unit/test_declared_sql.py``
fails when the two differ (``python -m callwarden.database.declared`` prints the block to
paste into a new migration when the declaration changes). Pure: no I/O.
"""

from __future__ import annotations

import re

from psycopg import sql

from callwarden.events.states import LEGAL, SETTLEMENT, CallState
from callwarden.events.types import VERSIONS
from callwarden.projections.fold import STATE_STATUS
from callwarden.rules.redact import MAX_ERROR, STEPS, UNESCAPE

__all__ = ["BEGIN", "END", "generated_block", "pg_regex"]

BEGIN = "-- BEGIN GENERATED (python -m callwarden.database.declared)"
END = "-- END GENERATED"


def _text(statement: sql.Composable) -> str:
    return statement.as_string(None)


def _function(name: str, args: str, cases: list[tuple[sql.Composable, str | int | None]],
              returns: str = "text") -> str:
    whens = "\n".join(_text(sql.SQL("    WHEN {} THEN {}").format(cond, sql.Literal(out)))
                      for cond, out in cases)
    return _text(sql.SQL("CREATE OR REPLACE FUNCTION callwarden.{}({}) RETURNS {}\n"
                         "LANGUAGE sql IMMUTABLE PARALLEL SAFE\nSET search_path = ''\n"
                         "AS $body$\nSELECT CASE\n{}\n    ELSE NULL END\n$body$;").format(
        sql.SQL(name), sql.SQL(args), sql.SQL(returns), sql.SQL(whens)))


def _pair(state: CallState | None, event: str) -> sql.Composable:
    if state is None:
        return sql.SQL("state IS NULL AND event = {}").format(sql.Literal(event))
    return sql.SQL("state = {} AND event = {}").format(sql.Literal(state.value),
                                                       sql.Literal(event))


def _is(column: str, value: str) -> sql.Composable:
    return sql.SQL("{} = {}").format(sql.SQL(column), sql.Literal(value))


#: What Python's ``\s`` matches beyond PostgreSQL's (``[[:space:]]``, which in most
#: locales is ASCII only): every other character ``str.isspace()`` holds, as ARE escapes.
_MORE_SPACE = (r"\u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f"
               r"\u205f\u3000")


def pg_regex(pattern: str) -> str:
    r"""A Python pattern of :mod:`callwarden.rules.redact` as a PostgreSQL ARE: ``\b``
    is ``\y``, and ``\s`` matches every character Python's does (in a bracket
    expression, and outside one as a bracket expression of its own)."""
    out: list[str] = []
    opened, i = -1, 0  # where the bracket expression we are in began (-1: none)
    while i < len(pattern):
        c, in_bracket = pattern[i], opened >= 0
        if c == "\\" and i + 1 < len(pattern):
            pair = pattern[i:i + 2]
            if pair == r"\b":
                pair = r"\y"
            elif pair == r"\s":
                pair = rf"\s{_MORE_SPACE}" if in_bracket else rf"[\s{_MORE_SPACE}]"
            out.append(pair)
            i += 2
            continue
        if c == "[" and not in_bracket:
            opened = i
        elif c == "]" and in_bracket and i > opened + (2 if pattern[opened + 1] == "^" else 1):
            opened = -1
        out.append(c)
        i += 1
    return "".join(out)


def _redaction() -> str:
    """``callwarden.safe_error(message)``: :func:`callwarden.rules.redact.safe_error` in
    SQL, rendered from its substitutions. Percent-escapes are read once, a run of them as
    UTF-8 (as urllib's ``unquote``; bytes that are not UTF-8, and a NUL, become U+FFFD)."""
    lines = [_text(sql.SQL("    v_out := replace(v_out, {}, {});").format(
        sql.Literal(escaped), sql.Literal(plain))) for escaped, plain in UNESCAPE]
    for pattern, replacement in STEPS:
        ignore_case = bool(pattern.flags & re.IGNORECASE)
        source = pg_regex(pattern.pattern.removeprefix("(?i)"))
        lines.append(_text(sql.SQL("    v_out := regexp_replace(v_out, {}, {}, {});").format(
            sql.Literal(source), sql.Literal(replacement),
            sql.Literal("gi" if ignore_case else "g"))))
    return _text(sql.SQL("""CREATE OR REPLACE FUNCTION callwarden.safe_error(message text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
#variable_conflict error
DECLARE
    v_out text := message;
    v_rest text;
    v_run text;
    v_bytes bytea;
    v_plain text;
    v_at int;
BEGIN
    IF v_out IS NULL THEN
        RETURN NULL;
    END IF;
{}
    v_rest := v_out;  -- percent-escapes, once, each run of them as UTF-8 (as unquote)
    v_out := '';
    LOOP
        v_run := substring(v_rest FROM '(?:%[0-9A-Fa-f]{{2}})+');
        EXIT WHEN v_run IS NULL;
        v_at := position(v_run IN v_rest);
        v_bytes := decode(replace(v_run, '%', ''), 'hex');
        BEGIN
            v_plain := convert_from(v_bytes, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character
                       OR invalid_parameter_value THEN
            v_plain := NULL;
        END;
        IF v_plain IS NULL THEN  -- not UTF-8, or a NUL: byte by byte, ASCII kept
            SELECT string_agg(CASE WHEN b BETWEEN 1 AND 127 THEN chr(b) ELSE chr(65533) END,
                              '' ORDER BY n)
            INTO v_plain
            FROM generate_series(0, length(v_bytes) - 1) n, get_byte(v_bytes, n) b;
        END IF;
        v_out := v_out || left(v_rest, v_at - 1) || v_plain;
        v_rest := substr(v_rest, v_at + length(v_run));
    END LOOP;
    v_out := v_out || v_rest;
{}
    IF length(v_out) > {} THEN
        v_out := left(v_out, {}) || '... (' || (length(v_out) - {}) || ' characters cut)';
    END IF;
    RETURN v_out;
END
$body$;""").format(sql.SQL("\n".join(lines[:len(UNESCAPE)])),
                    sql.SQL("\n".join(lines[len(UNESCAPE):])),
                    sql.Literal(MAX_ERROR), sql.Literal(MAX_ERROR), sql.Literal(MAX_ERROR)))


def generated_block() -> str:
    """The SQL the migration carries between :data:`BEGIN` and :data:`END`."""
    legal = sorted(LEGAL.items(), key=lambda kv: (kv[0][1], kv[0][0] or ""))
    return "\n\n".join([
        BEGIN,
        _function("next_state", "state text, event text",
                  [(_pair(src, trigger), dest.value) for (src, trigger), dest in legal]),
        _function("event_version", "event text",
                  [(_is("event", name), v) for name, v in sorted(VERSIONS.items())],
                  returns="smallint"),
        _function("state_status", "state text",
                  [(_is("state", s.value), STATE_STATUS[s]) for s in CallState]),
        _function("state_settlement", "state text",
                  [(_is("state", s.value), SETTLEMENT.get(s)) for s in CallState]),
        _redaction(),
        END,
    ])


if __name__ == "__main__":
    print(generated_block())
