"""pyright — and so pylance, which is pyright — resolves every ``callwarden.*`` name after
the README's install command, in the repository and in a host, and reports a wrong call to
the public API (issue 43.4). setuptools' default editable install finds the package through
an import hook that pyright cannot follow: 767 of the 815 errors pyright reported on the
repository were ``Import "callwarden..." could not be resolved``. The README installs in
setuptools' strict mode (``--config-settings editable_mode=strict``): a tree of links laid
out as the wheel lays the package (under ``build/``), which a static ``.pth`` names.

Each check is a real pyright process (the ``test`` extra pins pyright; it runs on Node,
installed with apt-get when the tests run as root, as ``tests/debian.py`` does for the
other Debian binaries). A missing pyright or Node fails naming the install, never a skip.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.debian import binary
from tests.layout import FOLDERS, ROOT

#: The README's install (after ``python3 -m venv .venv &&``), which ``.ci/run`` runs too.
INSTALL = '.venv/bin/pip install -e ".[test]" --config-settings editable_mode=strict'
PYRIGHT_TIMEOUT_S = 240

#: A host's module, outside the checkout: names from the package and from each folder
#: mapped into it, used as a host uses them, and one call made wrong (``# wrong``).
HOST = textwrap.dedent('''\
    """A host's module: callwarden's public API, and one call to it made wrong."""

    import uuid

    import aiohttp

    import callwarden.errors
    from callwarden import CallRunner, MediaStore, OwnCalls, ProviderSettings, create_job, open_pool
    from callwarden.calls.runner import CallOutcome
    from callwarden.database.migrate import available
    from callwarden.events import CallStarted
    from callwarden.projections.fold import CallProjection, fold
    from callwarden.providers.registry import PROVIDERS


    def names() -> tuple[object, ...]:
        return (callwarden.errors.CallwardenError, CallOutcome, available, CallStarted,
                CallProjection, fold, PROVIDERS, OwnCalls)


    async def order(url: str, settings: ProviderSettings, media: MediaStore) -> uuid.UUID:
        async with open_pool(url) as pool, aiohttp.ClientSession() as session:
            async with CallRunner(pool, session, settings, media):
                async with pool.connection() as conn:
                    return await create_job(conn, user_id="u1", credits="five")  # wrong
''')


def _pyright(cwd: Path, *args: str) -> dict[str, Any]:
    """pyright's JSON report, run in ``cwd`` on this interpreter's environment."""
    if importlib.util.find_spec("pyright") is None:
        pytest.fail(f"pyright is not installed in {sys.prefix}: the test extra pins it; run the "
                    f"README's install command ({INSTALL})")
    if binary(("node",), "nodejs") is None:
        pytest.fail("node is not installed: apt-get install nodejs (pyright runs on Node)")
    done = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, *args],
        cwd=cwd, capture_output=True, text=True, timeout=PYRIGHT_TIMEOUT_S, check=False)
    # 0: no error, 1: errors reported; anything else is pyright failing to run
    assert done.returncode in (0, 1), (
        f"pyright exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _unresolved(diagnostics: list[dict[str, Any]]) -> list[str]:
    """The diagnostics that say an import did not resolve (a module, or a name in one)."""
    return [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
            for d in diagnostics
            if d.get("rule") in ("reportMissingImports", "reportMissingModuleSource")
            or "is unknown import symbol" in d["message"]]


def test_a_host_resolves_callwarden_and_pyright_reports_its_one_wrong_call(
        tmp_path: Path) -> None:
    (tmp_path / "host.py").write_text(HOST, encoding="utf-8")
    # its own (empty) configuration: pyright looks for one upwards from here
    (tmp_path / "pyrightconfig.json").write_text("{}\n", encoding="utf-8")
    report = _pyright(tmp_path, "host.py")
    found = report["generalDiagnostics"]
    assert _unresolved(found) == []
    wrong = HOST.splitlines().index(next(line for line in HOST.splitlines()
                                         if line.endswith("# wrong")))
    assert [(d["severity"], d.get("rule"), d["range"]["start"]["line"]) for d in found] == [
        ("error", "reportArgumentType", wrong)], found
    assert re.search(r'"credits" of type "float \| None" in function "create_job"',
                     found[0]["message"]), found[0]["message"]


def test_pyright_resolves_every_callwarden_name_in_the_repository() -> None:
    """The packages and the example host (pyproject's ``[tool.pyright]``; the host checked
    from its own root, where ``events`` and ``providers`` are its own modules). What is left
    are pyright's own findings, which mypy --strict (``.ci/mypy``) does not share; they are
    not this test's concern, resolution is."""
    report = _pyright(ROOT)
    assert _unresolved(report["generalDiagnostics"]) == [], (
        f"a module added since the install is not in its link tree: run {INSTALL} again")
    checked = [p for f in FOLDERS.values() for p in f.rglob("*.py")
               if "__pycache__" not in p.parts]
    host = sorted((ROOT / "docs" / "examples").rglob("*.py"))
    assert len(host) >= 4
    assert report["summary"]["filesAnalyzed"] >= len(checked) + len(host)
    print(f"pyright: {report['summary']['errorCount']} errors in "
          f"{report['summary']['filesAnalyzed']} files, none an unresolved import")


def test_the_readme_and_ci_install_in_strict_editable_mode() -> None:
    """The README's test set-up is the install above, and ``.ci/run`` runs the same."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"python3 -m venv .venv && {INSTALL} && .venv/bin/python -m pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert INSTALL.replace("pip install", "pip install -q") in ci
