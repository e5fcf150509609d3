"""Serving plan: prefill and decode as two programs on disjoint device groups (sized by the search), or both
on every device, whichever serves more requests per second under the targets; and the report of it.

Disaggregated (Zhong et al. 2024, DistServe; Patel et al. 2024, Splitwise;
DeepSeek's and CloudMatrix-Infer's deployments): requests/s = min(prefill
tokens/s / prompt length, decode tokens/s / generated length), over the
splits of the devices into a prefill and a decode group. Co-located: one
layout runs both; a request costs its prefill and its decode time on the
same devices, and decode steps wait while prompts are prefilled, so the
TPOT users see is the decode step over the share of time spent decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cost_models import Cluster

from planner.errors import Infeasible
from planner.inference.phase_cost import Layout, StepModel
from planner.inference.profile import Profile
from planner.inference.search import PhasePlan, Serving, best_phase, layouts, phase_plan, profile_expert_counts
from planner.search.program_groups import group_sizes
from planner.units import gib, seconds

GIB = 2.0**30


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """The chosen way to serve, its two phases, and the request rate it sustains."""

    mode: str  # "disaggregated" or "co-located"
    prefill: PhasePlan
    decode: PhasePlan
    requests_per_s: float
    devices: int
    decode_share: float = 1.0  # co-located: the share of time the devices spend decoding


def plan_serving(profile: Profile, cluster: Cluster, serving: Serving,
                 disaggregate: bool = True) -> tuple[ServingPlan, list[ServingPlan]]:
    """The best plan on all of `cluster`'s devices and the best of the other mode (if any);
    `disaggregate=False` considers co-located serving only."""
    n = cluster.n_devices
    cache: dict[tuple[str, int], PhasePlan | None] = {}

    def phase(ph: str, k: int) -> PhasePlan | None:
        if (ph, k) not in cache:
            cache[(ph, k)] = best_phase(profile, cluster, serving, ph, k)  # type: ignore[arg-type]
        return cache[(ph, k)]

    options: list[ServingPlan] = []
    split = _best_split(cluster, serving, phase, n) if disaggregate else None
    if split is not None:
        options.append(split)
    co = _co_located(profile, cluster, serving, n)
    if co is not None:
        options.append(co)
    if not options:
        raise Infeasible(_why_not(profile, cluster, serving))
    options.sort(key=lambda p: (-p.requests_per_s, p.mode))
    best = options[0]
    return best, [o for o in options[1:] if o.mode != best.mode]


def _best_split(cluster: Cluster, serving: Serving, phase, n: int) -> ServingPlan | None:
    best = None
    for k in group_sizes(cluster.scaled(n)):  # HyperMPMD's group sizes: fabric-whole, at most ~32 of them
        pre, dec = phase("prefill", k), phase("decode", n - k)
        if pre is None or dec is None:
            continue
        plan = disaggregated(pre, dec, serving, n)
        if best is None or plan.requests_per_s > best.requests_per_s * (1 + 1e-9):
            best = plan
    return best


def disaggregated(pre: PhasePlan, dec: PhasePlan, serving: Serving, n: int) -> ServingPlan:
    """Prefill and decode on disjoint groups of `n` devices: requests/s is the slower group's rate."""
    rate = min(pre.tokens_per_s_per_device * pre.devices / serving.prompt_len,
               dec.tokens_per_s_per_device * dec.devices / serving.gen_len)
    return ServingPlan("disaggregated", pre, dec, rate, n)


def co_located(pre: PhasePlan, dec: PhasePlan, serving: Serving, n: int) -> ServingPlan:
    """Both phases on all `n` devices: a request costs its prefill and its decode time there; decode's share
    of the time is its part of that sum."""
    t_dec = serving.gen_len / (dec.tokens_per_s_per_device * n)
    t_pre = serving.prompt_len / (pre.tokens_per_s_per_device * n)
    return ServingPlan("co-located", pre, dec, 1.0 / (t_pre + t_dec), n, decode_share=t_dec / (t_dec + t_pre))


