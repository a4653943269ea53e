"""Which connection failures are for good (exit 2 at start) and which are an outage
(ridden through): libpq's messages as a PostgreSQL 15 server and libpq 17 gave them
(recorded by hand from a server with scram-sha-256 on 127.0.0.1; libpq reports a refused
connection with no SQLSTATE)."""

from __future__ import annotations

import psycopg
import pytest

from callwarden.database.boundary import refused_for_good

_AT = 'connection failed: connection to server at "127.0.0.1", port 5499 failed: '

FOR_GOOD = {
    "password": (_AT + 'FATAL:  password authentication failed for user "postgres"',
                 'password authentication failed for user "postgres"'),
    "database": (_AT + 'FATAL:  database "nope" does not exist', 'database "nope" does not exist'),
    "role": (_AT + 'FATAL:  role "nobody" does not exist', 'role "nobody" does not exist'),
    "hba": (_AT + 'FATAL:  no pg_hba.conf entry for host "127.0.0.1", user "app", database '
            '"app", no encryption', 'no pg_hba.conf entry for host "127.0.0.1", user "app", '
            'database "app", no encryption'),
    "nologin": (_AT + 'FATAL:  role "ro" is not permitted to log in',
                'role "ro" is not permitted to log in'),
}

OUTAGES = {
    "refused": (_AT + "Connection refused\n\tIs the server running on that host and "
                "accepting TCP/IP connections?"),
    "starting": _AT + "FATAL:  the database system is starting up",
    "shutting down": _AT + "FATAL:  the database system is shutting down",
    "full": _AT + "FATAL:  sorry, too many clients already",
    "timeout": _AT + "timeout expired",
}


@pytest.mark.parametrize("name", sorted(FOR_GOOD))
def test_a_refusal_for_good_is_named(name: str) -> None:
    message, reason = FOR_GOOD[name]
    assert refused_for_good(psycopg.OperationalError(message)) == reason


@pytest.mark.parametrize("name", sorted(OUTAGES))
def test_an_outage_is_not_a_refusal(name: str) -> None:
    assert refused_for_good(psycopg.OperationalError(OUTAGES[name])) is None


def test_only_a_connection_error_is_read() -> None:
    assert refused_for_good(ValueError(FOR_GOOD["password"][0])) is None
