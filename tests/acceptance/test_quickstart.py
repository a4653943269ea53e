"""docs/quickstart.md's host, copied from the page and run as a new host runs it: a real
process in its own folder, a database with nothing in it, only ``DATABASE_URL`` and the
provider's URL and key set (the provider is the simulator on 127.0.0.1). What it prints
is what the page says, and the database holds what the page says happened."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from pathlib import Path

import psycopg

from callwarden.providers.simulator.core import RunningSimulator

PAGE = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


def _host_file() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the quickstart has one Python file"
    return str(blocks[0])


async def test_the_quickstart_host_runs_as_written(empty_db_url: str, sim: RunningSimulator,
                                                   tmp_path: Path) -> None:
    (tmp_path / "quickstart.py").write_text(_host_file(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CALLWARDEN_") and not k.endswith(("_API_KEY", "_TOKEN"))}
    env.update(DATABASE_URL=empty_db_url, CALLWARDEN_KIE_URL=sim.url("kie"),
               KIE_API_KEY=sim.sim.api_key)
    proc = await asyncio.create_subprocess_exec(  # the simulator answers on this loop
        sys.executable, "quickstart.py", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    m = re.fullmatch(r"job (\S+): completed, credits committed\n", out.decode())
    assert m, out.decode() + err.decode()[-3000:]
    job = uuid.UUID(m[1])
    with psycopg.connect(empty_db_url) as c:
        assert c.execute("SELECT status, call_state FROM jobs WHERE id = %s",
                         (job,)).fetchone() == ("completed", "completed")
        assert c.execute("SELECT status, credits_charged FROM usage_logs WHERE job_id = %s",
                         (job,)).fetchall() == [("committed", 5)]
        events = [r[0] for r in c.execute(
            "SELECT type FROM callwarden.call_events WHERE job_id = %s ORDER BY seq", (job,))]
        assert events[:2] == ["CallStarted", "TaskCreated"]
        assert events[-1] == "Completed"
        assert events.count("CallStarted") == 1
        assets = c.execute("SELECT url FROM assets WHERE job_id = %s", (job,)).fetchall()
    assert len(assets) == 1
    assert list((tmp_path / "media").rglob("*")), "the image is stored under media/"