def _co_located(profile: Profile, cluster: Cluster, serving: Serving, n: int) -> ServingPlan | None:
    """Both phases on all devices with one layout; decode's target met over the share of time it gets."""
    best = None
    hw = cluster.scaled(n)
    for lay in layouts(profile, hw, n, serving.even_experts):
        top = best_phase(profile, cluster, serving, "prefill", n, only=lay)
        cap = top.batch if top is not None else 0
        while cap >= 1:  # a smaller prefill batch leaves decode's cache more room: each quarter of the largest
            pre = top if cap == top.batch else best_phase(profile, cluster, serving, "prefill", n, only=lay,
                                                          within=lambda p, c=cap: p.batch <= c and _in_ttft(p, serving))
            dec = _decode_beside(profile, cluster, serving, n, lay, pre) if pre is not None else None
            plan = co_located(pre, dec, serving, n) if dec is not None else None
            if plan is not None and (best is None or plan.requests_per_s > best.requests_per_s * (1 + 1e-9)):
                best = plan
            cap //= 4
    return best


def _in_ttft(pre: PhasePlan, serving: Serving) -> bool:
    return serving.ttft_s is None or pre.latency_s <= serving.ttft_s


def _decode_beside(profile: Profile, cluster: Cluster, serving: Serving, n: int, lay: Layout,
                   pre: PhasePlan) -> PhasePlan | None:
    """Decode's plan on layout `lay` beside prefill `pre`, at the largest batch whose cache fits in HBM beside
    prefill's memory and whose time per token as a request sees it (a step's latency over the share of time decode
    gets) meets --tpot-ms (None if none does). That time
    is the step's latency plus prefill's time in proportion to the batch, so it grows with the batch: the largest
    batch meeting it is found by bisection, exactly."""
    def room(dec: PhasePlan) -> bool:  # decode's cache stays in HBM while a prefill runs beside it
        return pre.memory_bytes["total"] + dec.memory_bytes["kv_cache"] <= pre.step.usable_bytes

    def meets(dec: PhasePlan) -> bool:
        return serving.tpot_s is None or dec.latency_s <= serving.tpot_s * co_located(pre, dec, serving, n).decode_share

    return best_phase(profile, cluster, serving, "decode", n, only=lay, within=meets, beside=room)


def _why_not(profile: Profile, cluster: Cluster, serving: Serving) -> str:
    n = cluster.n_devices
    candidates = layouts(profile, cluster, n, serving.even_experts)
    if not candidates:
        experts = profile_expert_counts(profile)[0]
        return (f"no layout of {profile.name} on {n} devices splits its {experts} routed experts evenly: a pipeline "
                "stage's tp x dp devices must divide them, with pp 1, 2, 4 or 8; pick a device count that is such a "
                "stage times pp, or allow uneven expert ranges (--uneven-experts)")
    lay = max(candidates, key=lambda l: (l.tp * l.pp, l.tp))
    model = StepModel(profile, cluster, lay, serving.precision)
    p = phase_plan(model, serving, "decode", serving.batch or 1)
    need = p.memory_bytes["total"] / GIB
    have = p.step.usable_bytes / GIB
    if need > have:
        return (f"{profile.name} does not fit on {n} devices of {cluster.name}: even {lay.short()} at batch "
                f"{p.batch} needs {gib(need)} per device and {gib(have)} are usable; add devices, use a "
                "1-byte --dtype (fp8 or int8), or a shorter --prompt-len/--gen-len")
    if serving.batch is not None:  # no latency target: memory stops the batch, alone or co-located
        pre = phase_plan(model, serving, "prefill", serving.batch)
        alone = pre.memory_bytes["total"] / GIB
        together = alone + p.memory_bytes["kv_cache"] / GIB
        what = (f"its prefill needs {gib(alone)}" if alone > have else
                f"a prefill beside decode's cache (co-located) needs {gib(together)}")
        return (f"--batch {serving.batch} does not fit on {n} devices of {cluster.name}: even on {lay.short()} "
                f"{what} per device and {gib(have)} are usable; lower --batch, or add devices")
    what = []
    if serving.ttft_s is not None:
        what.append(f"--ttft-ms {serving.ttft_s * 1e3:g}")
    if serving.tpot_s is not None:
        what.append(f"--tpot-ms {serving.tpot_s * 1e3:g}")
    return (f"no layout of {profile.name} on {n} devices of {cluster.name} meets {' and '.join(what) or 'the batch'}"
            f"; the fastest decode step at batch 1 takes {seconds(p.latency_s)}: relax the targets or add devices")


