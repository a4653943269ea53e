"""The own-call queue helpers' set-up, as a host's module runs it at import (review of
issue 25 item 3): the host's own kinds are found, one body serving two kinds is two tasks,
a name is never silently shared, the options a host passes are the ones every process
uses, and a Celery worker whose processes could not open their runtime stops before it
takes a message (exit 2) instead of failing and acking each one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from celery import Celery

from callwarden.calls.config import CallConfig
from callwarden.calls.own import OwnCalls
from callwarden.database.port import Database
from callwarden.errors import ConfigError
from callwarden.providers.base import ProviderSettings
from callwarden.providers.errors import AdapterError
from callwarden.providers.kinds import KINDS, is_sync_call
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue import arq as cw_arq
from callwarden.queue import celery as cw_celery
from callwarden.queue.arq import enqueue_own_call, own_call_function, worker_settings
from callwarden.queue.celery import check_options, own_call_task, register
from callwarden.queue.celery import enqueue_own_call as send_own_call
from callwarden.queue.own import body_bound_s, own_task_name
from callwarden.queue.process import RunnerOptions, longest_run_s
from tests.support.acme import ADAPTER, registry_restored


async def body(call: Any, *args: Any) -> None:
    """A host's body (never run here)."""


async def other(call: Any, *args: Any) -> None:
    """Another body."""


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cw_celery, "_options", None)
    monkeypatch.setattr(cw_celery, "_own_names", {})
    monkeypatch.setattr(cw_celery, "_needed", {})
    monkeypatch.setattr(cw_arq, "_own_kinds", {})
    with registry_restored():
        yield


def _options(tmp_path: Path) -> RunnerOptions:
    return RunnerOptions(database_url="postgresql://127.0.0.1:1/x",
                         settings=ProviderSettings(), media=LocalFolderStore(tmp_path))


def test_one_body_for_two_kinds_is_two_tasks_each_of_its_kind(clean: None) -> None:
    app = Celery("host")
    standard = own_call_task(app, "kie-standard")(body)
    kling = own_call_task(app, "kie-kling3")(body)
    assert (standard.name, kling.name) == (own_task_name(body, "kie-standard"),
                                           own_task_name(body, "kie-kling3"))
    assert standard.name != kling.name
    assert standard.name.endswith(".body:kie-standard")


def test_a_name_given_to_another_kind_or_body_is_refused(clean: None) -> None:
    app = Celery("host")
    own_call_task(app, "kie-standard", name="host.predict")(body)
    own_call_task(app, "kie-standard", name="host.predict")(body)  # the module again: fine
    with pytest.raises(ConfigError, match="already the own call of kie-standard"):
        own_call_task(app, "kie-kling3", name="host.predict")(body)
    with pytest.raises(ConfigError, match="already the own call"):
        own_call_task(app, "kie-standard", name="host.predict")(other)


def test_the_options_a_host_passes_are_kept_and_two_different_ones_refused(
        clean: None, tmp_path: Path) -> None:
    app = Celery("host")
    given = _options(tmp_path)
    register(app, options=given)
    own_call_task(app, "kie-standard")(body)  # no options: the host's are kept
    assert cw_celery._options is given
    with pytest.raises(ConfigError, match="two different RunnerOptions"):
        own_call_task(app, "kie-kling3", options=_options(tmp_path))(body)


