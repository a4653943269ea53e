"""A host whose own root holds ``events.py``, ``providers.py``, ``projections.py``, an
``engine/`` package and a ``migrations/`` package with its own ``0001_create_users.sql``
(the working directory comes first on ``sys.path`` under web frameworks and Celery)
imports callwarden, keeps its own modules, and migrates only callwarden's SQL: from a
real process started in that folder, through both the command and the in-process API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

from callwarden.database.migrate import available

HOST_FILES = {
    "events.py": "WHO = 'host events'\n",
    "providers.py": "WHO = 'host providers'\n",
    "projections.py": "WHO = 'host projections'\n",
    "engine/__init__.py": "WHO = 'host engine'\n",
    "migrations/__init__.py": "",
    "migrations/0001_create_users.sql": "CREATE TABLE host_users (id int);\n",
}


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    for name, text in HOST_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _host_tables(url: str) -> set[str]:
    """Tables as ``schema.name`` in public and callwarden's schema."""
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT schemaname || '.' || tablename FROM pg_tables "
                         "WHERE schemaname IN ('public', 'callwarden')")
        return {r[0] for r in rows}


def _versions(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as c:
        return [(r[0], r[1]) for r in c.execute(
            "SELECT version, name FROM callwarden.callwarden_migrations ORDER BY version")]


def test_a_host_with_generic_module_names_keeps_them(host_root: Path) -> None:
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, '')  # as web frameworks and Celery put the working directory
        import callwarden, events, providers, projections, engine, migrations
        from callwarden import CallRunner  # the embedding API loads
        from callwarden.database.migrate import available
        print(events.WHO, providers.WHO, projections.WHO, engine.WHO, sep='|')
        print([m.name for m in available()][:2])
        print(CallRunner.__module__)
    """)
    lines = _run(host_root, sys.executable, "-c", code).splitlines()
    assert lines[0] == "host events|host providers|host projections|host engine"
    assert lines[1] == "['host_baseline', 'external_call_columns']"
    assert lines[2] == "callwarden.calls.runner"


IN_PROCESS = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, '')
    import callwarden
    async def main():
        async with await callwarden.connect(os.environ["DATABASE_URL"]) as conn:
            print(len(await callwarden.migrate(conn)))
    asyncio.run(main())
""")


@pytest.mark.parametrize("how", ["command", "in-process"])
def test_migrate_from_the_host_root_applies_callwardens_sql_only(
        host_root: Path, empty_db_url: str, how: str) -> None:
    """``callwarden migrate`` (the command) and ``callwarden.migrate`` (in process), each on
    a fresh database, run from the host's root with it on ``sys.path``."""
    env = {**os.environ, "DATABASE_URL": empty_db_url, "PYTHONPATH": "."}
    if how == "command":
        _run(host_root, sys.executable, "-m", "callwarden.cli", "migrate", env=env)
    else:
        applied = _run(host_root, sys.executable, "-c", IN_PROCESS, env=env)
        assert applied.strip() == str(len(available()))
    assert _versions(empty_db_url) == [(m.version, m.name) for m in available()]
    assert "public.host_users" not in _host_tables(empty_db_url)
    assert {"public.jobs", "callwarden.call_events", "public.usage_logs"} <= _host_tables(
        empty_db_url)


def test_the_console_script_loads_the_hosts_adapters_from_its_root(
        db_url: str, tmp_path: Path) -> None:
    """``callwarden`` (the console script, not ``python -m``) run from the example host's
    root finds ``CALLWARDEN_PROVIDERS=providers:PROVIDERS`` there, as ``arq``, ``celery``
    and ``uvicorn`` find the host's modules (issue 40, item 9: ModuleNotFoundError); a
    stray ``secrets.py`` there never stands in for the standard library's."""
    script = Path(sys.executable).parent / "callwarden"
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "acme_host"
    root = tmp_path / "host"
    root.mkdir()
    for module in example.glob("*.py"):
        (root / module.name).write_text(module.read_text(encoding="utf-8"), encoding="utf-8")
    (root / "secrets.py").write_text("raise SystemExit('the host root shadowed secrets')\n",
                                     encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALLWARDEN_", "PYTHONPATH"))}
    env.update({"DATABASE_URL": db_url, "CALLWARDEN_PROVIDERS": "providers:PROVIDERS",
                "CALLWARDEN_ACME_URL": "http://127.0.0.1:9", "ACME_API_KEY": "k"})
    out = subprocess.run([str(script), "status"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ModuleNotFoundError" not in out.stderr
