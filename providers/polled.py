"""A host's own client made callwarden's by rules instead of a class: :class:`Polled`.

A host whose client of a provider already creates a task (``create(request, *,
callback_url=None)`` answering the task's id) and reads one back (a method answering the
task as the provider describes it, or ``None`` when the provider does not know it) writes
no adapter class. ``Polled`` names that client, the method that reads, and what an answer
means: its state, the states that mean it succeeded and failed, its files, its text, its
error::

    PROVIDER = Provider(name="acme", kinds=(RENDER,), client=Polled(
        AcmeClient, AcmeClient.render, state=lambda r: r["state"], succeeded={"done"},
        failed={"error"}, media=lambda r: [f["url"] for f in r["files"]],
        error=lambda r: r["error"]["message"]))

callwarden builds the client as ``AcmeClient(session, base_url, api_key)`` (the provider's
endpoint: ``CALLWARDEN_ACME_URL`` / ``ACME_API_KEY``, or the host's own names through
``Provider.url_env`` / ``key_env``) for every process that creates or recovers a call.
A read answering ``None`` is :class:`~callwarden.providers.outcomes.NotFound`; a state (a
string, or an enum whose value is one) in ``succeeded`` is
:class:`~callwarden.providers.outcomes.Succeeded` with the answer's files (the list of URL
strings ``media`` gives) and text (a string); a state in ``failed`` is
:class:`~callwarden.providers.outcomes.Failed` with ``error``'s text (the state itself when
there is none, or when the rule finds no error where it reads one) and the state as its
code; any other state is :class:`~callwarden.providers.outcomes.Running` (the kind's
``poll_budget_s`` bounds a state that never ends). It is a host's adapter like any other:
what it answers and raises is checked (:mod:`callwarden.providers.checked`): a rule that
fails on an answer of an unexpected shape (a ``KeyError``), or answers what no outcome can
hold (a state that is not a string, one URL string instead of a list, a URL that is not a
string), is a ``MalformedResponse`` — never a call polled until its budget runs out or one
that succeeds without its files; an HTTP error status the client raises is the error it
means. A provider whose answers need more (a cost, usage, an
inline file) is written as a class (docs/embedding.md, "Your own provider").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import aiohttp

from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Running, Succeeded

if TYPE_CHECKING:
    from callwarden.providers.base import AsyncKindClient
    from callwarden.providers.registry import ClientRequest

__all__ = ["Creates", "Polled"]


class Creates(Protocol):
    """A host's client that starts a task and answers its id (``request``: the job's
    request, a mapping; a client typed for a ``dict`` fits too)."""

    async def create(self, request: Any, *, callback_url: str | None = None) -> str: ...


C = TypeVar("C", bound=Creates)
T = TypeVar("T")


def _state(value: object) -> str:
    """A state as the rules compare it: a string, or an enum's string value."""
    said = value.value if isinstance(value, Enum) else value
    if not isinstance(said, str):
        raise TypeError(f"Polled: a state is a str, not {said!r}")
    return said


@dataclass(frozen=True, kw_only=True)
class _Rules(Generic[T]):
    state: Callable[[T], object]
    succeeded: frozenset[str]
    failed: frozenset[str]
    media: Callable[[T], Iterable[object]] | None
    text: Callable[[T], object] | None
    error: Callable[[T], object] | None

    def outcome(self, answer: T) -> PollOutcome:
        """The outcome ``answer`` is; a rule answering what no outcome can hold (a state
        or a URL that is not a string) raises ``TypeError``: a malformed answer, never a
        call that runs until its budget or succeeds without its files."""
        state = _state(self.state(answer))
        if state in self.succeeded:
            return Succeeded(media_urls=self._urls(answer), text=self._text(answer))
        if state in self.failed:
            return Failed(error=self._error(answer) or state, code=state)
        return Running(raw_state=state)

    def _urls(self, answer: T) -> tuple[str, ...]:
        said = () if self.media is None else self.media(answer)
        if isinstance(said, str | bytes):
            raise TypeError("Polled: media answers a list of URLs, not one string")
        urls: list[str] = []
        for url in said:
            if not isinstance(url, str) or not url:
                raise TypeError(f"Polled: media answered {url!r}, not a URL")
            urls.append(url)
        return tuple(urls)

    def _text(self, answer: T) -> str | None:
        said = None if self.text is None else self.text(answer)
        if said is not None and not isinstance(said, str):
            raise TypeError(f"Polled: text answered a {type(said).__name__}, not a str")
        return said

    def _error(self, answer: T) -> str | None:
        """The failure's text; a failure whose error is not where the rule reads it still
        fails (with its state), it is not a malformed answer."""
        try:
            said = None if self.error is None else self.error(answer)
        except (KeyError, IndexError, TypeError):
            return None
        return None if said in (None, "") else str(said)


class Polled(Generic[C, T]):
    """A :class:`~callwarden.providers.registry.Provider`'s ``client``: the host's
    ``client`` class (built as ``client(session, base_url, api_key)``), polled by
    ``read(client, task_id)`` and told by the rules (the module's docstring)."""

    def __init__(self, client: Callable[[aiohttp.ClientSession, str, str], C],
                 read: Callable[[C, str], Awaitable[T | None]], *,
                 state: Callable[[T], object], succeeded: Collection[str],
                 failed: Collection[str], media: Callable[[T], Iterable[object]] | None = None,
                 text: Callable[[T], object] | None = None,
                 error: Callable[[T], object] | None = None) -> None:
        if isinstance(succeeded, str) or isinstance(failed, str):
            raise TypeError("Polled: succeeded and failed are collections of states "
                            "({'done'}), not one string")
        done, bad = frozenset(map(_state, succeeded)), frozenset(map(_state, failed))
        if not done:
            raise ValueError("Polled: no state means succeeded: every call would run until "
                             "its budget")
        if done & bad:
            raise ValueError(f"Polled: states both succeeded and failed: {sorted(done & bad)}")
        self.client, self.read = client, read
        self.rules = _Rules(state=state, succeeded=done, failed=bad, media=media, text=text,
                            error=error)

    def __call__(self, r: ClientRequest) -> AsyncKindClient:
        return _PolledClient(self, self.client(r.session, r.base_url, r.api_key), r.kind)


class _PolledClient(Generic[C, T]):
    """One call's client: the host's, read by the rules."""

    def __init__(self, polled: Polled[C, T], client: C, kind: str) -> None:
        self.polled, self.client, self.kind = polled, client, kind

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        return await self.client.create(request, callback_url=callback_url)

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        answer = await self.polled.read(self.client, task_id)
        if answer is None:
            return NotFound(message=f"{self.kind}: the provider does not know task {task_id}")
        return self.polled.rules.outcome(answer)
