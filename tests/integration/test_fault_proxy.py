"""The fault harness's TCP proxy (tests/faults.py) does what the chaos runs rely on: it
forwards the Postgres protocol, a drop resets the connections through it (and only
those), a stall holds their bytes until it ends, latency delays every round trip, and it
never reaches past this machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.faults import FaultProxy


@pytest.fixture
def proxy(pg_admin_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(pg_admin_url, lifetime_s=120) as p:
        yield p


def test_the_proxy_forwards_and_a_drop_resets_only_its_connections(
        proxy: FaultProxy, pg_admin_url: str) -> None:
    with psycopg.connect(proxy.url(), autocommit=True) as through, \
            psycopg.connect(pg_admin_url, autocommit=True) as direct:
        assert through.execute("SELECT 41 + 1").fetchone() == (42,)
        assert proxy.drop() == 1
        with pytest.raises(psycopg.OperationalError):
            through.execute("SELECT 1")
        assert direct.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(proxy.url(), autocommit=True) as again:  # new connections work
        assert again.execute("SELECT 2").fetchone() == (2,)
    assert (proxy.accepted, proxy.dropped) == (2, 1)


def test_a_stall_holds_a_statement_until_it_ends(proxy: FaultProxy) -> None:
    """Ordered, not timed: the statement's answer arrives after the moment the stall
    let bytes flow again (``stall`` returns that moment; it is taken before they flow).
    The stall ends only on the test's signal (its 60 s length is a bound, never reached),
    so however slowly this thread runs, the statement is still held when checked."""
    with psycopg.connect(proxy.url(), autocommit=True) as conn:
        resumed: list[float] = []
        held = threading.Event()
        proxy_stall = threading.Thread(
            target=lambda: resumed.append(proxy.stall(60.0, stop=held)))
        proxy_stall.start()
        # The stall is in effect once stall() has cleared the flow; wait for that.
        while proxy.flowing:
            time.sleep(0.01)  # polling the proxy's flag, bounded by the stall's start
        query = threading.Thread(target=lambda: conn.execute("SELECT 1").fetchone())
        query.start()
        query.join(timeout=0.3)  # a bound on looking, not a synchronisation
        assert query.is_alive()  # held while stalled
        held.set()  # end the stall now
        query.join(timeout=10)
        done = time.monotonic()
        proxy_stall.join(timeout=10)
    assert not query.is_alive()
    assert resumed
    assert resumed[0] <= done


def test_latency_delays_every_round_trip(proxy: FaultProxy) -> None:
    with psycopg.connect(proxy.url(), autocommit=True) as conn:
        proxy.latency(0.05)
        start = time.monotonic()
        for _ in range(5):
            conn.execute("SELECT 1")
        slow = time.monotonic() - start
        proxy.latency(0)
    assert slow >= 5 * 2 * 0.05  # each way, each statement


def test_the_proxy_refuses_a_server_that_is_not_local() -> None:
    with pytest.raises(ValueError, match="only reaches local servers"):
        FaultProxy("postgresql://db.example.com:5432/x")
