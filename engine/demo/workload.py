"""What the demo asks for: N jobs over all 14 provider kinds, each with a request its
client accepts and a simulator script (success, slow, upstream failure, stuck forever,
vanished, a hanging sync call), drawn from a seeded RNG; and the host's price list the
demo charges completed calls by (:data:`DEMO_PRICING`). Pure: no I/O."""

from __future__ import annotations

import random
from typing import Any

import msgspec

from callwarden.calls.pricing import Rate, RateTable
from callwarden.providers.kinds import KINDS

__all__ = ["DEMO_PRICING", "PlannedJob", "plan_jobs", "scenario_script"]

# A host's price list, from the usage each provider reports: what a completed call costs
# the user. Below the reservation, the rest is released (a partial commit); above it, the
# reservation is the cap. Kinds without a rate are charged their reservation.
DEMO_PRICING = RateTable(rates=(
    Rate(kind="anthropic-sync", unit="input_tokens", credits=0.5, per=1000),
    Rate(kind="anthropic-sync", unit="output_tokens", credits=0.25),
    Rate(kind="kie-llm", unit="provider_credits", credits=20),
    Rate(kind="replicate-prediction", unit="predict_time_s", credits=4),
    Rate(kind="elevenlabs-sync", unit="characters", credits=0.25),
    Rate(kind="kie-standard", unit="call", credits=6),
))

# A valid request for each kind (the simulator's script goes in "_sim").
REQUESTS: dict[str, dict[str, Any]] = {
    "kie-standard": {"model": "nano-banana-pro", "input": {"prompt": "a lighthouse"}},
    "kie-veo": {"prompt": "a dog in a park", "model": "veo3_fast"},
    "kie-suno": {"prompt": "a sea shanty", "customMode": False, "instrumental": True,
                 "model": "V4_5"},
    "kie-kontext": {"prompt": "add a red hat", "aspectRatio": "1:1"},
    "kie-luma": {"prompt": "make it rain", "videoUrl": "https://example.com/in.mp4"},
    "kie-kling3": {"model": "kling-3.0/video", "input": {"prompt": "a comet",
                                                       "duration": "5"}},
    "kie-runway": {"prompt": "a river at dawn", "duration": 5, "quality": "720p",
                   "aspectRatio": "16:9"},
    "kie-lip-sync": {"model": "infinitalk/from-audio", "input": {
        "image_url": "https://example.com/face.png",
        "audio_url": "https://example.com/voice.mp3", "prompt": "speak"}},
    "kie-llm": {"model": "claude-sonnet-4-6", "max_tokens": 64,
                "messages": [{"role": "user", "content": "a haiku"}]},
    "replicate-prediction": {"version": "stability-ai/sdxl", "input": {"prompt": "a fox"}},
    "replicate-training": {"model": "ostris/flux-dev-lora-trainer", "version": "a" * 64,
                           "destination": "demo/my-lora", "input": {"steps": 100}},
    "elevenlabs-async": {"source_url": "https://example.com/clip.mp4", "target_lang": "es",
                         "name": "clip"},
    "elevenlabs-sync": {"operation": "tts", "voice_id": "JBFqnCBsd6RMkjVDRZzb",
                        "text": "Hello from the demo"},
    "anthropic-sync": {"model": "claude-sonnet-4-6", "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hello"}]},
}

# scenario -> weight
SCENARIOS = {"ok": 62, "slow": 12, "fail": 10, "stuck": 7, "vanish": 5, "hang": 4}


class PlannedJob(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    scenario: str
    request: dict[str, Any]
    operation: str | None = None
    credits: float = 10.0
    in_workflow: bool = False


def scenario_script(scenario: str, rng: random.Random, sync: bool) -> dict[str, Any]:
    """The simulator script for a scenario (steps advance in simulated seconds)."""
    run_s = round(rng.uniform(0.5, 2.0), 2)
    if sync:
        hang = {"hang": 8.0, "slow": 1.0}.get(scenario, 0.0)
        end = "failed" if scenario == "fail" else "succeeded"
        return {"steps": [], "end": end, "hang_s": hang, "error": "content policy"}
    steps = [{"phase": "queued", "seconds": 0.2},
             {"phase": "running", "seconds": run_s * (4 if scenario == "slow" else 1),
              "progress": 50.0}]
    end = {"fail": "failed", "stuck": "stuck", "vanish": "vanished"}.get(scenario,
                                                                         "succeeded")
    # A third of the callbacks are dropped, some duplicated, some refused at first and
    # retried on the provider's own schedule (late, racing the reconciler): polling and
    # the reconciler must not depend on them, and duplicates must be harmless.
    webhook = {"drop": rng.random() < 0.33, "duplicates": int(rng.random() < 0.2),
               "fail_first": int(rng.random() < 0.25)}
    return {"steps": steps, "end": end, "error": "generation failed: content policy",
            "webhook": webhook}


def _scenario(rng: random.Random, sync: bool) -> str:
    names = [s for s in SCENARIOS if not (sync and s in ("stuck", "vanish"))]
    return rng.choices(names, weights=[SCENARIOS[s] for s in names])[0]


def plan_jobs(n: int, seed: int) -> list[PlannedJob]:
    """``n`` jobs spread evenly over the 14 kinds, in a seeded random order."""
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        sync = KINDS[kind].mode == "sync"
        scenario = _scenario(rng, sync)
        request = {**REQUESTS[kind], "_sim": scenario_script(scenario, rng, sync),
                   "_job_ref": f"demo-{i}"}
        out.append(PlannedJob(
            kind=kind, scenario=scenario, request=request,
            operation="tts" if kind == "elevenlabs-sync" else None,
            credits=float(rng.choice([4, 8, 10, 20])), in_workflow=rng.random() < 0.2))
    rng.shuffle(out)
    return out
