"""The HyperShard declaration of a serving plan: prefill and decode as two programs, each on its own mesh.

A serving declaration (workload mode "infer") holds the model, the
workload (prompt and generated lengths, the batch or the latency targets,
weight and KV-cache precision), the cluster, and how the devices serve:
`serving.mode` is "disaggregated" (prefill and decode on consecutive,
disjoint rank ranges, each program with its own mesh: HyperMPMD) or
"co-located" (both programs on all ranks, sharing one mesh and layout).
Each program states its phase, ranks, mesh (tp fastest, then dp, then
pp; the ep alias over a stage's tp x dp ranks), batch per data-parallel
replica, pipeline stages with their layers, parameter layouts
(`serving_layouts`: globs per block type, routed experts over ep), the
routed experts' placement, the KV cache's layout (which axis splits its
heads or latent, bytes per token, the share offloaded and to which tier)
and its estimate: the very dict `plan --mode infer --json` prints for the
phase. What a user edits — mesh sizes, the batch, the offload fraction —
is what `serving_check` reads back and scores.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping

from cost_models import Cluster, place_group

from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.document import FORMAT_VERSION, PROGRAM_PLACEMENT, Request, model_section
from planner.hypershard.patterns import compress
from planner.hypershard.serving_layouts import serving_param_layouts
from planner.inference.phase_cost import Layout, stages
from planner.inference.plan import kv_layout
from planner.inference.profile import Profile
from planner.search.program_groups import group_cluster
from planner.costing.stage_costs import DTYPE_WIDTH, even_split

PHASES = ("prefill", "decode")
#: How experts sit on the ep coordinates when ep does not divide them (numpy.array_split's rule).
EXPERT_PLACEMENT = ("ep coordinate e = tp coordinate + tp x dp coordinate holds a contiguous range of each MoE layer's "
                    "routed experts; the first (count mod ep) coordinates hold one more (numpy.array_split)")
#: Workload keys a serving declaration records (null where not given).
WORKLOAD_KEYS = ("mode", "prompt_len", "gen_len", "batch", "ttft_ms", "tpot_ms", "dtype", "kv_dtype")
#: Figures of the whole plan the declaration records (the rest of `plan --json` is per phase or descriptive).
ESTIMATE_KEYS = ("requests_per_s", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device",
                 "output_tokens_per_s_per_device", "input_tokens_per_s_per_device", "ttft_ms", "tpot_ms", "kv_cache")


def layout_of(strategy: Mapping[str, Any]) -> Layout:
    """A phase's `strategy` dict (as `plan --json` prints it) as the cost model's Layout."""
    return Layout(tp=strategy["tp"], dp=strategy["dp"], pp=strategy["pp"], ep=strategy["ep"])


def serving_mesh(name: str, lay: Layout, moe: bool, hw: Cluster) -> dict[str, Any]:
    """A phase's named mesh, fastest axis first, with the interconnect levels each axis spans."""
    axes, stride = [], 1
    for axis, size in (("tp", lay.tp), ("dp", lay.dp), ("pp", lay.pp)):
        spans = place_group(hw, size, stride=stride) if size > 1 else ()
        axes.append({"name": axis, "size": size, "stride": stride,
                     "levels": [f"{sp.level.name}x{sp.participants}" for sp in spans]})
        stride *= size
    out: dict[str, Any] = {"name": name, "devices": lay.devices, "axes": axes}
    if moe:
        spans = place_group(hw, lay.ep, stride=1) if lay.ep > 1 else ()
        out["aliases"] = [{"name": "ep", "size": lay.ep, "stride": 1, "within": ["tp", "dp"],
                           "levels": [f"{sp.level.name}x{sp.participants}" for sp in spans]}]
    out["placement"] = PROGRAM_PLACEMENT
    return out


def stage_entries(structure: Structure, profile: Profile, lay: Layout, first: int) -> list[dict[str, Any]]:
    """Pipeline stages as the cost model splits them (`phase_cost.stages`): layers evenly, the blocks before the
    first layer (and other sub-models' towers) on the first stage, the blocks after the last on the last."""
    names = [p.name for p in profile.layers]
    cuts = list(itertools.accumulate(even_split(len(names), lay.pp), initial=0))  # as `phase_cost.stages` cuts
    layer_names = [names[a:b] for a, b in zip(cuts, cuts[1:])]
    decoder = {p.name for p in profile.layers}
    submodel = structure.block(profile.layers[0].name).submodel
    last = max((max(b.nodes) for b in structure.blocks if b.name in decoder and b.nodes), default=-1)
    blocks: list[list[str]] = [[] for _ in layer_names]
    for b in structure.blocks:
        if b.name in decoder or not (b.nodes or b.params):
            continue
        after = bool(b.nodes) and min(b.nodes) > last and b.submodel == submodel
        blocks[-1 if after else 0].append(b.name)
    per = lay.stage_devices
    return [{"stage": k, "ranks": {"first": first + k * per, "count": per}, "layers": layer_names[k],
             "blocks": blocks[k]} for k in range(lay.pp)]


