"""HyperMPMD: sub-models as separate programs on disjoint device groups, sized so none waits on another.

A multimodal model's encoders (vision, audio towers and their projector) and
its language backbone need different layouts: a 1B-parameter ViT gains
nothing from the tensor parallelism a 70B backbone needs, and on one SPMD
mesh it pays for it. As separate programs each gets its own mesh, found by
the same search (`plan_search.search`) on its own subgraph; they run
concurrently, micro-batch by micro-batch, the encoders feeding the backbone
over the fabric. The step is set by the slower program:

    step = max(step_enc, step_llm) + one encoder micro-batch (the fill) + exposed transfer

The encoder group size is chosen by bisection on the balance
step_enc(n) = step_llm(N - n) (the first falls and the second rises with n),
checking the neighbours of the crossing. Load imbalance is the slowest
program's time over the fastest's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from cost_models import Cluster, place_group
from cost_models.collectives import send_recv_s
from cost_models.spec import check_device_count

from planner.errors import HyperplanError
from planner.graph.blocks import Structure, discover_blocks
from planner.graph.ir import Graph
from planner.graph.subgraph import boundary_bytes, extract
from planner.node_work import graph_batch
from planner.search.plan_search import Candidate, search
from planner.graph_facts import GraphFacts
from planner.strategy import Workload

#: Encoders below this share of the FLOPs are not worth a group of their own (and a search of their own):
#: a group is at least one node, so a 2% tower would leave its devices mostly idle.
MIN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class Program:
    """A part of the model planned and run on its own device group."""

    name: str
    submodels: tuple[str, ...]
    graph: Graph
    structure: Structure


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    program: Program
    devices: int
    first_rank: int
    best: Candidate


@dataclass(frozen=True, slots=True)
class MpmdResult:
    programs: tuple[ProgramPlan, ...]
    step_s: float
    fill_s: float
    transfer_s: float
    imbalance: float
    splits_tried: int


def split_programs(graph: Graph, structure: Structure) -> list[Program]:
    """Encoders (every sub-model but the largest) and the backbone, or [] when there is one program only."""
    subs = list(structure.submodels)
    if len(subs) < 2:
        return []
    total = sum(s.flops for s in subs) or 1.0
    backbone = max(subs, key=lambda s: (s.flops, s.name))
    encoders = [s for s in subs if s is not backbone]
    if sum(s.flops for s in encoders) / total < MIN_SHARE:
        return []
    out = []
    for name, members in (("encoders", encoders), (backbone.name, [backbone])):
        blocks = {b for s in members for b in s.blocks}
        nodes = [i for b in structure.blocks if b.name in blocks for i in b.nodes]
        sub = extract(graph, nodes, name)
        out.append(Program("+".join(s.name for s in members) if name == "encoders" else name,
                           tuple(s.name for s in members), sub, discover_blocks(sub)))
    return out


def _group_sizes(cluster: Cluster) -> list[int]:
    """Device counts a program's group may have: valid counts of the hierarchy leaving a valid rest."""
    n = cluster.n_devices
    out = []
    for c in range(1, n):
        try:
            check_device_count(cluster.name, cluster.levels, c)
            check_device_count(cluster.name, cluster.levels, n - c)
        except Exception:  # noqa: BLE001 - SpecError: not a placeable group
            continue
        out.append(c)
    return out


