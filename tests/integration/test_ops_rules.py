"""The operators' alerting rules and dashboard (ops/, docs/operations.md) hold:

- ``promtool check rules`` accepts ops/prometheus/callwarden-rules.yml, and
  ``promtool test rules`` passes ops/prometheus/callwarden-rules.test.yml, in which every
  alert fires on its series and stays quiet on the ones beside them; the same unit tests
  fail against rules that never fire (so they can fail);
- every metric and label the rules' and the dashboard's PromQL name is one that
  engine/observe/metrics.py and engine/service/metrics.py export: the names come from
  scraping a running service's /metrics (after a little traffic: webhook deliveries,
  appends, a reconcile pass, an outage), which carries the SQL-backed gauges and, as
  HELP/TYPE lines at least, every family of the process registry (checked against
  ``REGISTRY``); a matched label value must be one the code writes;
- the Grafana JSON parses, has a schemaVersion, and every panel and variable reads its
  datasource from the ``DS_PROMETHEUS`` variable;
- the gauge ``callwarden_reservations_leaked_recent`` counts reservations left reserved on
  ended calls, and its query is served by indexes.

promtool is Debian's ``prometheus`` package: a missing promtool FAILS these tests with
how to install it (``.ci/run`` installs it), never a skip.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.outage import Outage
from callwarden.database.queries import QUERIES
from callwarden.database.write import append, load
from callwarden.errors import DatabaseUnavailable
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.observe.metrics import REGISTRY
from callwarden.service.app import ServiceConfig
from tests.debian import binary
from tests.integration.conftest import MakeReconciler
from tests.service import Listeners, running_service

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "callwarden-rules.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "callwarden-rules.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "callwarden-dashboard.json"
TOKEN = "ops-admin"
DS = "${DS_PROMETHEUS}"
MISSING = ("promtool is required to check the alerting rules: install Debian's prometheus "
           "package (`apt-get update && apt-get install -y prometheus`, which ships "
           "/usr/bin/promtool; .ci/run does this)")


def promtool() -> str:
    found = binary(("promtool",), "prometheus", paths=("/usr/bin/promtool",))
    if found is None:
        pytest.fail(MISSING)
    return found


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target; the dashboard's variables ($kind, Grafana's
    $__rate_interval) stand as they are."""
    return [(f"panel {p['title']!r} target {t['refId']}", t["expr"])
            for p in panels(dashboard()["panels"]) for t in p.get("targets", [])]


# -- PromQL: the metric names, matchers and grouping labels an expression uses ---------------

_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>\d[0-9A-Za-z_.]*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},@])
  | (?P<space>\s+)
