"""A silent network ends as a lost connection within bounded time (issue 15 review: a
partition otherwise waits for the kernel's retransmission timeout): every connection the
engine opens carries TCP keepalives, ``tcp_user_timeout`` and ``connect_timeout``, and a
value the operator's ``DATABASE_URL`` sets wins."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from callwarden.database.db import NETWORK_DEFAULTS, network_defaults


def test_every_default_is_added_to_a_url_without_them() -> None:
    got = conninfo_to_dict(network_defaults("postgresql://u@127.0.0.1:5432/app"))
    for key, value in NETWORK_DEFAULTS.items():
        assert got[key] == str(value), key
    assert (got["host"], got["dbname"], got["user"]) == ("127.0.0.1", "app", "u")


def test_the_operators_own_values_win() -> None:
    got = conninfo_to_dict(network_defaults(
        "postgresql://u@db:5432/app?keepalives=0&tcp_user_timeout=5000&connect_timeout=3"))
    assert (got["keepalives"], got["tcp_user_timeout"], got["connect_timeout"]) == (
        "0", "5000", "3")
    assert got["keepalives_idle"] == str(NETWORK_DEFAULTS["keepalives_idle"])
