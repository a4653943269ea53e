"""Whole databases on a server (the demo's, the benchmarks', the tests'): created and
dropped with their names quoted as identifiers (``psycopg.sql``), never formatted in."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from callwarden.database.boundary import translated

__all__ = ["create_database", "drop_database"]


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` (from ``template`` when given) on ``admin_url``'s server;
    its URL."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with translated(), psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(statement)
    return make_conninfo(admin_url, dbname=name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still on it."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with translated(), psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(statement)
