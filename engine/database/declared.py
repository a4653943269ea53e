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

import msgspec
from psycopg import sql

from callwarden.database.queries import FRAGMENTS, fragment
from callwarden.events.states import LEGAL, SETTLEMENT, CallState
from callwarden.events.types import EVENT_TYPES, VERSIONS
from callwarden.projections.fold import EMPTY, OBSERVED_FIELDS, STATE_STATUS
from callwarden.projections.writes import (
    RULES,
    AtLeast,
    Cond,
    Const,
    Differs,
    Either,
    Equals,
    IfSet,
    LeaseHeld,
    Payload,
    Refuse,
    Source,
    Step,
)
from callwarden.rules.redact import MAX_ERROR, STEPS, UNESCAPE

__all__ = ["BEGIN", "BEGIN_HOST", "COLUMNS", "END", "END_HOST", "OUTPUT", "generated_block",
           "generated_host_block", "pg_regex"]

BEGIN = "-- BEGIN GENERATED (python -m callwarden.database.declared)"
END = "-- END GENERATED"
BEGIN_HOST = "-- BEGIN GENERATED HOST (python -m callwarden.database.declared)"
END_HOST = "-- END GENERATED HOST"

#: Each projection field's column on the ``jobs`` row and its SQL type (as
#: :func:`callwarden.projections.columns.to_columns` writes them) ...
COLUMNS: dict[str, tuple[str, str]] = {
    "state": ("call_state", "text"),
    "version": ("call_version", "int"),
    "status": ("status", "text"),
    "provider_kind": ("provider_kind", "text"),
    "provider_task_id": ("provider_task_id", "text"),
    "provider_call_started_at": ("provider_call_started_at", "timestamptz"),
    "call_sync": ("call_sync", "boolean"),
    "reconcile_attempts": ("reconcile_attempts", "int"),
    "reconcile_last_error": ("reconcile_last_error", "text"),
    "reconcile_next_at": ("reconcile_next_at", "timestamptz"),
    "error_message": ("error_message", "text"),
    "finalize_owner": ("finalize_owner", "text"),
    "finalize_lease_until": ("finalize_lease_until", "timestamptz"),
    "upstream_result": ("upstream_result", "jsonb"),
    "provider_cost": ("provider_cost", "numeric"),
    "call_finished_at": ("call_finished_at", "timestamptz"),
    "settlement": ("call_settlement", "text"),
}
#: ... and the fields kept as members of the ``call_output`` column (omitted when None).
OUTPUT: dict[str, str] = {"output_media": "media", "output_text": "text",
                          "output_stop_reason": "stop_reason"}


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


def _payload(name: str, sql_type: str) -> str:
    """The event's field ``name`` as ``sql_type`` (a JSON null is SQL NULL)."""
    if sql_type == "jsonb":
        return f"NULLIF(apply_event.e->'{name}', 'null')"
    if sql_type == "text":
        return f"(apply_event.e->>'{name}')"
    return f"(apply_event.e->>'{name}')::{sql_type}"


def _default(event: str, name: str, sql_type: str) -> str | None:
    """The event type's default for its field ``name`` as SQL (``None``: it has none), for
    a payload that omits it."""
    field = next(f for f in msgspec.structs.fields(EVENT_TYPES[event]) if f.name == name)
    value = field.default
    if value is None or value is msgspec.NODEFAULT:
        return None
    if isinstance(value, tuple) and not value:
        return "'[]'::jsonb"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return f"{_text(sql.Literal(value))}::{sql_type}"
    raise ValueError(f"{event}.{name}: no SQL for its default {value!r}")


def _field(event: str, name: str, sql_type: str) -> str:
    got, default = _payload(name, sql_type), _default(event, name, sql_type)
    return got if default is None else f"COALESCE({got}, {default})"


