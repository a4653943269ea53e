"""``kie-llm`` answers, pure: an Anthropic message (``/claude/v1/messages``) or a
``chat.completion``, judged by its stop reason; KIE's ``credits_consumed`` is the cost."""

from __future__ import annotations

from typing import Any

import msgspec

from callwarden.providers.anthropic.wire import judged, message_text, message_usage
from callwarden.providers.errors import MalformedResponse
from callwarden.providers.kie.wire import (
    PROVIDER,
    classify_kie,
)
from callwarden.providers.llm_stop import CHAT_FINISH, StopPolicy
from callwarden.providers.outcomes import (
    Failed,
    Succeeded,
    Usage,
    reported_cost,
    reported_number,
)
from callwarden.providers.raw import RawResponse

__all__ = ["parse_llm"]


def _chat_answer(body: dict[str, Any]) -> tuple[str, str | None] | None:
    """(text, stop reason) of a ``chat.completion``, or ``None`` if it is not one."""
    choices = body.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return None
    message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    message = message if isinstance(message, dict) else {}
    text = message.get("content")
    if not (isinstance(text, str) and text):
        calls = message.get("tool_calls")
        text = msgspec.json.encode(calls).decode() if isinstance(calls, list) and calls \
            else ""
    stop = CHAT_FINISH.get(finish, finish) if isinstance(finish, str) else None
    return text, stop

def _chat_usage(body: dict[str, Any]) -> Usage:
    usage: Usage = {}
    reported = body.get("usage")
    if isinstance(reported, dict):
        for ours, theirs in (("input_tokens", "prompt_tokens"),
                             ("output_tokens", "completion_tokens")):
            number = reported_number(reported.get(theirs))
            if number is not None:
                usage[ours] = number
    if isinstance(body.get("model"), str) and body["model"]:
        usage["model"] = body["model"]
    return usage

def parse_llm(raw: RawResponse, stop_policy: StopPolicy | None = None) -> Succeeded | Failed:
    """An Anthropic message (``/claude/v1/messages``) or a ``chat.completion``: its text,
    judged by its stop reason (:mod:`callwarden.providers.llm_stop`); ``cost`` is KIE's top-level
    ``credits_consumed`` (KIE credits), also in ``usage["provider_credits"]``."""
    err = classify_kie(raw)
    if err is not None:
        raise err
    body = raw.json(PROVIDER)
    if not isinstance(body, dict):
        raise MalformedResponse(f"kie-llm answer is not an object: {raw.body[:200]!r}",
                                provider=PROVIDER, status=raw.status)
    cost = reported_cost(body.get("credits_consumed"))
    if isinstance(body.get("content"), list):
        text = message_text(body["content"], raw)
        usage = message_usage(body)
    elif (chat := _chat_answer(body)) is not None:
        text, stop = chat
        body = {**body, "stop_reason": stop}
        usage = _chat_usage(body)
    else:
        raise MalformedResponse(f"kie-llm answer has neither content nor choices: "
                                f"{raw.body[:200]!r}", provider=PROVIDER, status=raw.status)
    if cost is not None:
        usage["provider_credits"] = cost
    outcome = judged(body, text, stop_policy, usage)
    return msgspec.structs.replace(outcome, cost=cost) if isinstance(outcome, Succeeded) \
        else outcome