""", re.VERBOSE)
_AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                           "count_values", "bottomk", "topk", "quantile"})
_FUNCTIONS = frozenset({
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "delta",
    "deriv", "exp", "floor", "histogram_quantile", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "max_over_time", "min_over_time", "predict_linear", "present_over_time",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
    "sqrt", "stddev_over_time", "sum_over_time", "time", "timestamp", "vector"})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # label, op, value


@dataclass
class Parsed:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            assert m.lastgroup is not None
            out.append((m.lastgroup, m.group()))
    return out


def parse_promql(expr: str) -> Parsed:
    """The selectors (metric, matchers) and grouping labels (by, without, on, ignoring,
    group_left/right) of ``expr``; an unknown function or a selector without a metric
    name is an error (the check below would otherwise miss what it uses)."""
    toks, parsed, i = _tokens(expr), Parsed(), 0
    text = [t for _, t in toks] + [""]
    while i < len(toks):
        kind, word = toks[i]
        if word == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        if kind != "ident":
            i += 1
            continue
        low = word.lower()
        if low in _GROUPING:
            if text[i + 1] == "(":
                end = text.index(")", i + 2)
                parsed.grouping |= {t for k, t in toks[i + 2:end] if k == "ident"}
                i = end
            i += 1
        elif low in _KEYWORDS or low in _AGGREGATIONS:
            i += 1
        elif text[i + 1] == "(":
            if word not in _FUNCTIONS:
                raise ValueError(f"unknown function {word}() in {expr!r}")
            i += 1
        else:
            selector, i = Selector(word), i + 1
            if text[i] == "{":
                i += 1
                while text[i] != "}":
                    label, op, value = toks[i], toks[i + 1], toks[i + 2]
                    if label[0] != "ident" or op[1] not in ("=", "!=", "=~", "!~") or \
                            value[0] != "string":
                        raise ValueError(f"cannot read the matchers of {word} in {expr!r}")
                    selector.matchers.append((label[1], op[1], value[1][1:-1]))
                    i += 3
                    if text[i] == ",":
                        i += 1
                i += 1
            parsed.selectors.append(selector)
    return parsed


def _code_words() -> set[str]:
    """The string literals the engine writes (label values among them) and the event
    type names."""
    words: set[str] = set()
    for path in [*ROOT.glob("engine/**/*.py"), *ROOT.glob("engine/**/*.sql"),
                 *ROOT.glob("events/*.py")]:
        source = path.read_text(encoding="utf-8")
        words |= set(re.findall(r"""["']([A-Za-z_][A-Za-z0-9_-]*)["']""", source))
        words |= set(re.findall(r"^class (\w+)\(", source, re.MULTILINE))
    return words


Exported = dict[str, set[str]]  # sample name -> its label names


def problems(expr: str, exported: Exported, code_words: set[str]) -> list[str]:
    """What ``expr`` uses that the exporter does not export (empty: nothing)."""
    parsed, out = parse_promql(expr), []
    if not parsed.selectors:
        out.append("reads no metric")
    labels: set[str] = set()
    for s in parsed.selectors:
        if s.metric not in exported:
            out.append(f"{s.metric}: not a metric callwarden exports")
            continue
        labels |= exported[s.metric]
        for label, op, value in s.matchers:
            if label not in exported[s.metric]:
                out.append(f"{s.metric}{{{label}}}: no such label")
            if op in ("=", "=~") and not value.startswith("$"):
                for word in value.split("|"):
                    if not re.fullmatch(r"[\w-]+", word) or word not in code_words:
                        out.append(f"{s.metric}{{{label}{op}{value!r}}}: {word!r} is not a "
                                   "value the code writes")
    out += [f"by/on ({g}): no metric here has that label"
            for g in sorted(parsed.grouping - labels)]
    return out


def test_the_promql_check_can_fail() -> None:
    exported = {"a_total": {"kind", "outcome"}, "b": {"role"}}
    words = {"errors"}
    ok = 'sum by (kind) (increase(a_total{outcome="errors"}[15m])) > 5 and on() b > 0'
    assert problems(ok, exported, words) == []
    assert problems('max by (state) (c{kind=~"$kind"}) or b{zone="x"}', exported, words) == [
        "c: not a metric callwarden exports", "b{zone}: no such label",
        "b{zone='x'}: 'x' is not a value the code writes",
        "by/on (state): no metric here has that label"]
    assert problems("vector(1)", exported, words) == ["reads no metric"]
    with pytest.raises(ValueError, match="unknown function"):
        parse_promql("nope(a_total)")
    with pytest.raises(ValueError, match="without a metric name"):
        parse_promql('{__name__="a_total"}')


# -- promtool --------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests() -> None:
    result = run_promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
             for c in t["alert_rule_test"]]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: never shown to fire"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: never shown quiet"
        assert "for" in rule, f"{rule['alert']}: no for: duration"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert "callwarden" in rule["annotations"]["description"], (
            f"{rule['alert']}: the description names no command to run")