def _value(event: str, field: str, src: Source) -> str:
    column, sql_type = COLUMNS.get(field, (field, "jsonb"))
    if isinstance(src, Payload):
        return _field(event, src.name, sql_type)
    if isinstance(src, Const):
        return f"{_text(sql.Literal(src.value))}::{sql_type}"
    if isinstance(src, Either):
        return (f"COALESCE({_field(event, src.name, sql_type)}, "
                f"{_field(event, src.otherwise, sql_type)})")
    if isinstance(src, IfSet):
        return f"COALESCE({_field(event, src.name, sql_type)}, v.{column})"
    if isinstance(src, AtLeast):
        return f"GREATEST(v.{column}, {_field(event, src.name, sql_type)})"
    return f"v.{column} + {src.n}"


def _holds(cond: Cond) -> str:
    got = f"(apply_event.e->>'{cond.name}')"
    if isinstance(cond, Equals):
        return f"{got} = {_text(sql.Literal(cond.value))}"
    if isinstance(cond, Differs):
        return f"{got} IS DISTINCT FROM {_text(sql.Literal(cond.value))}"
    return f"COALESCE({got}, '') <> ''"  # Python's truth of a str or None


def _assign(event: str, field: str, src: Source) -> list[str]:
    if field in COLUMNS:
        return [f"v.{COLUMNS[field][0]} := {_value(event, field, src)};"]
    member = OUTPUT[field]
    value = _value(event, field, src)
    return [f"v.call_output := CASE WHEN {value} IS NULL THEN v.call_output - '{member}'",
            f"    ELSE COALESCE(v.call_output, '{{}}') || jsonb_build_object('{member}', "
            f"{value}) END;"]


def _sql_steps(event: str, steps: tuple[Step, ...]) -> list[str]:
    lines: list[str] = []
    for step in steps:
        body = [line for field, src in step.set for line in _assign(event, field, src)]
        if any(field in OUTPUT for field, _ in step.set):  # no media: no output at all
            body.append("IF v.call_output->'media' IS NULL THEN v.call_output := NULL; END IF;")
        if step.state is not None:
            body.append(f"v.call_state := '{step.state.value}';")
        if step.when is not None:
            body = [f"IF {_holds(step.when)} THEN", *("    " + b for b in body), "END IF;"]
        lines.extend(body)
    return lines


def _refusal(event: str, refuse: Refuse) -> list[str]:
    where = f"'{event} may not follow state %: "
    if isinstance(refuse, LeaseHeld):
        until, owner = COLUMNS[refuse.until][0], COLUMNS[refuse.owner][0]
        return [f"IF v_before = '{refuse.state.value}' AND v.{until} IS NOT NULL",
                f"   AND {_payload('at', 'timestamptz')} < v.{until} THEN",
                f"    RAISE EXCEPTION {where}lease held by % until %', v_before,",
                f"        v.{owner}, v.{until} USING ERRCODE = 'CW003';",
                "END IF;"]
    column = COLUMNS[refuse.name][0]
    value = _text(sql.Literal(refuse.value))
    return [f"IF v.{column} IS DISTINCT FROM {value} THEN",
            f"    RAISE EXCEPTION {where}{refuse.why} ({refuse.name} %)', v_before,",
            f"        v.{column} USING ERRCODE = 'CW003';",
            "END IF;"]


def _indent(lines: list[str], by: int) -> str:
    return "\n".join(" " * by + line for line in lines)


def _empty() -> list[str]:
    """The empty call's columns (what a row with no event folds from, keeping the host's
    status: :func:`callwarden.projections.fold.apply`)."""
    out = []
    for field, (column, _) in COLUMNS.items():
        if field not in ("status", "state", "version"):
            out.append(f"v.{column} := {_value('', field, Const(getattr(EMPTY, field)))};"
                       if not isinstance(getattr(EMPTY, field), bool | int) else
                       f"v.{column} := {getattr(EMPTY, field)!r};".replace("False", "false"))
    return [*out, "v.call_output := NULL;"]