def plan_mpmd(
    graph: Graph,
    structure: Structure,
    cluster: Cluster,
    workload: Workload,
    *,
    time_limit_s: float = 60.0,
    allow_offload: bool = True,
    progress: Callable[[str, float], None] | None = None,
) -> MpmdResult | None:
    """The best two-program plan (encoders | backbone), or None when the model has no separable encoders."""
    progs = split_programs(graph, structure)
    sizes = _group_sizes(cluster)
    if len(progs) != 2 or not sizes:
        return None
    enc, llm = progs
    facts = {p.name: GraphFacts(p.graph, p.structure) for p in progs}
    memo: dict[tuple[str, int], Candidate | None] = {}
    report = progress or (lambda msg, frac: None)
    budget = time_limit_s / max(4, 2 * math.ceil(math.log2(len(sizes) + 1)) + 2)

    def best(p: Program, n: int) -> Candidate | None:
        key = (p.name, n)
        if key not in memo:
            report(f"MPMD: {p.name} on {n} devices", 0.5)
            try:
                r = search(p.graph, p.structure, cluster.scaled(n), workload, time_limit_s=budget,
                           allow_offload=allow_offload, facts=facts[p.name])
                memo[key] = r.best
            except HyperplanError:
                memo[key] = None
        return memo[key]

    def step_of(c: Candidate | None) -> float:
        return c.step_s if c is not None else math.inf

    # bisection on the balance: encoder time falls with its group, backbone time rises
    lo, hi = 0, len(sizes) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_of(best(enc, sizes[mid])) > step_of(best(llm, cluster.n_devices - sizes[mid])):
            lo = mid
        else:
            hi = mid
    options = []
    for k in sorted({lo, hi, max(0, lo - 1), min(len(sizes) - 1, hi + 1)}):
        n_enc = sizes[k]
        a, b = best(enc, n_enc), best(llm, cluster.n_devices - n_enc)
        if a is None or b is None:
            continue
        options.append((max(a.step_s, b.step_s), k, a, b))
    if not options:
        return None
    _, k, a, b = min(options, key=lambda o: (o[0], o[1]))
    n_enc = sizes[k]
    fill = a.step_s / max(1, workload.global_batch // (a.strategy.dp * a.strategy.micro_batch))
    per_sample = boundary_bytes(graph, llm.graph) / max(1, graph_batch(graph))
    mb = a.strategy.micro_batch
    spans = place_group(cluster, 2, stride=n_enc) if cluster.n_devices > n_enc else ()
    # encoder outputs go to the backbone group micro-batch by micro-batch, behind compute but the last one
    transfer = send_recv_s(per_sample * mb, spans) if spans else 0.0
    step = max(a.step_s, b.step_s) + fill + transfer
    plans = (ProgramPlan(enc, n_enc, 0, a), ProgramPlan(llm, cluster.n_devices - n_enc, n_enc, b))
    times = [a.step_s, b.step_s]
    return MpmdResult(plans, step, fill, transfer, max(times) / min(times), len(memo))


def exact_programs(result: MpmdResult, cluster: Cluster, workload: Workload) -> tuple[list[dict], dict]:
    """Re-estimate each program on its own (as `plan` does for SPMD) and combine them into the plan's figures.

    Returns (programs, overall): `overall` has the Estimate fields for the whole model, its breakdown that of
    the slower program plus the MPMD fill and transfer, so it still adds up to the step time.
    """
    from planner.estimate import estimate, plain
    from planner.plan import strategy_dict

    progs, ests = [], []
    for p in result.programs:
        est = estimate(p.program.graph, p.program.structure, cluster.scaled(p.devices), workload, p.best.strategy)
        ests.append(est)
        progs.append(plain({
            "name": p.program.name, "submodels": list(p.program.submodels), "devices": p.devices,
            "ranks": [p.first_rank, p.first_rank + p.devices - 1], "strategy": strategy_dict(p.best.strategy),
            "estimate": est.to_dict(),
        }))
    slow = max(range(len(ests)), key=lambda i: (ests[i].step_time_s, i))
    fill = ests[0].step_time_s / max(1, ests[0].microbatches)
    step = ests[slow].step_time_s + fill + result.transfer_s
    bd = dict(ests[slow].breakdown_s)
    bd["mpmd_fill"] = fill
    bd["mpmd_transfer"] = result.transfer_s
    flops = sum(e.model_flops_per_step for e in ests)
    n = cluster.n_devices
    peak = cluster.device.peak_flops(workload.dtype)
    worst = max(ests, key=lambda e: e.memory_bytes["peak"])
    overall = plain({
        "step_time_s": step, "tokens_per_s": workload.tokens / step, "tflops_per_device": flops / step / n / 1e12,
        "mfu": flops / (step * n * peak), "model_flops_per_step": flops, "microbatches": ests[-1].microbatches,
        "fits": all(e.fits for e in ests), "hbm_gib": worst.hbm_bytes / 2**30, "over_gib": worst.over_bytes / 2**30,
        "memory_gib": {k: v / 2**30 for k, v in sorted(worst.memory_bytes.items())},
        "breakdown_s": dict(sorted(bd.items())), "stages": [], "layouts": {},
        "solver_gap": max(e.solver_gap for e in ests),
        "imbalance": max(e.step_time_s for e in ests) / min(e.step_time_s for e in ests),
    })
    return progs, overall
