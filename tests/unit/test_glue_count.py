"""The example host's glue is counted by a script, ``bench/glue.py`` (issue 41 item 6), and
docs/embedding.md shows what it counts: its table is the script's output, its numbers the
script's totals, and its settlement hook the example host's own file. The rule itself is
held on a small host whose count is known line by line."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import glue
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "embedding.md"
TABLE = re.compile(r"<!-- glue: python bench/glue.py --markdown -->\n(.*?)<!-- /glue -->", re.S)


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def test_the_docs_table_is_the_scripts_output() -> None:
    shown = TABLE.search(_page())
    assert shown is not None, "docs/embedding.md lost its table of bench/glue.py"
    assert shown.group(1) == glue.markdown(glue.count_host())


def test_the_docs_numbers_are_the_scripts_totals() -> None:
    total = glue.totals(glue.count_host())
    first, following = total[glue.FIRST], total["replicate-prediction"]
    page = _page()
    assert f"**{first} lines for the first kind, {following} for a next provider's kind**" \
        in page
    assert f"| the glue for this example | {first} lines for the first kind, counted by " \
        in page
    # the page's prose explains these two numbers line by line (the KindSpec, the Polled
    # rules, the hook, the settings, the processes): a change to them is a change to it too
    assert (first, following) == (25, 7)


def test_the_docs_settlement_hook_is_the_example_hosts_file() -> None:
    hook = (ROOT / "docs" / "examples" / "acme_host" / "db" / "002_settled.sql"
            ).read_text(encoding="utf-8")
    assert f"```sql\n{hook}```" in _page()


def test_a_file_of_the_host_the_count_does_not_classify_is_refused(tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(glue.HOST, host, ignore=shutil.ignore_patterns(".*", "__pycache__"))
    assert glue.totals(glue.count_host(host)) == glue.totals(glue.count_host())
    (host / "billing.py").write_text("from callwarden import cancel\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"does not classify: billing\.py"):
        glue.count_host(host)


def _write(host: Path, name: str, text: str) -> None:
    (host / name).parent.mkdir(parents=True, exist_ok=True)
    (host / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def test_the_rule_on_a_host_counted_line_by_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Own files count the statements that name callwarden (a compound one its header);
    glue files count whole, docstrings, comments, blanks and ``__future__`` aside; a next
    kind's statements are its own, a line naming it and the first kind's counts for both;
    an import is each part's whose statements alone use one of its names."""
    monkeypatch.setattr(glue, "FILES", {
        "providers.py": ("glue", ""), "settings.env": ("glue", ""),
        "hook.sql": ("glue", ""), "app.py": ("own", ""), "worker.py": ("own", ""),
        "Procfile": ("own", "")})
    monkeypatch.setattr(glue, "PARTS", {"b-kind": ("B", "PB"), "optional: x": ("X",)})
    _write(tmp_path, "providers.py", '''
        """A docstring: never counted."""
        from __future__ import annotations

        from lib import A0, B0                         # first and b-kind: 1 each
        from callwarden.providers.registry import Provider  # first (PA uses it): 1
        from callwarden.providers.webhooks import json_object  # only X uses it: optional

        # a comment
        class A(A0):                                   # first: 3
            def f(self) -> int:
                return 1

        class B(B0):                                   # b-kind: 2
            pass

        class X:                                       # optional: 2
            y = json_object
        PA = Provider(name="a", client=A)              # first: 1
        PB = Provider(name="b", client=B)              # b-kind: 1
        ALL = [PA, PB]                                 # first and b-kind: 1 each
    ''')
    _write(tmp_path, "settings.env", "# a comment\nCALLWARDEN_PROVIDERS=providers:ALL\n\nX=1\n")
    _write(tmp_path, "hook.sql", "-- a comment\nCREATE TRIGGER t\n    AFTER UPDATE;\n")
    _write(tmp_path, "worker.py", '''
        import os

        from celery import Celery
        from callwarden.queue.celery import register   # 1

        app = Celery("host", broker=os.environ["REDIS_URL"])
        task = register(app)                           # 1
        OTHER = 1
    ''')
    _write(tmp_path, "app.py", '''
        from worker import OTHER, task                 # 1: imports a name callwarden's
        from callwarden import create_job              # 1

        async def order(conn, x):                      # header names nothing
            job = await create_job(conn,               # 2
                                   credits=x)
            if job:                                    # names nothing callwarden's
                task.delay(str(job))                   # 1
            with create_job(conn) as y:                # 1: a header naming it
                print(y, OTHER)
            return job
    ''')
    _write(tmp_path, "Procfile", "web: python app.py\nreconciler: callwarden reconcile\n")
    counts = {c.path: c.lines for c in glue.count_host(tmp_path)}
    assert counts == {
        "providers.py": {glue.FIRST: 1 + 1 + 3 + 1 + 1, "b-kind": 1 + 2 + 1 + 1,
                         "optional: x": 1 + 2},
        "settings.env": {glue.FIRST: 2}, "hook.sql": {glue.FIRST: 2},
        "app.py": {glue.FIRST: 1 + 1 + 2 + 1 + 1}, "worker.py": {glue.FIRST: 2},
        "Procfile": {glue.FIRST: 1}}
    assert glue.totals(glue.count_host(tmp_path)) == {
        glue.FIRST: 7 + 2 + 2 + 6 + 2 + 1, "b-kind": 5, "optional: x": 3}
