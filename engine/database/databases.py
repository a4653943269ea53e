"""Whole databases on a server (the demo's, the benchmarks', the tests'): created and
dropped with their names quoted as identifiers (``psycopg.sql``), never formatted in.

On a Citus coordinator (the ``citus`` extension in the admin database, its workers in
``pg_dist_node``) a database is made on every node: Citus 12.1 propagates no ``CREATE
DATABASE``, and the extension and the worker registration are per database. The workers
are reached as the coordinator names them, with the admin URL's user and password."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from callwarden.database.boundary import translated
from callwarden.database.queries import QUERIES

__all__ = ["cluster_workers", "create_database", "drop_database"]


def cluster_workers(admin_url: str) -> list[tuple[str, int]]:
    """The active primary workers of the Citus coordinator at ``admin_url`` (host, port);
    empty on plain Postgres."""
    with translated(), psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute(QUERIES["migrations_on_citus"]).fetchone() != (True,):
            return []
        return [(str(h), int(p)) for h, p in conn.execute(QUERIES["citus_workers"])]


def create_database(admin_url: str, name: str, *, template: str | None = None,
                    cluster: bool = True) -> str:
    """Create database ``name`` (from ``template`` when given) on ``admin_url``'s server,
    and on a Citus coordinator with workers on every worker too, with the extension and
    the workers registered (``cluster=False``, or a coordinator with no workers: a plain
    database on that server only); its URL. A node that fails leaves the others' copies:
    ``drop_database`` removes them."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    workers = cluster_workers(admin_url) if cluster else []
    with translated():
        for url in [admin_url, *(_on(admin_url, host, port) for host, port in workers)]:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(statement)
                if workers:
                    with psycopg.connect(make_conninfo(url, dbname=name),
                                         autocommit=True) as new:
                        new.execute(QUERIES["citus_extension"])
        url = make_conninfo(admin_url, dbname=name)
        if workers:
            _register(url, workers)
    return url


def _register(url: str, workers: list[tuple[str, int]]) -> None:
    """The new database's coordinator learns its own address and its workers'."""
    info = conninfo_to_dict(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["citus_set_coordinator"], {
            "host": info.get("host") or "localhost", "port": int(info.get("port") or 5432)})
        for host, port in workers:
            conn.execute(QUERIES["citus_add_worker"], {"host": host, "port": port})


def _on(admin_url: str, host: str, port: int) -> str:
    """A worker's URL: the admin URL's user and password, the worker's host and port (and
    no ``hostaddr`` of the coordinator's)."""
    return make_conninfo(admin_url, host=host, port=port, hostaddr="")


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still on it (on a
    Citus coordinator, on every worker too)."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    workers = cluster_workers(admin_url)
    with translated():
        for url in [admin_url, *(_on(admin_url, host, port) for host, port in workers)]:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(statement)
