"""``Polled``: a host's own client (the example host's ``AcmeClient``, unchanged) made an
adapter by rules, polled over HTTP on 127.0.0.1 through the registry as every path polls
(``poll_task``: the runner's, the reconciler's, the webhook receiver's).

What holds: the client is built from the provider's configured endpoint and key; each
state the provider answers is the outcome the rules say (still running, done with its
files, failed with its text and code), an id the provider does not know is ``NotFound``;
a rule that does not fit the answer is a ``MalformedResponse`` naming the provider, never
an outcome; rules that could not be told apart are refused when written."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from enum import Enum
from typing import Any

import aiohttp
import pytest

from callwarden.config import provider_settings
from callwarden.providers.errors import AuthenticationError, MalformedResponse
from callwarden.providers.outcomes import Failed, NotFound, Running, Succeeded
from callwarden.providers.registry import KindSpec, Polled, Provider, poll_task, register
from tests.support.acme import KEY, Acme, load_example_adapter, registry_restored, running_acme

KIND = "acme-polled"
SPEC = KindSpec(name=KIND, provider="acme", mode="async", family="render",
                stale_threshold_s=600, result_url_lifetime_s=3600, poll_interval_s=1.0,
                poll_budget_s=900, media_hosts=("127.0.0.1",))


def rules(**changed: Any) -> Polled[Any, Any]:
    client = load_example_adapter().AcmeClient
    given: dict[str, Any] = dict(
        state=lambda r: r["state"], succeeded={"done"}, failed={"error"},
        media=lambda r: [f["url"] for f in r["files"]], error=lambda r: r["error"]["message"])
    return Polled(client, client.render, **(given | changed))


@pytest.fixture
def registry() -> Iterator[None]:
    with registry_restored():
        yield


@pytest.fixture
async def acme() -> AsyncIterator[Acme]:
    async with running_acme() as server:
        yield server


async def poll(http: aiohttp.ClientSession, acme: Acme, task: str, key: str = KEY,
               **changed: Any) -> object:
    register(Provider(name="acme", kinds=(SPEC,), client=rules(**changed)))
    settings = provider_settings({"CALLWARDEN_ACME_URL": acme.url, "ACME_API_KEY": key})
    return await poll_task(KIND, task, http, settings)


async def created(http: aiohttp.ClientSession, acme: Acme, prompt: str) -> str:
    client = load_example_adapter().AcmeClient(http, acme.url, KEY)
    return str(await client.create({"prompt": prompt}))


async def test_each_state_is_the_outcome_the_rules_say(
        registry: None, http: aiohttp.ClientSession, acme: Acme) -> None:
    fine, bad = await created(http, acme, "a fox"), await created(http, acme, "a wall")
    acme.failing.add("a wall")
    assert await poll(http, acme, fine) == Running(raw_state="rendering")
    acme.release()
    assert await poll(http, acme, fine) == Succeeded(
        media_urls=(f"{acme.url}/files/{fine}.png",))
    assert await poll(http, acme, bad) == Failed(error="the scene would not render",
                                                 code="error")
    assert await poll(http, acme, "r_404") == NotFound(
        message=f"{KIND}: the provider does not know task r_404")
    # without an error rule a failure says its state; a text rule's answer is the text
    assert await poll(http, acme, bad, error=None) == Failed(error="error", code="error")
    assert await poll(http, acme, fine, text=lambda r: r["id"]) == Succeeded(
        media_urls=(f"{acme.url}/files/{fine}.png",), text=fine)
    assert acme.polls == {fine: 3, bad: 2}  # one request per poll


async def test_the_client_is_built_from_the_providers_endpoint_and_key(
        registry: None, http: aiohttp.ClientSession, acme: Acme) -> None:
    task = await created(http, acme, "a fox")
    with pytest.raises(AuthenticationError, match="acme adapter's poll"):
        await poll(http, acme, task, key="not-the-key")
    assert acme.polls[task] == 0  # refused at the door, by the key it was given


async def test_a_rule_that_does_not_fit_the_answer_is_malformed(
        registry: None, http: aiohttp.ClientSession, acme: Acme) -> None:
    task = await created(http, acme, "a fox")
    acme.release()
    with pytest.raises(MalformedResponse, match=r"acme adapter's poll\(\) raised KeyError"):
        await poll(http, acme, task, media=lambda r: [f["href"] for f in r["files"]])


@pytest.mark.parametrize(("changed", "said"), [
    ({"media": lambda r: r["files"][0]["url"]}, "a list of URLs, not one string"),
    ({"media": lambda r: [None]}, "media answered None, not a URL"),
    ({"media": lambda r: [b"http://x/1.png"]}, "not a URL"),
    ({"state": lambda r: 2}, "a state is a str, not 2"),
    ({"text": lambda r: {"content": "hi"}}, "text answered a dict, not a str"),
])
async def test_a_rule_answering_what_no_outcome_holds_is_malformed(
        registry: None, http: aiohttp.ClientSession, acme: Acme, changed: dict[str, Any],
        said: str) -> None:
    """Never a call that succeeds without its files (one URL read as its characters, a
    URL dropped) nor one polled as running until its budget (a state that is no string)."""
    task = await created(http, acme, "a fox")
    acme.release()
    with pytest.raises(MalformedResponse, match=said):
        await poll(http, acme, task, **changed)


class State(Enum):
    DONE = "done"
    ERROR = "error"


async def test_enum_states_and_a_failure_without_its_error_body(
        registry: None, http: aiohttp.ClientSession, acme: Acme) -> None:
    fine, bad = await created(http, acme, "a fox"), await created(http, acme, "a wall")
    acme.failing.add("a wall")
    acme.release()
    as_enum: dict[str, Any] = {"state": lambda r: State(r["state"]), "succeeded": {State.DONE},
               "failed": [State.ERROR]}
    assert await poll(http, acme, fine, **as_enum) == Succeeded(
        media_urls=(f"{acme.url}/files/{fine}.png",))
    # an error read where the answer has none: still the failure, told by its state
    assert await poll(http, acme, bad, error=lambda r: r["detail"]["text"]) == Failed(
        error="error", code="error")


def test_rules_that_cannot_be_told_apart_are_refused() -> None:
    with pytest.raises(TypeError, match="collections of states"):
        rules(succeeded="done")
    with pytest.raises(ValueError, match=r"both succeeded and failed: \['done'\]"):
        rules(failed={"done", "error"})
    with pytest.raises(ValueError, match="no state means succeeded"):
        rules(succeeded=iter(()))
    with pytest.raises(TypeError, match="a state is a str, not 2"):
        rules(failed={2})
