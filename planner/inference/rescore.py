"""Score a given serving plan: each phase's layout, batch and KV offload as written, on the planner's own path.

The search (`search.best_phase`) picks a layout and a batch per phase and
costs them with `search.phase_plan` on the phase's device group; the two
phases are then combined by `plan.disaggregated` or `plan.co_located`.
Here the choice is given (read from a HyperShard declaration, perhaps
hand-edited) and the costing is the same calls in the same order, so an
unedited plan scores to the very numbers the search reported, and an
edited one (another decode batch, another tp) is scored as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cost_models import Cluster

from planner.errors import InvalidInput
from planner.inference.phase_cost import Layout, Phase, StepModel
from planner.inference.plan import ServingPlan, co_located, disaggregated
from planner.inference.profile import Profile
from planner.inference.search import PhasePlan, Serving, phase_plan
from planner.search.program_groups import group_cluster

ServingMode = Literal["disaggregated", "co-located"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseChoice:
    """What a plan fixes for one phase: its layout (tp x dp x pp, experts over ep), batch and KV offload."""

    layout: Layout
    batch: int
    kv_offload: float = 0.0


def score_phase(profile: Profile, cluster: Cluster, serving: Serving, phase: Phase, choice: PhaseChoice) -> PhasePlan:
    """One phase on its own group of `choice.layout.devices` devices, costed as the search costs it."""
    if choice.batch < 1:
        raise InvalidInput(f"the {phase} batch per replica must be at least 1, got {choice.batch}")
    if not 0.0 <= choice.kv_offload < 1.0:
        raise InvalidInput(f"the {phase} KV-cache offload fraction must be in [0, 1), got {choice.kv_offload:g}")
    if choice.kv_offload and phase != "decode":
        raise InvalidInput(f"only decode offloads its KV cache; set the {phase} offload fraction to 0")
    lay = choice.layout
    if profile.is_moe and lay.ep != lay.stage_devices:
        raise InvalidInput(f"the {phase} layout {lay.short()} spreads experts over ep {lay.ep}, but serving places "
                           f"every stage's routed experts over all of its tp x dp = {lay.stage_devices} devices; "
                           f"set ep to {lay.stage_devices}")
    if not profile.is_moe and lay.ep != 1:
        raise InvalidInput(f"{profile.name} has no routed experts, so the {phase} layout cannot use ep {lay.ep}; "
                           "set ep to 1 (or drop the ep alias)")
    if lay.pp > len(profile.layers):
        raise InvalidInput(f"{profile.name} has {len(profile.layers)} layers, too few for the {phase} layout's "
                           f"{lay.pp} pipeline stages")
    model = StepModel(profile, group_cluster(cluster, lay.devices), lay, serving.precision)
    return phase_plan(model, serving, phase, choice.batch, choice.kv_offload)


def score_serving(profile: Profile, cluster: Cluster, serving: Serving, mode: ServingMode, prefill: PhaseChoice,
                  decode: PhaseChoice) -> ServingPlan:
    """Both phases on `cluster`'s devices: disjoint groups that together use them all, or each on all of them."""
    n = cluster.n_devices
    pre = score_phase(profile, cluster, serving, "prefill", prefill)
    dec = score_phase(profile, cluster, serving, "decode", decode)
    if mode == "disaggregated":
        if pre.devices + dec.devices != n:
            raise InvalidInput(f"disaggregated prefill ({pre.devices} devices) and decode ({dec.devices}) must use "
                               f"the cluster's {n} devices between them; resize one of the groups")
        return disaggregated(pre, dec, serving, n)
    if mode == "co-located":
        if prefill.layout != decode.layout or pre.devices != n:
            raise InvalidInput(f"co-located prefill ({prefill.layout.short()}) and decode ({decode.layout.short()}) "
                               f"run one layout on all {n} devices; give both phases that layout")
        return co_located(pre, dec, serving, n)
    raise InvalidInput(f"serving mode {mode!r} is unknown; use disaggregated or co-located")


__all__ = ["PhaseChoice", "score_phase", "score_serving"]
