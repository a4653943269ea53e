"""A host's provider adapters: how they are found, what registering one changes, what a
bad one gets (issue 25 item 1). The end-to-end run through real processes is
``tests/acceptance/test_host_adapter.py``."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from callwarden.cli.main import main
from callwarden.config import load_providers, provider_settings
from callwarden.errors import ConfigError
from callwarden.providers.adapters import load_adapters
from callwarden.providers.checked import CheckedAsyncClient, CheckedSyncClient
from callwarden.providers.errors import (
    AdapterError,
    MalformedResponse,
    ProviderError,
    RateLimited,
    TransientError,
    UnknownProviderKind,
)
from callwarden.providers.kinds import KINDS, KindSpec, get_kind
from callwarden.providers.outcomes import PollOutcome, Running, SyncOutcome
from callwarden.providers.registry import (
    PROVIDERS,
    WEBHOOKS,
    ClientRequest,
    Provider,
    client_for,
    media_fetch_for,
    poll_task,
    provider_for,
    register,
)
from callwarden.reconciler.config import load_config
from tests.support.acme import load_example_adapter, registry_restored


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    with registry_restored():
        yield


@pytest.fixture
def host_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host's folder on the path with a module re-exporting the example adapter."""
    load_example_adapter()
    (tmp_path / "acme_adapters.py").write_text(textwrap.dedent("""
        from acme_host_providers import PROVIDER, RENDER
        from callwarden.providers.registry import Provider
        ALL = [PROVIDER]
        def make() -> Provider:
            return PROVIDER
        NOT_A_PROVIDER = {"name": "acme"}
        EMPTY: list[Provider] = []
        def raises() -> Provider:
            raise RuntimeError("db down at import of adapters")
        NONE_KINDS = Provider(name="acme2", client=PROVIDER.client, kinds=None)
        OTHER = Provider(name="acme", client=PROVIDER.client, kinds=(RENDER,))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def spec(name: str = "acme-video", provider: str = "acme", **changes: Any) -> KindSpec:
    base = KindSpec(name=name, provider=provider, mode="async", family="video",
                    stale_threshold_s=600, result_url_lifetime_s=3600)
    return msgspec.structs.replace(base, **changes)


def dummy(r: ClientRequest) -> Any:
    raise AssertionError("not built in these tests")


@pytest.mark.parametrize("ref", ["acme_adapters:PROVIDER", "acme_adapters:ALL",
                                 "acme_adapters:make"])
def test_a_provider_named_by_the_setting_is_known_everywhere_a_built_in_one_is(
        host_root: Path, ref: str) -> None:
    with pytest.raises(UnknownProviderKind):
        get_kind("acme-render")
    assert load_adapters({"CALLWARDEN_PROVIDERS": ref}) == (f"CALLWARDEN_PROVIDERS {ref}",)
    assert get_kind("acme-render").stale_threshold_s == 600
    assert provider_for("acme-render").name == "acme"
    env = {"CALLWARDEN_PROVIDERS": ref, "CALLWARDEN_ACME_URL": "http://127.0.0.9:8123/",
           "ACME_API_KEY": "k-1"}
    settings = provider_settings(env)
    assert settings.endpoints["acme"].base_url == "http://127.0.0.9:8123"
    assert settings.endpoints["acme"].api_key == "k-1"
    policy = media_fetch_for("acme-render", settings).policy
    assert policy.allows_url("https://files.acme.example/r_1.png")  # its declared host
    assert policy.allows_url("http://127.0.0.9:8123/files/r_1.png")  # its configured endpoint
    assert not policy.allows_url("https://replicate.delivery/x.png")
    # the reconciler's settings name the host's kind like any other
    config = load_config(env={**env, "CALLWARDEN_RECONCILE_THRESHOLD_ACME_RENDER": "300"})
    assert config.threshold_for("acme-render") == 300
    assert load_adapters({"CALLWARDEN_PROVIDERS": ref}) == ()  # once per process


def test_without_its_setting_the_endpoint_is_the_adapters_default(host_root: Path) -> None:
    settings = provider_settings({"CALLWARDEN_PROVIDERS": "acme_adapters:PROVIDER"})
    assert settings.endpoints["acme"].base_url == "https://api.acme.example"


@pytest.mark.parametrize(("ref", "said"), [
    ("acme_adapters:NOT_A_PROVIDER", "expected a callwarden Provider"),
    ("acme_adapters:EMPTY", "got list"),
    ("acme_adapters:MISSING", "AttributeError"),
    ("no_such_module:X", "ModuleNotFoundError"),
    ("acme_adapters", "is not module:attr"),
    ("acme_adapters:raises", "RuntimeError: db down at import of adapters"),
    ("acme_adapters:NONE_KINDS", "cannot register it: TypeError"),
])
def test_a_source_that_is_no_provider_is_a_config_error_naming_it(
        host_root: Path, ref: str, said: str) -> None:
    before = dict(KINDS), dict(PROVIDERS)
    with pytest.raises(ConfigError) as caught:
        load_providers({"CALLWARDEN_PROVIDERS": ref})
    assert said in str(caught.value)
    assert ref in str(caught.value)
    assert (dict(KINDS), dict(PROVIDERS)) == before


@pytest.mark.parametrize(("provider", "said"), [
    (Provider(name="acme", client=dummy, kinds=(spec(name="kie-standard"),)),
     "is served by provider 'kie'"),
    (Provider(name="acme", client=dummy, kinds=(spec(provider="other"),)),
     "of provider 'other'"),
    (Provider(name="acme", client=dummy, kinds=(spec(stale_threshold_s=3600),)),
     "must be below result_url_lifetime_s"),
    (Provider(name="acme", client=dummy, kinds=(spec(stale_threshold_s=float("nan")),)),
     "stale_threshold_s must be a number of seconds > 0"),
    (Provider(name="acme", client=dummy, kinds=(spec(name="Acme Video"),)), "a kind's name"),
    (Provider(name="ACME", client=dummy), "provider name 'ACME'"),
    (Provider(name="redis", client=dummy), "would collide with callwarden's own"),
    (Provider(name="media-s3-endpoint", client=dummy), "CALLWARDEN_MEDIA_S3_ENDPOINT_URL"),
    (Provider(name="callback-base", client=dummy), "would collide"),
    (Provider(name="acme", client=dummy, kinds=(spec(), spec(name="x", poll_interval_s=0))),
     "poll_interval_s"),
])
def test_a_provider_that_cannot_be_registered_registers_nothing(
        provider: Provider, said: str) -> None:
    before = dict(KINDS), dict(PROVIDERS)
    with pytest.raises(AdapterError, match=said):
        register(provider)
    assert (dict(KINDS), dict(PROVIDERS)) == before


def test_the_fourteen_built_in_kinds_are_adapters_in_the_same_registry() -> None:
    declared = {s.name for p in PROVIDERS.values() for s in p.kinds}
    assert declared == set(KINDS)
    assert len(declared) == 14


class Answers:
    """A host client answering whatever the test gives it."""

    kind = "acme-video"

    def __init__(self, answer: object = None, error: BaseException | None = None) -> None:
        self.answer, self.error = answer, error

    async def _give(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.answer

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None
                     ) -> str:
        return await self._give()  # type: ignore[no-any-return]

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        return await self._give()  # type: ignore[no-any-return]

    async def call(self, request: Mapping[str, Any]) -> SyncOutcome:
        return await self._give()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("answer", "error", "raised"), [
    ({"state": "done"}, None, MalformedResponse),
    (None, KeyError("render"), MalformedResponse),
    (None, aiohttp.ClientConnectionError("reset"), TransientError),
    (None, TimeoutError(), TransientError),
])
async def test_what_a_host_adapter_answers_is_checked(answer: object, error: Exception | None,
                                                      raised: type[Exception]) -> None:
    client = CheckedAsyncClient(Answers(answer, error), "acme")
    with pytest.raises(raised, match="acme adapter's poll"):
        await client.poll("r_1")
    with pytest.raises(raised):
        await CheckedSyncClient(Answers(answer, error), "acme").call({})


@pytest.mark.parametrize("task_id", ["", "   ", 42, None, "x" * 513])
async def test_a_task_id_that_is_no_id_is_refused_before_it_is_recorded(task_id: object
                                                                        ) -> None:
    with pytest.raises(MalformedResponse, match="task id"):
        await CheckedAsyncClient(Answers(task_id), "acme").create({})


async def test_a_running_answer_passes_unchanged() -> None:
    answer = Running(raw_state="rendering")
    assert await CheckedAsyncClient(Answers(answer), "acme").poll("r_1") is answer


async def test_host_clients_are_checked_built_in_clients_are_not(host_root: Path) -> None:
    load_adapters({"CALLWARDEN_PROVIDERS": "acme_adapters:PROVIDER"})
    settings = provider_settings({})
    async with aiohttp.ClientSession() as session:
        assert isinstance(client_for("acme-render", session, settings), CheckedAsyncClient)
        assert not isinstance(client_for("kie-standard", session, settings),
                              CheckedAsyncClient)


async def test_a_host_client_for_a_built_in_provider_serves_its_kinds_recovery_too() -> None:
    """A host with its own Replicate client registers it under ``replicate``: the
    reconciler's one poll (``poll_task``) goes through the host's client, the kinds and
    their thresholds stay the built-in ones, and its answers are checked."""
    class HostReplicate(Answers):
        kind = "replicate-prediction"

    register(Provider(name="replicate", client=lambda r: HostReplicate(
        Running(raw_state="host-client")), kinds=()))
    assert get_kind("replicate-prediction").stale_threshold_s == 1200
    async with aiohttp.ClientSession() as session:
        outcome = await poll_task("replicate-prediction", "p-1", session, provider_settings({}))
    assert outcome == Running(raw_state="host-client")


def test_a_second_adapter_for_a_name_another_holds_is_refused(host_root: Path) -> None:
    load_adapters({"CALLWARDEN_PROVIDERS": "acme_adapters:PROVIDER"})
    before = dict(KINDS), dict(PROVIDERS)
    with pytest.raises(AdapterError, match="already registered by another adapter"):
        load_adapters({"CALLWARDEN_PROVIDERS": "acme_adapters:OTHER"})
    assert (dict(KINDS), dict(PROVIDERS)) == before


def test_a_host_replacing_a_built_in_provider_keeps_what_it_leaves_unset() -> None:
    """Its webhook route, its endpoint and how its media are fetched stay the built-in's
    (before, a host's own Replicate client dropped the route and refused any output that
    was not an image, a video or audio)."""
    settings = provider_settings({"CALLWARDEN_ELEVENLABS_URL": "http://127.0.0.8:9",
                                  "ELEVENLABS_API_KEY": "el-key"})
    fetch_before = media_fetch_for("elevenlabs-async", settings)
    replicate_before = media_fetch_for("replicate-prediction", settings)
    for name in ("replicate", "elevenlabs"):
        register(Provider(name=name, client=dummy))
    assert set(WEBHOOKS) == {"kie", "replicate", "elevenlabs"}
    assert PROVIDERS["replicate"].endpoint_in(settings) == settings.replicate
    assert media_fetch_for("elevenlabs-async", settings) == fetch_before  # key, host kept
    assert media_fetch_for("replicate-prediction", settings) == replicate_before  # any file


async def test_what_a_host_adapter_raises_when_called_is_checked_too() -> None:
    class Careless:
        kind = "acme-video"

        async def create(self, request: Mapping[str, Any]) -> str:  # no callback_url
            return "t-1"

        def poll(self, task_id: str, *, created_at: float | None = None) -> Any:
            raise KeyError("render")  # a plain def that raises before any await

    client = CheckedAsyncClient(Careless(), "acme")  # type: ignore[arg-type]
    with pytest.raises(MalformedResponse, match="TypeError"):
        await client.create({})
    with pytest.raises(MalformedResponse, match="KeyError"):
        await client.poll("t-1")


def test_the_command_names_a_source_that_does_not_load_as_written(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2, before connecting, the reference as the host wrote it (``nope:X:`` was
    rendered as an emoji code, a cross, by the console)."""
    monkeypatch.setenv("CALLWARDEN_PROVIDERS", "nope:X")
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert "CALLWARDEN_PROVIDERS nope:X: cannot load it: ModuleNotFoundError" in err
    assert "database unavailable" not in err


async def test_a_client_request_hands_its_endpoint_and_names_the_setting_it_lacks() -> None:
    """A client class can be the Provider's factory: the request gives it ``base_url`` and
    ``api_key``; without an endpoint, reading them is an AdapterError naming the variable
    (of the kind's provider, not a guess from the kind's name)."""
    from callwarden.providers.base import Endpoint, ProviderSettings
    from callwarden.providers.errors import AdapterError
    from callwarden.providers.registry import ClientRequest

    async with aiohttp.ClientSession() as session:
        given = ClientRequest(kind="kie-standard", session=session,
                              settings=ProviderSettings(),
                              endpoint=Endpoint(base_url="http://127.0.0.9:1", api_key="k"))
        assert (given.base_url, given.api_key) == ("http://127.0.0.9:1", "k")
        bare = ClientRequest(kind="replicate-prediction", session=session,
                             settings=ProviderSettings())
        with pytest.raises(AdapterError, match="CALLWARDEN_REPLICATE_URL"):
            _ = bare.base_url
        with pytest.raises(AdapterError, match="CALLWARDEN_REPLICATE_URL"):
            _ = bare.api_key


@pytest.mark.parametrize("builtin", [False, True])
def test_a_provider_is_configured_once_under_the_hosts_names_or_callwardens(
        builtin: bool) -> None:
    """A host whose own code reads ``ACME_BASE_URL`` and ``ACME_TOKEN`` names them on its
    ``Provider`` (``url_env``, ``key_env``): every actor then reads the provider's URL and
    key from them, and the host sets each once (issue 41 item 6: before, it set its own
    names and callwarden's ``CALLWARDEN_ACME_URL`` / ``ACME_API_KEY`` both). Callwarden's
    names, where set, win. The same holds for a host's client of a built-in provider."""
    name, spec = ("replicate", ()) if builtin else ("acme", (KindSpec(
        name="acme-render", provider="acme", mode="async", family="render",
        stale_threshold_s=600, result_url_lifetime_s=3600),))
    register(Provider(name=name, client=dummy, kinds=spec, url_env="ACME_BASE_URL",
                      key_env="ACME_TOKEN", default_url="https://api.acme.example"))
    own = {"ACME_BASE_URL": "http://127.0.0.9:8123/", "ACME_TOKEN": "host-key"}
    found = PROVIDERS[name].endpoint_in(provider_settings(own))
    assert found is not None
    assert (found.base_url, found.api_key) == ("http://127.0.0.9:8123", "host-key")
    upper = name.upper()
    theirs = {**own, f"CALLWARDEN_{upper}_URL": "http://127.0.0.7:1",
              "REPLICATE_API_TOKEN" if builtin else "ACME_API_KEY": "cw-key"}
    found = PROVIDERS[name].endpoint_in(provider_settings(theirs))
    assert found is not None
    assert (found.base_url, found.api_key) == ("http://127.0.0.7:1", "cw-key")
    if builtin:  # a built-in provider's URL is checked, the error naming the variable read
        with pytest.raises(ConfigError, match="ACME_BASE_URL: the provider's base URL"):
            provider_settings({"ACME_BASE_URL": "https://api.replicate.com/v1"})


@pytest.mark.parametrize(("status", "error"), [
    (400, "BadRequest"), (404, "BadRequest"), (401, "AuthenticationError"),
    (403, "AuthenticationError"), (402, "InsufficientCredits"), (429, "RateLimited"),
    (408, "TransientError"), (500, "TransientError"), (503, "TransientError")])
async def test_an_http_status_the_hosts_client_raises_is_the_error_it_means(
        status: int, error: str) -> None:
    """A host's client that calls aiohttp's ``raise_for_status()`` needs no mapping of its
    own (issue 41 item 6): a create refused with a 4xx is refused (``BadRequest``, failed
    and refunded at once; before, every ``ClientResponseError`` was a ``TransientError``,
    an ambiguous create left for the reconciler's threshold), a 429 is ``RateLimited``
    with its ``Retry-After``, a 5xx stays transient."""
    from yarl import URL

    class RaisesForStatus:
        kind = "acme-video"

        async def create(self, request: Mapping[str, Any], *,
                         callback_url: str | None = None) -> str:
            info = aiohttp.RequestInfo(URL("http://acme.test/v2/renders?sig=s"), "POST",
                                       CIMultiDictProxy(CIMultiDict()),
                                       URL("http://acme.test/v2/renders?sig=s"))
            raise aiohttp.ClientResponseError(info, (), status=status, message="no",
                                              headers=CIMultiDictProxy(CIMultiDict(
                                                  {"Retry-After": "7"})))

        async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
            return Running(raw_state="x")

    with pytest.raises(ProviderError) as caught:
        await CheckedAsyncClient(RaisesForStatus(), "acme").create({})
    assert type(caught.value).__name__ == error
    assert caught.value.status == status
    assert f"HTTP {status} no (POST http://acme.test/v2/renders)" in str(caught.value)
    if status == 429:
        assert isinstance(caught.value, RateLimited)
        assert caught.value.retry_after == 7.0
