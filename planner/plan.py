"""What the planner chose, why it beat the runners-up, and the figures it was chosen by.

A plan is the chosen `Strategy` plus its exact estimate (re-estimated on its
own, so `hyperplan estimate` and `hyperplan validate` of the same strategy
print the same numbers), the mesh with its placement on the interconnect,
and the best strategy of each other mesh with the reason it lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cost_models import Cluster, place_group
from cost_models.accuracy import WORDS

from planner.costing.estimate import Estimate, plain
from planner.search.plan_search import Candidate, SearchResult
from planner.strategy import Strategy
from planner.units import seconds


@dataclass(frozen=True, slots=True)
class Plan:
    strategy: Strategy
    estimate: Estimate
    runners_up: tuple[Candidate, ...]
    search: SearchResult
    mesh: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    stopped_by: str = ""  # what cut the plan's search short (the time limit or the work budget), if anything


def fitting_best(result: SearchResult, estimate_of: Callable[[Strategy], Estimate]
                 ) -> tuple[Candidate, Estimate, tuple[Candidate, ...]]:
    """The search's best whose own estimate fits, that estimate, and the faster ones whose estimates do not.
    The search scores strategies on layouts solved once per tensor-axis size and reused
    (`planner.search.scoring.Scorer`); the plan re-solves its own, and at the edge of memory the two can
    disagree: then the next mesh's best that fits by its own estimate (or, if none does, the search's best as
    it is, which its estimate says does not fit)."""
    assert result.best is not None
    tried: list[tuple[Candidate, Estimate]] = []
    for c in (result.best, *(x for x in result.ranked if x.fits and x.mesh != result.best.mesh)):
        est = estimate_of(c.strategy)
        if est.fits:
            return c, est, tuple(t for t, _ in tried)
        tried.append((c, est))
    return tried[0][0], tried[0][1], ()


def mesh_axes(cluster: Cluster, s: Strategy) -> tuple[dict[str, Any], ...]:
    """The named mesh, fastest axis first, with the interconnect levels each axis spans."""
    axes = []
    stride = 1
    for name, size in (("tp", s.tp), ("cp", s.cp), ("dp", s.dp), ("pp", s.pp)):
        if s.stage_tp and name == "pp":  # stages of different widths: no one stride; their blocks follow
            axes.append({"name": name, "size": size, "stride": None, "levels": []})
            continue
        spans = place_group(cluster, size, stride=stride) if size > 1 else ()
        axes.append({"name": name, "size": size, "stride": stride,
                     "levels": [f"{sp.level.name}x{sp.participants}" for sp in spans]})
        stride *= size
    if s.stage_tp:
        for stage, (first, last) in enumerate(stage_ranks(s)):
            width = s.stage_tp[stage]
            spans = place_group(cluster, width, stride=1) if width > 1 else ()
            axes.append({"name": f"stage{stage}", "size": last - first + 1, "ranks": [first, last], "tp": width,
                         "levels": [f"{sp.level.name}x{sp.participants}" for sp in spans]})
    if s.ep > 1 or (s.etp and s.expert_tp != s.tp):  # experts fold onto a stage's tp x cp x dp ranks: etp fastest,
        # then ep, then edp (an alias of one expert rank says the experts keep out of the tensor axis: etp 1)
        spans = place_group(cluster, s.ep, stride=s.expert_tp)
        axes.append({"name": "ep", "size": s.ep, "stride": s.expert_tp,
                     "within": "tp x cp x dp" if s.expert_tp != s.tp else "dp x cp", "etp": s.expert_tp,
                     "levels": [f"{sp.level.name}x{sp.participants}" for sp in spans]})
    return tuple(axes)


def stage_ranks(s: Strategy) -> list[tuple[int, int]]:
    """First and last rank of each pipeline stage's block (tp x cp x dp ranks, tensor axis fastest).

    Stages of different widths take their blocks widest first, so every block starts at a multiple of
    its own tensor width and power-of-two tensor groups never straddle a node (the placement the cost
    model assumes); equal widths keep pipeline order.
    """
    per = [s.tp_of_stage(k) * s.cp * s.dp for k in range(s.pp)]
    order = sorted(range(s.pp), key=lambda k: (-s.tp_of_stage(k), k))
    out: dict[int, tuple[int, int]] = {}
    first = 0
    for k in order:
        out[k] = (first, first + per[k] - 1)
        first += per[k]
    return [out[k] for k in range(s.pp)]


def why_slower(loser: Candidate, winner_breakdown: Mapping[str, float], winner_step: float) -> str:
    """One line: how much slower, and the parts of the step that grew most."""
    if not loser.fits and loser.shortfall is not None:
        return f"does not fit: {loser.shortfall.sentence()}"
    if not loser.fits:
        return f"does not fit: {loser.peak_bytes / 2**30:.1f} GiB per device"
    if not math.isfinite(loser.step_s):
        return loser.note or "not feasible"
    diffs = sorted(((loser.breakdown_s.get(k, 0.0) - winner_breakdown.get(k, 0.0), k)
                    for k in set(loser.breakdown_s) | set(winner_breakdown)), reverse=True)
    grew = [f"{k} +{seconds(d)}" for d, k in diffs[:2] if d > 1e-9]
    pct = (loser.step_s / winner_step - 1.0) * 100
    if abs(pct) < 0.05:  # scored in the search; the plan's own figure comes from its final estimate
        return f"as fast ({pct:+.2f}%)"
    if pct < 0:
        return f"{-pct:.1f}% faster by its search score; the plan's final estimate ranked it first"
    return f"{pct:.1f}% slower" + (f" ({', '.join(grew)})" if grew else "")


def close_calls(runners_up: list[Mapping[str, Any]], step_s: float, accuracy: Mapping[str, Any] | None,
                cluster: str, ranking: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The runners-up that fit and whose step is within a band of the plan's that the estimate does not resolve:
    the larger of the hardware's held-out mean |error| for the kind of job (`accuracy`: `planner.caveats.accuracy`)
    and the median error of the estimated ratio between two layouts of that kind one table measured (`ranking`:
    `planner.calibration.published.ranking_error`, the shipped runs' layout pairs). None when neither measures a
    band or no runner-up is that close. Where the held-out mean sets the band, ASSUMPTION: two layouts' estimates
    are as far off against each other as one against its run."""
    held = (accuracy or {}).get("mean_abs_error") or 0.0
    ranked = (ranking or {}).get("median_error") or 0.0
    band = max(held, ranked)
    if not band or not (step_s > 0):
        return None
    close = [r["summary"] for r in runners_up
             if r.get("fits") and r.get("step_time_s") and r["step_time_s"] <= step_s * (1.0 + band)]
    if not close:
        return None
    category = (accuracy or {}).get("category") or (ranking or {}).get("category", "")
    what = WORDS.get(category, category)
    why = (f"the median error of the estimated ratio between two {what} layouts one published table measured, over "
           f"{ranking['pairs']} pairs" if ranked >= held else
           f"the mean |error| of {cluster}'s {accuracy['runs']} held-out {what} runs; an assumption: two layouts' "
           "estimates taken to be as far off against each other as one against its run")
    many = len(close) > 1
    return {"band": band, "runners_up": close, "held_out_mean": held or None, "ranking_median": ranked or None,
            "sentence": (f"{len(close)} {'runners-up' if many else 'runner-up'} within {100 * band:.1f} % of the "
                         f"plan's step ({why}): the estimate does not tell {'them' if many else 'it'} from the plan; "
                         "measure before choosing")}


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    est = plan.estimate.to_dict()
    win_bd = plan.estimate.breakdown_s
    return plain({
        "strategy": strategy_dict(plan.strategy),
        "mesh": list(plan.mesh),
        "estimate": est,
        "runners_up": [
            {"summary": c.strategy.short(), "strategy": strategy_dict(c.strategy),
             "step_time_s": c.step_s if math.isfinite(c.step_s) else None, "fits": c.fits,
             "peak_gib": c.peak_bytes / 2**30 if math.isfinite(c.peak_bytes) else None,
             "why": why_slower(c, win_bd, plan.estimate.step_time_s)}
            for c in plan.runners_up
        ],
        "search": {**search_summary(plan.search, plan.estimate.step_time_s, plan.stopped_by),
                   "layout_solver_gap": plan.estimate.solver_gap},
    })