def _apply_event() -> str:
    """``callwarden.apply_event(j, e)``: the row ``j`` after the event ``e`` (its payload
    as JSON, with its type), as the fold computes it (:mod:`callwarden.projections.fold`,
    from the rules of :mod:`callwarden.projections.writes`); CW003 when the event may not
    follow. Pure: it returns the row, it writes nothing."""
    arms: list[str] = []
    for event, rule in sorted(RULES.items()):
        lines = [f"WHEN '{event}' THEN"]
        if rule.refuse is not None:
            lines += ["    " + ln for ln in _refusal(event, rule.refuse)]
        body = _sql_steps(event, rule.steps)
        lines += ["    " + ln for ln in body or ["NULL;"]]
        arms.append(_indent(lines, 8))
    thens = [_indent([f"IF v_type = '{event}' THEN", *("    " + ln for ln in
                      _sql_steps(event, rule.then)), "END IF;"], 4)
             for event, rule in sorted(RULES.items()) if rule.then]
    return _text(sql.SQL("""\
CREATE OR REPLACE FUNCTION callwarden.apply_event(j @host@.jobs, e jsonb)
RETURNS @host@.jobs
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v @host@.jobs := apply_event.j;
    v_type text := apply_event.e->>'type';
    v_before text := (apply_event.j).call_state;
    v_dest text := callwarden.next_state((apply_event.j).call_state, apply_event.e->>'type');
BEGIN
    IF v_dest IS NULL THEN
        RAISE EXCEPTION '% may not follow state %', v_type, COALESCE(v_before, 'none')
            USING ERRCODE = 'CW003';
    END IF;
    IF v_before IS NULL AND v.call_version = 0 THEN  -- the empty call
{}
    END IF;
    v.call_state := v_dest;  -- a rule may refine it (Adopted with a task id: polling)
    CASE v_type
{}
    END CASE;
    v.call_version := v.call_version + 1;
    IF v.call_state IS DISTINCT FROM v_before THEN  -- entered: its status and settlement
        v.status := COALESCE(callwarden.state_status(v.call_state), v.status);
        IF callwarden.state_settlement(v.call_state) IS NOT NULL THEN
            v.call_settlement := callwarden.state_settlement(v.call_state);
            v.call_finished_at := {};
            v.reconcile_next_at := NULL;
        END IF;
    END IF;
{}
    RETURN v;
END
$body$;""").format(
        sql.SQL(_indent(_empty(), 8)), sql.SQL("\n".join(arms)),
        sql.SQL(_payload("at", "timestamptz")), sql.SQL("\n".join(thens))))


#: What the write path's row update (fragment append_upd) names as parameters, in
#: write_events: the folded row ``v``'s columns, and what the run of events says.
_RUN_PARAMS = {"new_version": "v.call_version", "owns_seed": "(v.provider_kind IS NOT NULL)",
               "is_completion": "v_completion", "beat_at": "v_beat_at",
               "beat_owner": "v_beat_owner"}


def _row_update() -> str:
    """The SET list of the Python write path's own row update (``append_upd`` of
    engine/database/queries.sql, its fragments spliced, its fences left out), each
    parameter the folded row's column or what the run said."""
    text = fragment("append_upd")
    head = "jobs SET\n"  # (the statement's head; its fences, after WHERE, are not taken)
    start, end = text.index(head), text.index("\nWHERE id = ")
    body = text[start + len(head):end]
    columns = {c for c, _ in COLUMNS.values()} | {"call_output"}

    def param(m: re.Match[str]) -> str:
        name = m[1]
        if name in _RUN_PARAMS:
            return _RUN_PARAMS[name]
        if name not in columns:
            raise ValueError(f"append_upd names a parameter write_events has not: {name}")
        return f"v.{name}"

    body = re.sub(r"%\((\w+)\)s::\w+", param, body)
    return "\n".join("        " + line for line in body.splitlines())