def test_the_unit_tests_fail_on_rules_that_never_fire(tmp_path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = f"({rule['expr']}) and on() vector(0) > 1"
    (tmp_path / RULES.name).write_text(yaml.safe_dump(doc), encoding="utf-8")
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = run_promtool("test", "rules", tmp_path / RULE_TESTS.name)
    assert result.returncode != 0, result.stdout
    for rule in rules():
        assert f"alertname: {rule['alert']}," in result.stdout + result.stderr, rule["alert"]


def test_promtool_accepts_every_dashboard_query(tmp_path: Path) -> None:
    """The dashboard's PromQL parses: each target as a recording rule, Grafana's
    variables given values."""
    recorded = [{"record": f"dashboard:query_{n}", "expr": expr.replace(
        "$__rate_interval", "5m").replace("$kind", ".*")}
        for n, (_, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}),
                    encoding="utf-8")
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the Grafana dashboard -------------------------------------------------------------------


def test_the_dashboard_imports_anywhere() -> None:
    d = dashboard()
    assert isinstance(d["schemaVersion"], int)
    assert d["schemaVersion"] >= 36
    assert d["title"]
    assert d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": DS}, v["name"]
    ids = [p["id"] for p in panels(d["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    shown = [p for p in panels(d["panels"]) if p["type"] != "row"]
    assert shown
    for p in shown:
        assert p["datasource"] == {"type": "prometheus", "uid": DS}, p["title"]
        assert p["targets"], p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": DS}, p["title"]
            assert t["expr"].strip(), p["title"]


# -- what the processes export, scraped --------------------------------------------------------


@pytest.fixture
async def service(pool: Pool, tmp_path: Path) -> AsyncIterator[Listeners]:
    async with running_service(pool, tmp_path, ServiceConfig(admin_token=TOKEN)) as urls:
        yield urls


async def _open_call(conn: Conn, kind: str, *, age_s: float = 0.0, sync: bool = False,
                     task_id: str | None = None) -> uuid.UUID:
    job = await create_job(conn, credits=5)
    at = datetime.now(UTC) - timedelta(seconds=age_s)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=at, actor="worker:ops", kind=kind, sync=sync))).projection
    if task_id is not None:
        await append(conn, job, p, TaskCreated(at=at, actor="worker:ops", task_id=task_id))
    return job


async def _force_fail(http: aiohttp.ClientSession, base: str, job: uuid.UUID) -> None:
    async with http.post(f"{base}/admin/jobs/{job}/force-fail",
                         headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200, await resp.text()


async def _scrape(http: aiohttp.ClientSession, base: str) -> str:
    async with http.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def _sample_names(name: str, type_: str) -> list[str]:
    return {"counter": [f"{name}_total", f"{name}_created"],
            "histogram": [f"{name}_bucket", f"{name}_count", f"{name}_sum", f"{name}_created"],
            "summary": [name, f"{name}_count", f"{name}_sum", f"{name}_created"],
            }.get(type_, [name])


def exported_from(text: str) -> tuple[Exported, set[str]]:
    """Sample name -> label names seen, and the family names, of a /metrics text."""
    exported: Exported = {}
    families = set()
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for name in _sample_names(fam.name, fam.type):
            exported.setdefault(name, set())
        for s in fam.samples:
            exported.setdefault(s.name, set()).update(s.labels)
    return exported, families


async def _traffic(conn: Conn, http: aiohttp.ClientSession, service: Listeners,
                   make_reconciler: MakeReconciler) -> uuid.UUID:
    """A little of everything the processes count; the job whose reservation is left
    reserved after its call ended (what the leaked-reservations gauge must see)."""
    await _open_call(conn, "kie-standard", age_s=3600, task_id="t-ops-stale")  # stale
    await _open_call(conn, "replicate-prediction", age_s=5)
    ended = await _open_call(conn, "kie-standard", task_id="t-ops-ended")
    await _force_fail(http, service.operator, ended)  # Cancelled by admin: refunded
    await conn.execute("UPDATE usage_logs SET status = 'reserved' WHERE job_id = %s",
                       (ended,))  # the host re-opens it: leaked
    await _open_call(conn, "kie-llm", age_s=3600, sync=True)  # swept by the pass below
    assert (await make_reconciler().reconcile_once()).swept >= 1
    async with http.post(f"{service.webhooks}/webhooks/replicate", data=b"{}") as resp:
        assert resp.status == 401  # no secret configured
    return ended


async def test_rules_and_dashboard_use_only_what_callwarden_exports(
        conn: Conn, http: aiohttp.ClientSession, service: Listeners,
        make_reconciler: MakeReconciler) -> None:
    ended = await _traffic(conn, http, service, make_reconciler)
    outage = Outage(logging.getLogger("callwarden.test"), "worker ops-test")
    outage.down(DatabaseUnavailable("drill"))  # a loop's outage: the outage gauges live
    try:
        text = await _scrape(http, service.operator)
    finally:
        outage.up()
    exported, families = exported_from(text)

    # the scrape has every family of the process registry, and the SQL-backed gauges
    registry = {m.name for m in REGISTRY.collect()}
    assert registry <= families, registry - families
    assert {"callwarden_calls", "callwarden_calls_ended_recent", "callwarden_calls_stale",
            "callwarden_reservations_leaked_recent",
            "callwarden_jobs_without_call"} <= families
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    leaked = ("callwarden_reservations_leaked_recent", (("kind", "kie-standard"),))
    assert samples[leaked] == 1, ended
    assert samples[("callwarden_reservations_leaked_recent", (("kind", "kie-llm"),))] == 0
    assert samples[("callwarden_database_outage_over_limit", (("role", "worker"),))] == 0

    words = _code_words()
    found: dict[str, list[str]] = {}
    for rule in rules():
        found[f"alert {rule['alert']}"] = problems(rule["expr"], exported, words)
    for where, expr in dashboard_queries():
        found[where] = problems(expr, exported, words)
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), *(\w+)\)", v["query"]["query"])
            assert m is not None, v["query"]
            metric, label = m.groups()
            found[f"variable {v['name']}"] = [] if label in exported.get(metric, set()) else [
                f"label_values({metric}, {label}): not exported"]
    assert {k: v for k, v in found.items() if v} == {}


