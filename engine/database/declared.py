"""The state machine's declaration rendered as SQL, for the host API's functions
(``migrations/0014_host_api.sql``): which event may follow which state and where it
leads, each event type's payload version, the host status a state projects to, and the
redaction every recorded error passes (:mod:`callwarden.rules.redact`'s substitutions,
translated to PostgreSQL's regular expressions: ``\\b`` is ``\\y`` there).

One declaration (:mod:`callwarden.events.states`, :mod:`callwarden.events.types`, the
fold's status table): this module renders it; the migration carries the rendering between
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

__all__ = ["BEGIN", "END", "generated_block"]

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


def _redaction() -> str:
    """``callwarden.safe_error(message)``: :func:`callwarden.rules.redact.safe_error` in
    SQL, rendered from its substitutions."""
    lines = [_text(sql.SQL("    v_out := replace(v_out, {}, {});").format(
        sql.Literal(escaped), sql.Literal(plain))) for escaped, plain in UNESCAPE]
    for pattern, replacement in STEPS:
        ignore_case = bool(pattern.flags & re.IGNORECASE)
        source = pattern.pattern.removeprefix("(?i)").replace(r"\b", r"\y")
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
    v_hex text;
BEGIN
    IF v_out IS NULL THEN
        RETURN NULL;
    END IF;
{}
    LOOP  -- percent-escapes, as urllib's unquote (a NUL becomes U+FFFD)
        v_hex := substring(v_out FROM '%([0-9A-Fa-f]{{2}})');
        EXIT WHEN v_hex IS NULL;
        v_out := replace(v_out, '%' || v_hex, CASE WHEN v_hex = '00' THEN chr(65533)
                         ELSE chr(get_byte(decode(v_hex, 'hex'), 0)) END);
    END LOOP;
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
