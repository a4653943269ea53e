"""The state machine's declaration rendered as SQL, for the host API's functions
(``migrations/0014_host_api.sql``): which event may follow which state and where it
leads, each event type's payload version, and the host status a state projects to.

One declaration (:mod:`callwarden.events.states`, :mod:`callwarden.events.types`, the
fold's status table): this module renders it; the migration carries the rendering between
``-- BEGIN GENERATED`` and ``-- END GENERATED``, and ``tests/unit/test_declared_sql.py``
fails when the two differ (``python -m callwarden.database.declared`` prints the block to
paste into a new migration when the declaration changes). Pure: no I/O.
"""

from __future__ import annotations

from psycopg import sql

from callwarden.events.states import LEGAL, SETTLEMENT, CallState
from callwarden.events.types import VERSIONS
from callwarden.projections.fold import STATE_STATUS

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
        END,
    ])


if __name__ == "__main__":
    print(generated_block())