def _write_events() -> str:
    """``callwarden.write_events(j, events)``: each event (a JSON array of payloads)
    applied to the locked row ``j`` and appended to the log at the version it makes, then
    the row written as the Python write path writes it (its own SET list: the seed's
    columns only once the call owns them, the host's cost and error kept until an event
    says, a completion's output and time, TaskCreated as the first heartbeat); the row
    after."""
    return _text(sql.SQL("""\
CREATE OR REPLACE FUNCTION callwarden.write_events(j @host@.jobs, events jsonb)
RETURNS @host@.jobs
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v @host@.jobs := write_events.j;
    v_event jsonb;
    v_completion boolean := false;
    v_beat_at timestamptz;
    v_beat_owner text;
BEGIN
    FOR v_event IN SELECT x.value FROM jsonb_array_elements(write_events.events) x LOOP
        v := callwarden.apply_event(v, v_event);
        INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
        VALUES (v.id, v.call_version, v_event->>'type',
                callwarden.event_version(v_event->>'type'), v_event, v_event->>'actor');
        v_completion := v_completion OR v_event->>'type' = 'Completed';
        IF v_event->>'type' = 'TaskCreated' THEN
            v_beat_at := (v_event->>'at')::timestamptz;
            v_beat_owner := v_event->>'actor';
        END IF;
    END LOOP;
    UPDATE @host@.jobs SET
{}
    WHERE id = v.id;
    RETURN v;
END
$body$;""").format(sql.SQL(_row_update())))


#: The settlement fragment's parameters, as the function's.
_SETTLE_PARAMS = {"%(job_id)s::uuid": "settle.job_id", "%(settle_to)s::text": "settle.settle_to",
                  "%(new_version)s::int": "settle.seq", "%(cost)s::numeric": "settle.cost"}


def _settle() -> str:
    """``callwarden.settle(job_id, settle_to, seq, cost)``: the Python write path's
    settlement (``settle_ctes`` of engine/database/queries.sql) as one function: the
    fragment's text, its parameters the function's, run alone (not after an append)."""
    ctes = FRAGMENTS["settle_ctes"]
    if not ctes.startswith(", host_charged AS ("):
        raise ValueError("settle_ctes must begin with its host_charged CTE")
    ctes = "WITH" + ctes[1:]
    for param, name in _SETTLE_PARAMS.items():
        ctes = ctes.replace(param, name)
    ctes = ctes.replace("\nAND EXISTS (SELECT 1 FROM ev)", "")
    ctes = re.sub(r"\b(FROM|UPDATE) usage_logs\b", r"\1 @host@.usage_logs", ctes)
    if "%(" in ctes or " ev" in ctes:
        raise ValueError("settle_ctes names a parameter or CTE the function does not have")
    return _text(sql.SQL("""\
CREATE OR REPLACE FUNCTION callwarden.settle(job_id uuid, settle_to text, seq int,
                                             cost numeric)
RETURNS text
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_moved int;
BEGIN
{}
    SELECT count(*) INTO v_moved FROM settle;
    IF v_moved > 0 THEN
        RETURN 'settled';
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u
                             WHERE u.job_id = settle.job_id)
                THEN 'already_settled' ELSE 'no_reservation' END;
END
$body$;""").format(
        sql.SQL(ctes)))


def generated_host_block() -> str:
    """The SQL the migration carries between :data:`BEGIN_HOST` and :data:`END_HOST`,
    inside its host template (``@host@``: the schema of the host's tables)."""
    fields = set(COLUMNS) | set(OUTPUT)
    missing = set(EMPTY.__struct_fields__) - OBSERVED_FIELDS - fields
    if missing:
        raise ValueError(f"projection fields with no column: {sorted(missing)}")
    return "\n\n".join([BEGIN_HOST, _apply_event(), _write_events(), _settle(), END_HOST])


if __name__ == "__main__":
    print(generated_block())
    print()
    print(generated_host_block())
