"""``callwarden check`` run as a process against a database whose host tables were changed
the way a host's own migrations change them (plain SQL): it names every gap of the host
contract (docs/embedding.md, "The host contract") and of the configuration, and exits 2;
on a migrated database with a media store it finds nothing and exits 0 (issue 25 item 5)."""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from callwarden.database.db import Conn, connect
from callwarden.providers.simulator.core import RunningSimulator
from tests.support.processes import cli, environment
from tests.support.queues import value


async def test_a_migrated_database_and_a_named_media_store_lack_nothing(
        db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    code, out, err = await cli(["check"], environment(db_url, sim, tmp_path / "media"))
    assert code == 0, out + err
    assert "nothing missing" in out
    assert "problem" not in out


async def test_every_gap_of_the_host_contract_is_named_and_exits_2(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    for statement in (
        "ALTER TABLE assets ADD COLUMN tenant_id text NOT NULL",
        "ALTER TABLE jobs ADD CONSTRAINT host_status_check "
        "CHECK (status IN ('pending', 'processing', 'completed', 'failed'))",
        "ALTER TABLE usage_logs ALTER COLUMN settled_at TYPE text",
        "ALTER TABLE jobs DROP COLUMN node_id",
        "ALTER TABLE assets ADD COLUMN label text NOT NULL DEFAULT 'x'",  # has a default: fine
    ):
        await conn.execute(statement)
    code, out, err = await cli(["check"], environment(db_url, sim, tmp_path / "media"))
    assert code == 2, out + err
    said = " ".join(err.split())  # problems go to stderr
    for gap in ("assets.tenant_id is NOT NULL without a default",
                "host_status_check does not allow cancelled",
                "usage_logs.settled_at is text, callwarden needs timestamptz",
                "jobs.node_id is missing"):
        assert gap in said, said
    assert "assets.label" not in said + out
    assert "4 problem(s)" in out


async def test_one_run_names_the_settings_and_the_schemas_problems(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    """A settings problem and a schema problem, both named by one run of ``check`` (issue
    40, item 10: the schema's showed only once the settings were fixed); an unreachable
    database is named as such beside the settings' problems."""
    await conn.execute("ALTER TABLE jobs DROP COLUMN node_id")
    env = environment(db_url, sim, tmp_path / "media")
    del env["CALLWARDEN_MEDIA_DIR"]
    code, out, err = await cli(["check"], env)
    assert code == 2, out + err
    said = " ".join(err.split())
    assert "media store: reconcile and serve: no media store configured" in said
    assert "jobs.node_id is missing" in said
    env["DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
    code, out, err = await cli(["check"], env)
    said = " ".join(err.split())
    assert code == 2, out + err
    assert "media store: reconcile and serve: no media store configured" in said
    assert "the database was not checked: database unavailable" in said


async def test_migrate_adds_the_contract_columns_a_hosts_own_jobs_lacks(
        empty_db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    """A host whose jobs table predates callwarden and lacks workflow_execution_id,
    node_id and is_public: after ``migrate``, ``check`` finds nothing missing (issue 40,
    item 10: migrate left them absent and check exited 2)."""
    async with await connect(empty_db_url) as c:
        await c.execute("CREATE TABLE jobs (id uuid PRIMARY KEY, user_id text NOT NULL, "
                        "job_type text NOT NULL DEFAULT 'image', status text NOT NULL "
                        "DEFAULT 'pending', input_data jsonb NOT NULL DEFAULT '{}', "
                        "output_data jsonb, error_message text, provider text, "
                        "provider_cost numeric, progress integer NOT NULL DEFAULT 0, "
                        "created_at timestamptz NOT NULL DEFAULT now(), started_at "
                        "timestamptz, completed_at timestamptz, updated_at timestamptz "
                        "NOT NULL DEFAULT now())")
    env = environment(empty_db_url, sim, tmp_path / "media")
    code, out, err = await cli(["migrate"], env)
    assert code == 0, out + err
    code, out, err = await cli(["check"], env)
    assert code == 0, out + err
    assert "the host tables hold every column callwarden uses" in out


async def test_an_unmigrated_database_is_told_to_migrate(
        empty_db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    code, _, err = await cli(["check"], environment(empty_db_url, sim, tmp_path / "media"))
    assert code == 2
    said = " ".join(err.split())
    assert "migrations not applied" in said
    assert "run callwarden migrate" in said
    assert "table jobs is missing" in said


async def test_what_the_engine_accepts_passes_and_what_breaks_a_write_is_named(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    """A ``uuid`` user_id (the engine runs on it) is no problem; a ``varchar(255)``
    error_message (a long failure could not be recorded: the call would stay open) is; a
    domain on ``jobs.status`` without ``cancelled`` is read like a table CHECK; a CHECK
    it cannot read is a note, not a guess."""
    for statement in (
        "ALTER TABLE usage_logs ALTER COLUMN user_id TYPE uuid USING gen_random_uuid()",
        "ALTER TABLE jobs ALTER COLUMN error_message TYPE varchar(255)",
        "CREATE DOMAIN job_status AS text "
        "CHECK (VALUE = ANY (ARRAY['pending', 'processing', 'completed', 'failed']))",
        "ALTER TABLE jobs ALTER COLUMN status TYPE job_status",
        "ALTER TABLE jobs ADD CONSTRAINT host_not_archived "
        "CHECK (status IS DISTINCT FROM 'archived')",
    ):
        await conn.execute(statement)
    code, out, err = await cli(["check"], environment(db_url, sim, tmp_path / "media"))
    assert code == 2, out + err
    said, noted = " ".join(err.split()), " ".join(out.split())
    assert "usage_logs.user_id" not in said + noted
    assert "jobs.error_message is character varying(255)" in said
    assert "CHECK job_status_check does not allow cancelled" in said
    assert "CHECK host_not_archived" in noted  # a note: it cannot tell
    assert "2 problem(s)" in noted


async def test_tables_found_through_the_search_path_are_the_ones_checked(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    """The engine's statements find ``jobs`` through the search_path; so does ``check``
    (it reported every table missing when the session's first schema was another)."""
    await conn.execute("CREATE SCHEMA app")
    dbname = await value(conn, "SELECT current_database()")
    await conn.execute(sql.SQL("ALTER DATABASE {} SET search_path = app, public").format(
        sql.Identifier(dbname)))
    code, out, err = await cli(["check"], environment(db_url, sim, tmp_path / "media"))
    assert code == 0, out + err
    assert "nothing missing" in out


async def test_settings_that_contradict_each_other_are_refused(
        db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    """A worker heartbeat as slow as the reconciler's heartbeat timeout (each valid
    alone): ``check`` names both and exits 2; ``reconcile``, whose own environment may not
    hold the workers' ``[calls]``, says so as an error and runs (issue 40, item 4)."""
    env = {**environment(db_url, sim, tmp_path / "media"),
           "CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "60"}
    code, out, err = await cli(["check"], env)
    said = " ".join(err.split())
    assert code == 2, out + err
    assert ("settings that contradict: [calls] heartbeat_every_s (60 s) must be below "
            "[reconcile] heartbeat_timeout_s (60 s)") in said, said
    code, out, err = await cli(["reconcile", "--once"], env)
    assert code == 0, out + err
    assert ("settings that contradict: [calls] heartbeat_every_s (60 s) must be below "
            "[reconcile] heartbeat_timeout_s") in " ".join(err.split())
