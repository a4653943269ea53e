"""Why a language model stopped, and whether that answer is a result (pure).

An HTTP 200 from a language model is not always an answer: it may have been cut at
``max_tokens`` or at the context window (truncated), stopped for a server-tool loop
(``pause_turn``: unfinished), or refused. Treating those as successes stores a half answer
and charges for it. A policy per kind (:data:`DEFAULT_POLICY`, overridable in
``ProviderSettings.stop_policy``) decides, per ``stop_reason``, ``"succeed"`` or ``"fail"``;
an unknown or missing stop reason fails closed. The stop reason is always kept (in the
event, and in the job's output on success).

Defaults (docs.anthropic.com "Handling stop reasons", and why):

=================================  ========  ===========================================
stop_reason                        default   why
=================================  ========  ===========================================
end_turn                           succeed   the model finished
stop_sequence                      succeed   the caller asked for the cut
tool_use                           succeed   for one call, the tool call is the output
max_tokens                         fail      truncated: sending it again truncates again
model_context_window_exceeded      fail      truncated ("treat as truncated", the docs)
pause_turn                         fail      unfinished: ends on a tool with no result
refusal                            fail      no usable output (``content`` is empty)
anything else, or none             fail      unknown meaning: never a silent success
=================================  ========  ===========================================

Chat-completions answers (KIE's proxy for other models) report ``finish_reason``:
``stop`` is read as ``end_turn``, ``length`` as ``max_tokens``, ``content_filter`` as
``refusal``, ``tool_calls`` / ``function_call`` as ``tool_use``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = ["CHAT_FINISH", "DEFAULT_POLICY", "Decision", "StopPolicy", "failure_code", "judge"]

Decision = Literal["succeed", "fail"]
StopPolicy = Mapping[str, Decision]

DEFAULT_POLICY: Final[StopPolicy] = {
    "end_turn": "succeed", "stop_sequence": "succeed", "tool_use": "succeed",
    "max_tokens": "fail", "model_context_window_exceeded": "fail", "pause_turn": "fail",
    "refusal": "fail",
}

CHAT_FINISH: Final[Mapping[str, str]] = {
    "stop": "end_turn", "length": "max_tokens", "content_filter": "refusal",
    "tool_calls": "tool_use", "function_call": "tool_use",
}

_CODES: Final[Mapping[str, str]] = {
    "max_tokens": "truncated:max_tokens",
    "model_context_window_exceeded": "truncated:context_window",
    "pause_turn": "unfinished:pause_turn",
    "refusal": "refusal",
}


def judge(stop_reason: str | None, policy: StopPolicy | None = None) -> Decision:
    """``"succeed"`` or ``"fail"`` for an answer that stopped for ``stop_reason``."""
    rules = DEFAULT_POLICY if policy is None else {**DEFAULT_POLICY, **policy}
    if stop_reason is None:
        return "fail"
    return rules.get(stop_reason, "fail")


def failure_code(stop_reason: str | None) -> str:
    """The ``UpstreamFailed.code`` of an answer refused for its stop reason."""
    if stop_reason is None:
        return "stop_reason:missing"
    return _CODES.get(stop_reason, f"stop_reason:{stop_reason}")
