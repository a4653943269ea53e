"""Every registered kind resolves to a client of the right shape; unknown kinds are typed
errors."""

from __future__ import annotations

from dataclasses import replace

import aiohttp
import msgspec
import pytest

from callwarden.providers.base import AsyncKindClient, ProviderSettings, SyncKindClient
from callwarden.providers.errors import UnknownProviderKind
from callwarden.providers.kinds import KINDS, KindSpec, is_sync_call
from callwarden.providers.media import ANY_FILE
from callwarden.providers.registry import (
    PROVIDERS,
    WEBHOOKS,
    ClientRequest,
    Provider,
    client_for,
    provider_for,
)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_every_kind_has_a_client_matching_its_mode(kind: str) -> None:
    async with aiohttp.ClientSession() as session:
        client = client_for(kind, session, ProviderSettings.for_simulator("http://127.0.0.1:1"))
        assert client.kind == kind
        if is_sync_call(kind):
            assert hasattr(client, "call")
            assert not hasattr(client, "create")
        else:
            assert hasattr(client, "create")
            assert hasattr(client, "poll")


@pytest.mark.parametrize("operation", ["voice-clone", "voice-design", "forced-alignment"])
async def test_elevenlabs_sync_operations_get_the_sync_client(operation: str) -> None:
    assert is_sync_call("elevenlabs-async", operation)
    async with aiohttp.ClientSession() as session:
        client = client_for("elevenlabs-async", session, ProviderSettings(),
                            operation=operation)
        assert hasattr(client, "call")


async def test_unknown_kind_is_a_typed_error() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UnknownProviderKind, match="midjourney"):
            client_for("midjourney", session, ProviderSettings())


def test_fourteen_kinds_with_the_seed_thresholds() -> None:
    minutes = {k: v.stale_threshold_s / 60 for k, v in KINDS.items()}
    assert minutes == {
        "kie-standard": 10, "kie-veo": 25, "kie-suno": 30, "kie-kontext": 10, "kie-luma": 25,
        "kie-kling3": 25, "kie-runway": 25, "kie-lip-sync": 75, "kie-llm": 5,
        "replicate-prediction": 20, "replicate-training": 30, "elevenlabs-async": 15,
        "elevenlabs-sync": 5, "anthropic-sync": 5}
    for spec in KINDS.values():
        if spec.result_url_lifetime_s is not None:
            assert spec.stale_threshold_s < spec.result_url_lifetime_s


def test_media_fetch_options_come_from_the_kind() -> None:
    from callwarden.providers.media import DEFAULT_MEDIA_TYPES
    from callwarden.providers.registry import media_fetch_for

    settings = ProviderSettings.for_simulator("http://127.0.0.1:1", api_key="k")
    dub = media_fetch_for("elevenlabs-async", settings).credentials
    assert dub is not None
    assert (dub.origin, dub.headers) == (("http", "127.0.0.1", 1), {"xi-api-key": "k"})
    assert dub.for_url("http://127.0.0.1:1/elevenlabs/v1/dubbing/d/audio/es") == {
        "xi-api-key": "k"}
    for elsewhere in ("http://127.0.0.1:2/x", "https://127.0.0.1:1/x", "http://localhost:1/x"):
        assert dub.for_url(elsewhere) is None
    assert media_fetch_for("replicate-training", settings).allowed_types == ANY_FILE
    assert media_fetch_for("replicate-prediction", settings).allowed_types == ANY_FILE
    plain = media_fetch_for("kie-standard", settings)
    assert (plain.credentials, plain.allowed_types) == (None, DEFAULT_MEDIA_TYPES)
    assert media_fetch_for("midjourney", settings).credentials is None


def _acme_spec() -> KindSpec:
    """A kind of a provider the table does not hold (``provider`` is a Literal of the
    built-in names, so the spec is decoded, as a host's declaration would be)."""
    raw = msgspec.to_builtins(KINDS["anthropic-sync"])
    return msgspec.convert({**raw, "name": "acme-sync", "provider": "acme"}, KindSpec,
                           strict=False)


def test_every_provider_of_a_kind_has_an_entry_and_webhooks_follow_the_table() -> None:
    assert {spec.provider for spec in KINDS.values()} <= set(PROVIDERS)
    assert {name: p.webhook for name, p in PROVIDERS.items()
                        if p.webhook is not None} == WEBHOOKS


async def test_a_kind_whose_provider_has_no_entry_is_a_typed_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Never another provider's client (the old if-chain fell through to Anthropic's)."""
    monkeypatch.setitem(KINDS, "acme-sync", _acme_spec())
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UnknownProviderKind, match="acme"):
            client_for("acme-sync", session, ProviderSettings())


async def test_a_registered_provider_serves_its_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ClientRequest] = []

    def acme(request: ClientRequest) -> AsyncKindClient | SyncKindClient:
        made.append(request)
        return PROVIDERS["anthropic"].client(replace(request, kind="anthropic-sync"))

    entry = Provider(name="acme", client=acme, endpoint=lambda s: s.anthropic)
    monkeypatch.setitem(KINDS, "acme-sync", _acme_spec())
    monkeypatch.setitem(PROVIDERS, "acme", entry)
    assert provider_for("acme-sync") is entry
    async with aiohttp.ClientSession() as session:
        client_for("acme-sync", session, ProviderSettings(), callback_url="u")
    assert [(r.kind, r.callback_url) for r in made] == [("acme-sync", "u")]