def test_a_host_kind_is_found_at_import_without_register(
        clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CALLWARDEN_PROVIDERS`` is read by the helpers themselves (before, only
    ``register`` happened to load it)."""
    monkeypatch.syspath_prepend(str(ADAPTER.parent))
    monkeypatch.setenv("CALLWARDEN_PROVIDERS", "providers:PROVIDERS")
    task = own_call_task(Celery("host"), "acme-render")(body)
    assert task.name.endswith(":acme-render")
    function = own_call_function("acme-render", body)
    assert function.name.endswith(":acme-render")


def test_an_arq_worker_is_timed_for_its_own_functions_kinds_and_names_are_unique(
        clean: None) -> None:
    """One arq worker has one redelivery delay (its longest function timeout + 10 s): the
    own function takes the worker's ``job_timeout``, which fits its kind too."""
    training = own_call_function("replicate-training", body)
    assert training.timeout_s is None
    timed = worker_settings(kinds=["kie-standard"], functions=[training])
    assert timed["job_timeout"] == longest_run_s(kinds=["replicate-training"])
    assert timed["job_timeout"] > longest_run_s(kinds=["kie-standard"])
    with pytest.raises(ConfigError, match="named twice"):
        worker_settings(functions=[own_call_function("kie-standard", body, name="x"),
                                   own_call_function("kie-kling3", body, name="x")])


def test_an_own_body_told_to_create_may_sleep_through_the_providers_429s() -> None:
    """A body told ``create`` may meet a 429, pause the account (``slow_down``) and create
    again after the pause for up to ``rate_limited_wait_s``, as ``CallRunner`` does: its
    bound is the kind's poll budget, a create and a last poll with their retries (60 s
    each by default), and that wait; a body told ``resume`` creates nothing. Every bound
    fits in the queue's (``longest_run_s``: a start before it, finalizing after it)."""
    calls = OwnCalls(cast(Database, object()))  # nothing is opened: settings only
    assert body_bound_s(calls, "kie-standard") == 900 + 2 * 60 + 300 == 1320
    assert body_bound_s(calls, "kie-standard", creates=False) == 900 + 2 * 60 == 1020
    tight = OwnCalls(cast(Database, object()), config=CallConfig(
        poll_budget_s={"kie-standard": 10.0}, rate_limited_wait_s=30.0))
    assert body_bound_s(tight, "kie-standard") == 10 + 120 + 30
    for kind in (k for k in KINDS if not is_sync_call(k)):
        assert body_bound_s(calls, kind) < longest_run_s(kinds=[kind]), kind


def test_a_worker_whose_processes_cannot_run_calls_stops_with_exit_2(
        clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CALLWARDEN_MEDIA_DIR", "CALLWARDEN_MEDIA_S3_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://127.0.0.1:1/x")
    with pytest.raises(SystemExit) as stopped:
        check_options()
    assert stopped.value.code == 2
    monkeypatch.setenv("CALLWARDEN_MEDIA_DIR", "media")
    check_options()  # readable now: the worker goes on


def test_a_client_request_with_an_empty_endpoint_names_the_variable() -> None:
    """What ``provider_settings`` gives an unconfigured host provider (an empty base URL)
    is refused, not used to build relative URLs; a hyphenated name is spelled as its
    variable is."""
    import asyncio

    import aiohttp

    from callwarden.providers.base import Endpoint
    from callwarden.providers.kinds import KINDS, KindSpec
    from callwarden.providers.registry import ClientRequest

    async def check() -> None:
        async with aiohttp.ClientSession() as session:
            request = ClientRequest(kind="acme-ai-render", session=session,
                                    settings=ProviderSettings(),
                                    endpoint=Endpoint(base_url="", api_key=""))
            with pytest.raises(AdapterError, match="CALLWARDEN_ACME_AI_URL"):
                _ = request.base_url

    with registry_restored():
        KINDS["acme-ai-render"] = KindSpec(
            name="acme-ai-render", provider="acme-ai", mode="async", family="render",
            stale_threshold_s=60, result_url_lifetime_s=3600)
        asyncio.run(check())


async def test_an_own_call_is_enqueued_by_its_kind_and_a_missing_or_ambiguous_one_refused(
        clean: None) -> None:
    """``enqueue_own_call`` finds the own task this process made for the kind (issue 41
    item 6: the host wrote the task name and arq's ``_job_id`` by hand); a kind with none,
    or with several and no ``name=``, is a ``ConfigError`` saying which, before anything
    is sent (the real queues: ``tests/acceptance/test_queue_integrations.py``, ``*_own_*``)."""
    app = Celery("host", broker="memory://")
    with pytest.raises(ConfigError, match="none was made in this process"):
        send_own_call(app, "6c7f0d1e-0000-4000-8000-000000000001", "kie-standard")
    with pytest.raises(ConfigError, match="none was made in this process"):
        await enqueue_own_call(None, "job", "kie-standard")  # type: ignore[arg-type]
    own_call_task(app, "kie-standard")(body)
    own_call_task(app, "kie-standard", name="host.again")(other)
    own_call_function("kie-standard", body)
    own_call_function("kie-standard", other, name="host.again")
    with pytest.raises(ConfigError, match=r"2 serve it \(.*host.again.*\): pass name="):
        send_own_call(app, "job", "kie-standard")
    with pytest.raises(ConfigError, match="2 serve it"):
        await enqueue_own_call(None, "job", "kie-standard")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'host\.other' is not one of them"):
        send_own_call(app, "job", "kie-standard", name="host.other")
    other_app = Celery("another")  # another app's tasks are not this one's
    with pytest.raises(ConfigError, match="none was made"):
        send_own_call(other_app, "job", "kie-standard")
