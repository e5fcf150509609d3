"""What a serving launch command (vLLM, SGLang) reads from a serving declaration: each phase's degrees and batch.

A serving declaration holds prefill and decode as two programs. Disaggregated
phases are two servers on their own ranks, the prefill one handing its KV
cache to the decode one (a KV connector); co-located phases are one server
running both on every rank, so one command. Per phase the command carries the
degrees (tp, pp, dp and, for MoE, experts over the phase's tp x dp ranks, as
both engines fold them), the sequences a replica runs at once, the context
length and the precisions. A phase's offloaded share of the KV cache has no
argument in either engine, nor has an int8 KV cache: both are refused.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends.common import mesh_sizes
from planner.hypershard.backends.launch import Problem
from planner.hypershard.programs import is_serving, mesh_of


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """One phase program: its ranks, degrees, routed experts and batch."""

    name: str  # prefill or decode
    first: int
    devices: int
    tp: int
    dp: int
    pp: int
    ep: int
    experts: int  # routed experts per MoE layer (0: a dense model)
    batch: int  # sequences per data-parallel replica at once
    kv_offload: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    model: str
    params: int
    cluster: str
    devices: int
    colocated: bool
    phases: tuple[Phase, ...]
    prompt_len: int
    gen_len: int
    dtype: str
    kv_dtype: str
    estimate: Mapping[str, Any]

    @property
    def servers(self) -> tuple[Phase, ...]:
        """The phases that get a server: both when disaggregated, one (decode's batch) when co-located."""
        return self.phases[-1:] if self.colocated else self.phases


def serving(doc: Mapping[str, Any], backend: str) -> Serving:
    """The serving plan of a declaration (InvalidInput, one sentence, for a training one)."""
    if not is_serving(doc):
        raise InvalidInput(f"the {backend} backend writes a serving command, and this declaration is of a training "
                           "plan; export it with --backend megatron, torchtitan, deepspeed or mindformers, or plan "
                           "serving with --mode infer")
    phases = []
    for k, prog in enumerate(doc["programs"]):
        sizes = mesh_sizes(mesh_of(doc, k))
        experts = prog.get("experts") or {}
        phases.append(Phase(name=prog["phase"], first=prog["ranks"]["first"], devices=prog["ranks"]["count"],
                            tp=sizes.get("tp", 1), dp=sizes.get("dp", 1), pp=sizes.get("pp", 1),
                            ep=sizes.get("ep", 1), experts=experts.get("count", 0),
                            batch=prog["batch_per_replica"],
                            kv_offload=float(prog["kv_cache"]["offload"]["fraction"] or 0.0)))
    w = doc["workload"]
    return Serving(model=doc["model"]["name"], params=doc["model"]["params"], cluster=doc["cluster"]["name"],
                   devices=doc["cluster"]["devices"], colocated=doc["serving"]["mode"] == "co-located",
                   phases=tuple(phases), prompt_len=w["prompt_len"], gen_len=w["gen_len"], dtype=w["dtype"],
                   kv_dtype=w["kv_dtype"], estimate=doc.get("estimate") or {})


def override_notes(doc: Mapping[str, Any]) -> list[str]:
    """A note when the plan is of a model whose architecture was changed (`--layers 4`...): the command serves the
    checkpoint as it is, which is not the model planned."""
    changed = (doc.get("model") or {}).get("overrides") or {}
    if not changed:
        return []
    said = ", ".join(f"{k} {v}" for k, v in sorted(changed.items()))
    return [f"this plan is of the model with {said} (its architecture overridden); the command serves $MODEL's "
            "checkpoint as it is, so serve a checkpoint of that architecture, or re-plan the model unchanged"]


def common_problems(sv: Serving) -> list[Problem]:
    """What neither engine's arguments say: an offloaded share of the KV cache, an int8 KV cache."""
    out = [(f"KV-cache offload ({p.kv_offload:.0%} of {p.name}'s cache on the host)", "plan with --no-offload")
           for p in sv.phases if p.kv_offload > 0]
    if sv.kv_dtype == "int8":
        out.append(("int8 KV cache", "plan with --kv-dtype fp8 or bf16"))
    return out


def header(sv: Serving, what: str) -> list[str]:
    """The comment lines opening the commands (without comment marks)."""
    how = "co-located: one server runs both phases" if sv.colocated else \
        "disaggregated: a prefill and a decode server on their own devices"
    lines = [f"{what} for serving {sv.model} ({sv.params:,} parameters) on {sv.devices} devices of {sv.cluster}: "
             f"prompts of {sv.prompt_len} tokens, {sv.gen_len} generated, {sv.dtype} weights, {sv.kv_dtype} KV cache; "
             f"{how}."]
    est = sv.estimate
    if est.get("ttft_ms") is not None:
        lines.append(f"Estimated TTFT {est['ttft_ms']:.4g} ms, TPOT {est['tpot_ms']:.4g} ms, "
                     f"{est['requests_per_s']:.4g} requests/s (hyperplan's analytic estimate).")
    lines.append("MODEL: the checkpoint (a Hugging Face id or folder) of the model; weights in the plan's precision.")
    lines.append("Generated by `hyperplan export` from a HyperShard declaration; regenerate rather than edit.")
    return lines


def command(words: list[str]) -> list[str]:
    """A command line over several lines: the program and its first words, then a flag (and its values) per line,
    each quoted for the shell (a "$MODEL" word stays a variable)."""
    def q(w: str) -> str:
        return w if w == '"$MODEL"' else shlex.quote(w)

    start = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    groups, i = [" ".join(q(w) for w in words[:start])], start
    while i < len(words):
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        groups.append("    " + " ".join(q(w) for w in words[i:j]))
        i = j
    return [g + " \\" for g in groups[:-1]] + groups[-1:]


def render(sv: Serving, what: str, commands: list[dict[str, Any]], notes: list[str]) -> str:
    """The header, notes, and each server's command after a line naming its phase and devices."""
    lines = [f"# {line}" for line in header(sv, what)] + [f"# Note: {n}." for n in notes]
    for c in commands:
        first, last = c["ranks"]
        lines += ["", f"# {c['phase']}: devices {first}-{last}"] + command(c["argv"])
    return "\n".join(lines) + "\n"


def as_json(obj: Any) -> str:
    """A JSON argument value, compact (what the engines parse for their config flags)."""
    return json.dumps(obj, separators=(",", ":"))