def search_summary(r: SearchResult, step_s: float, stopped_by: str = "") -> dict[str, Any]:
    """How much was searched and how close the plan is to the best of the space: no wall-clock time here, so
    the same inputs give the same document, byte for byte. `stopped_by` names what cut the plan's search
    short (the time limit, or the work budget), if anything did. The search scores strategies with layouts
    solved once per tensor axis; the plan is re-scored with its own solve, and being in the space, it caps
    the bound (which may rest on the search's score of that same plan)."""
    bound_s = min(r.bound_s, step_s) if r.bound_s > 0 and step_s > 0 else r.bound_s
    gap = max(0.0, (step_s - bound_s) / step_s) if bound_s > 0 and step_s > 0 else None
    complete = r.complete and not stopped_by
    return plain({"evaluated": r.evaluated, "meshes": r.meshes, "complete": complete, "nodes": r.nodes,
                  "pruned": r.pruned, "bound_s": bound_s, "gap": gap,
                  "optimal_within": (f"optimal within {100 * gap:.2f} %" if gap is not None else
                                     "no bound: nothing fits") + ("" if complete else
                                                                  f" (search stopped by {stopped_by or '--time-limit'};"
                                                                  " best so far)")})


def strategy_dict(s: Strategy) -> dict[str, Any]:
    return {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep, "etp": s.expert_tp, "vpp": s.vpp, "micro_batch": s.micro_batch,
            "recompute": s.recompute, "sp": s.sp, "zero": s.zero, "schedule": s.schedule,
            "offload": dict(s.offload), "stage_layers": list(s.stage_layers), "layouts": s.layouts,
            "full_recompute_layers": s.full_recompute_layers, "stage_tp": list(s.stage_tp), "flushes": s.flushes,
            "summary": s.short()}