def kv_section(profile: Profile, lay: Layout, kv_dtype: str, kv_bytes: float, offload: float,
               tier: str | None) -> dict[str, Any]:
    """The KV cache of a phase: sequences over dp, heads (or a latent, whole) over tp, and the share offloaded to
    `tier` (the cluster's pooled or host tier: named even at 0, so an edit of the fraction is the only edit)."""
    heads = [a.kv_heads for p in profile.layers for a in p.attention]
    ways = min(lay.tp, min(heads)) if heads else 1
    per_device = max((sum(n * a.cached_elements * kv_bytes / min(lay.tp, a.kv_heads) for p, n in st for a in p.attention)
                      for st in stages(profile, lay.pp)), default=0.0)
    return {
        "dtype": kv_dtype,
        "bytes_per_token": profile.cached_elements_per_token * kv_bytes,
        "bytes_per_token_per_device": per_device,
        "latent": any(a.latent for p in profile.parts for a in p.attention),
        "sequences_axis": "dp",
        "heads_axis": "tp" if ways > 1 else None,
        "head_ways": ways,
        "layout": kv_layout(profile, lay.tp),
        "offload": {"fraction": offload, "tier": tier},
    }


def experts_section(profile: Profile, lay: Layout) -> dict[str, Any] | None:
    """Routed experts of the MoE layers: how many, how many per token, and how many each ep coordinate holds."""
    found = sorted({(p.experts.experts, p.experts.top_k) for p in profile.layers if p.experts is not None})
    if not found:
        return None
    count, top_k = found[-1]
    return {"axis": "ep", "count": count, "top_k": top_k, "per_rank_max": math.ceil(count / lay.ep),
            "per_rank_min": count // lay.ep, "placement": EXPERT_PLACEMENT}


def build_serving_document(plan: Mapping[str, Any], graph: Graph, structure: Structure, profile: Profile,
                           request: Request, hw: Cluster, tier: str | None,
                           search: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The declaration of `plan` (the dict `plan_inference` returns, or one re-scored from a declaration)."""
    wl = plan["workload"]
    n = plan["cluster"]["devices"]
    colocated = plan["serving"] == "co-located"
    doc: dict[str, Any] = {
        "hypershard": FORMAT_VERSION,
        "model": model_section(request, graph),
        "workload": {k: wl.get(k) for k in WORKLOAD_KEYS},
        "cluster": {"name": plan["cluster"]["name"], "spec": request.cluster, "devices": n,
                    "memory_gib": request.memory_gib},
        "serving": {"mode": plan["serving"]},
        "meshes": [],
        "programs": [],
    }
    kv_bytes = DTYPE_WIDTH[wl["kv_dtype"]]
    first = 0
    for phase in PHASES:
        p = plan[phase]
        lay = layout_of(p["strategy"])
        mesh = "serving" if colocated else phase
        if not colocated or phase == PHASES[0]:
            doc["meshes"].append(serving_mesh(mesh, lay, profile.is_moe, group_cluster(hw, lay.devices)))
        offload = p["kv_offload"]["fraction"] if phase == "decode" else 0.0
        prog: dict[str, Any] = {
            "name": phase,
            "phase": phase,
            "mesh": mesh,
            "ranks": {"first": first, "count": lay.devices},
            "batch_per_replica": p["batch_per_replica"],
            "stages": stage_entries(structure, profile, lay, first),
            "layouts": {"params": compress(serving_param_layouts(graph, structure, lay.tp, lay.ep), structure)},
        }
        experts = experts_section(profile, lay)
        if experts is not None:
            prog["experts"] = experts
        prog["kv_cache"] = kv_section(profile, lay, wl["kv_dtype"], kv_bytes, offload, tier)
        prog["estimate"] = dict(p)
        doc["programs"].append(prog)
        if not colocated:
            first += lay.devices
    doc["estimate"] = {k: plan[k] for k in ESTIMATE_KEYS}
    doc["estimate"]["notes"] = list(plan.get("notes", []))
    if plan.get("accuracy"):  # how far off its figures may be when planned: the published deployments
        doc["accuracy"] = dict(plan["accuracy"])
    if search:
        doc["search"] = dict(search)
    if plan.get("alternatives"):
        doc["runners_up"] = [dict(a) for a in plan["alternatives"]]
    return doc


def serving_graph(request: Request) -> tuple[Graph, Structure]:
    """The graph and blocks the serving planner profiled `request`'s model on (the names the layouts use)."""
    from planner.api import _graph_for_costing
    from planner.graph.blocks import discover_blocks
    from planner.inference.serve import profile_seq

    graph = _graph_for_costing(request.model, profile_seq(request.model), dict(request.dims) or None,
                               dict(request.overrides) or None)
    return graph, discover_blocks(graph)


def tier_name(hw: Cluster) -> str | None:
    """The memory tier a serving plan offloads its KV cache to on `hw` (None: it has none)."""
    from cost_models.offload import offload_tier

    tier = offload_tier(hw)
    return tier.name if tier is not None else None


def declare_serving(plan: Mapping[str, Any], request: Request, *, offload: bool = True,
                    disaggregate: bool = True) -> dict[str, Any]:
    """The declaration of a `plan_inference` result (the profile and graph it was planned on come from the
    process's caches, so this costs little after planning)."""
    from planner.inference.serve import load_profile, serving_cluster

    profile = load_profile(request.model, dict(request.dims) or None, dict(request.overrides) or None)
    graph, structure = serving_graph(request)
    hw = serving_cluster(request.cluster, plan["cluster"]["devices"], request.memory_gib, plan["workload"]["dtype"])
    return build_serving_document(plan, graph, structure, profile, request, hw, tier_name(hw),
                                  {"kv_offload": offload, "disaggregate": disaggregate})


def declare_serving_phases(model: str, *, cluster: str, prompt_len: int, gen_len: int, prefill: Mapping[str, Any],
                           decode: Mapping[str, Any], mode: str = "disaggregated", devices: int | None = None,
                           dtype: str = "bf16", kv_dtype: str = "bf16", overrides: Mapping[str, Any] | None = None,
                           dims: Mapping[str, int] | None = None, memory_gib: float | None = None) -> dict[str, Any]:
    """Score a serving plan you chose and declare it: `prefill` and `decode` give tp, dp, pp, batch (per replica)
    and, for decode, kv_offload; experts spread over each stage's tp x dp devices. Disaggregated phases take
    consecutive ranks, prefill first; co-located ones share them (give both the same layout)."""
    from planner.inference.rescore import PhaseChoice, score_serving
    from planner.inference.serve import load_profile, serving_cluster, serving_options, serving_report

    serving = serving_options(prompt_len=prompt_len, gen_len=gen_len, batch=None, ttft_ms=None, tpot_ms=None,
                              dtype=dtype, kv_dtype=kv_dtype, offload=True)
    dims, overrides = dict(dims or {}) or None, dict(overrides or {}) or None
    profile = load_profile(model, dims, overrides)

    def choice(given: Mapping[str, Any]) -> PhaseChoice:
        tp, dp, pp = given.get("tp", 1), given.get("dp", 1), given.get("pp", 1)
        return PhaseChoice(layout=Layout(tp=tp, dp=dp, pp=pp, ep=tp * dp if profile.is_moe else 1),
                           batch=given.get("batch", 1), kv_offload=float(given.get("kv_offload", 0.0)))

    pre, dec = choice(prefill), choice(decode)
    n = devices or (pre.layout.devices + dec.layout.devices if mode == "disaggregated" else pre.layout.devices)
    hw = serving_cluster(cluster, n, memory_gib, dtype)
    plan = score_serving(profile, hw, serving, mode, pre, dec)  # type: ignore[arg-type]
    workload = {"mode": "infer", "prompt_len": prompt_len, "gen_len": gen_len, "batch": None, "ttft_ms": None,
                "tpot_ms": None, "dtype": dtype, "kv_dtype": kv_dtype}
    request = Request(model=model, cluster=cluster, overrides=overrides or {}, dims=dims or {}, memory_gib=memory_gib)
    graph, structure = serving_graph(request)
    return build_serving_document(serving_report(plan, [], serving, profile, model, hw, workload), graph,
                                  structure, profile, request, hw, tier_name(hw))