async def test_leaked_reservations_are_counted_from_indexes(conn: Conn) -> None:
    """metrics_leaked_reservations reads the window through call_events' recorded_at index
    and each call's reservations through usage_logs' job_id index, however many old calls
    and settled reservations the tables hold."""
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, call_state, call_version, provider_kind, "
        "call_settlement) SELECT gen_random_uuid(), 'u', 'completed', 'completed', 1, "
        "'kie-standard', 'committed' FROM generate_series(1, 20000)")
    await conn.execute(
        "INSERT INTO callwarden.call_events (job_id, seq, type, payload, actor, recorded_at) "
        "SELECT id, 1, 'Completed', '{}', 'worker:old', now() - interval '2 days' FROM jobs")
    await conn.execute(
        "INSERT INTO usage_logs (job_id, user_id, status, credits_reserved, credits_charged) "
        "SELECT id, 'u', 'committed', 5, 5 FROM jobs")
    await conn.execute("ANALYZE jobs")
    await conn.execute("ANALYZE callwarden.call_events")
    await conn.execute("ANALYZE usage_logs")
    params = {"since": datetime.now(UTC) - timedelta(hours=1)}
    plan = await (await conn.execute(
        "EXPLAIN (FORMAT JSON) " + QUERIES["metrics_leaked_reservations"], params)).fetchone()
    assert plan is not None

    def nodes(n: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield n
        for child in n.get("Plans", []):
            yield from nodes(child)

    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name"))
             for n in nodes(plan["QUERY PLAN"][0]["Plan"]) if "Relation Name" in n}
    assert not any(t == "Seq Scan" for t, _, _ in scans), scans
    # Both tables read through an index (which one is the planner's choice: the window's
    # recorded_at index, or migration 0009's index of terminal events).
    assert {"call_events", "usage_logs"} <= {
        r for t, r, i in scans if i is not None and "Index" in t}, scans
    rows = await (await conn.execute(QUERIES["metrics_leaked_reservations"], params)
                  ).fetchall()
    assert rows == []  # the old calls are out of the window, and settled anyway