# -- the report ------------------------------------------------------------------------------------
def phase_dict(p: PhasePlan, serving: Serving, profile: Profile) -> dict[str, Any]:
    """One phase as `plan --json` prints it; every time in the breakdown is one step of the slowest stage."""
    lay = p.layout
    st, mem = p.step, p.memory_bytes
    out = {
        "devices": p.devices,
        "strategy": {"tp": lay.tp, "dp": lay.dp, "pp": lay.pp, "ep": lay.ep if profile.is_moe else 1,
                     "summary": lay.short()},
        "batch_per_replica": p.batch,
        "sequences_in_flight": p.batch * lay.dp * (lay.pp if p.phase == "decode" else 1),
        "tokens_per_s_per_device": p.tokens_per_s_per_device,
        "limiter": st.limiter,
        "step_ms": st.pass_s * 1e3,
        "stage_ms": st.cycle_s * 1e3,  # the slowest stage, which sets the pace: its breakdown adds up to it
        "breakdown_ms": {k: v * 1e3 for k, v in sorted(st.breakdown_s.items())},
        "memory_gib": {k: v / GIB for k, v in sorted(mem.items())},
        "usable_hbm_gib": st.usable_bytes / GIB,
        "kv_cache_gib": (mem["kv_cache"] + mem["offloaded_kv"]) / GIB,
        "kv_layout": kv_layout(profile, lay.tp),
    }
    if p.phase == "prefill":
        out["ttft_ms"] = p.latency_s * 1e3
        out["context"] = serving.prompt_len
    else:
        out["tpot_ms"] = p.latency_s * 1e3
        out["context"] = serving.decode_context
        out["max_context"] = serving.max_context
        out["kv_offload"] = {"fraction": p.kv_offload, "offloaded_gib": mem["offloaded_kv"] / GIB,
                             "exposed_ms": st.breakdown_s["offload"] * 1e3}
    return out


def kv_layout(profile: Profile, tp: int) -> str:
    """How the cache is laid out on a phase's devices: sequences over data parallelism, and over tensor
    parallelism by KV heads, or whole on every tensor rank when every head reads it (a latent, MQA)."""
    heads = [a.kv_heads for p in profile.layers for a in p.attention]
    if not heads:
        return "no KV cache"
    if tp == 1:
        return "sequences over dp"
    split = min(tp, min(heads))
    if split == 1:
        return f"sequences over dp; every one of the {tp} tensor ranks holds the whole cache of its sequences"
    return f"sequences over dp; KV heads split {split} ways over tp" + (
        f", each kept by {tp // split} ranks" if split < tp else "")


def plan_dict(plan: ServingPlan, others: list[ServingPlan], serving: Serving, profile: Profile) -> dict[str, Any]:
    n = plan.devices
    pre, dec = phase_dict(plan.prefill, serving, profile), phase_dict(plan.decode, serving, profile)
    if plan.mode == "co-located":
        dec["tpot_ms"] = plan.decode.latency_s / plan.decode_share * 1e3
        dec["decode_share"] = plan.decode_share
    kv = profile.cached_elements_per_token * serving.precision.kv_bytes
    return {
        "mode": "infer",
        "serving": plan.mode,
        "prefill": pre,
        "decode": dec,
        "prefill_tokens_per_s_per_device": plan.prefill.tokens_per_s_per_device,
        "decode_tokens_per_s_per_device": plan.decode.tokens_per_s_per_device,
        "requests_per_s": plan.requests_per_s,
        "output_tokens_per_s_per_device": plan.requests_per_s * serving.gen_len / n,
        "input_tokens_per_s_per_device": plan.requests_per_s * serving.prompt_len / n,
        "ttft_ms": pre["ttft_ms"],
        "tpot_ms": dec["tpot_ms"],
        "kv_cache": {"bytes_per_token": kv, "latent": any(a.latent for p in profile.parts for a in p.attention),
                     "bytes_per_sequence": profile.cached_elements_at(serving.max_context)
                     * serving.precision.kv_bytes},
        "alternatives": [{"serving": o.mode, "requests_per_s": o.requests_per_s,
                          "prefill": f"{o.prefill.devices} devices, {o.prefill.layout.short()}",
                          "decode": f"{o.decode.devices} devices, {o.decode.layout.short()}",
                          "why": f"{(1 - o.requests_per_s / plan.requests_per_s) * 100:.1f}% fewer requests/s"}
                         for o in others],
        "notes": list(profile.notes) + ["speculative decoding (MTP) is not modelled: one token per sequence per step"],
    }


__all__ = ["ServingPlan", "co_located", "disaggregated", "phase_dict", "plan_dict", "plan_serving"]
