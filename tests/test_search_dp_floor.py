"""What data-parallel traffic a stack leaves exposed adds to the branch and bound's bounds (`planner.search.dp_floor`):
below every strategy of each region, at every level, and above the compute bound where the stack overlaps none of
it; and the property of the collectives it rests on."""

from __future__ import annotations

import pytest

from cost_models import load_cluster, place_group
from cost_models.collectives import all_gather_s, all_reduce_s, reduce_scatter_s
from planner.api import _graph_for_costing, make_workload
from planner.graph.blocks import discover_blocks
from planner.search import plan_search
from planner.search.bounds import pipeline_bound_s

DENSE = ("gpt", dict(layers=4, hidden=512, heads=8, vocab=8000))
MOE = ("mixtral-8x7b", dict(layers=2, hidden=512, heads=8, kv_heads=2, vocab=8000))


@pytest.mark.parametrize("cluster", ["dgx-h100", "cloudmatrix384", "gb200-nvl72"])
@pytest.mark.parametrize("run", [all_reduce_s, reduce_scatter_s, all_gather_s])
def test_a_collective_of_two_messages_takes_no_more_than_the_two(cluster, run):
    """The floor adds the stages' per-micro-batch collectives up to one of all their bytes: that holds when a
    collective's seconds are subadditive in its bytes (latency at least 0, efficiency not falling with size). Checked
    over 1 KB-64 GB and the groups a plan makes: within a node, across nodes, and strided."""
    hw = load_cluster(cluster)
    sizes = [2.0 ** k for k in range(10, 37)]
    for n, stride in ((8, 1), (16, 8), (64, 1), (4, 16)):
        if n * stride > hw.n_devices:
            continue
        group = place_group(hw, n, stride=stride)
        for a in sizes:
            for b in sizes:
                assert run(a + b, group) <= (run(a, group) + run(b, group)) * (1 + 1e-12), (n, stride, a, b)


@pytest.mark.parametrize("model,over,devices,batch", [(*DENSE, 8, 16), (*MOE, 4, 8)])
def test_every_strategy_scored_is_at_least_every_bound_over_it(model, over, devices, batch):
    """Every region opened (a gap that closes none) under MindSpeed-LLM's stack, which overlaps no data-parallel
    traffic: each strategy scored is at least the bound of each region that holds it (context and tensor degree,
    micro-batch, expert degrees, pipeline and data degree, recompute policy), and the floor raised the pipeline
    bound of some schedules (else this would test nothing)."""
    graph = _graph_for_costing(model, 512, None, over)
    structure = discover_blocks(graph)
    workload = make_workload("train", batch, 512, "bf16", "mindspeed")
    bounds, raised = {}, []
    real = plan_search.dp_bounds_s

    def dp_bounds(lt, totals, cluster, wl, s, zeros):
        out = real(lt, totals, cluster, wl, s, zeros)
        plain = pipeline_bound_s(lt, s.pp, wl.global_batch // (s.dp * s.micro_batch), s.vpp)
        raised.append(min(p + t for p, t in out.values()) > plain * (1 + 1e-6))
        return out

    class Recording(plan_search._Search):
        def _refine(self, node):
            out = super()._refine(node)
            bounds[node.key] = out
            return out

    search = Recording(graph, structure, load_cluster("dgx-h100", devices=devices), workload,
                       budget=plan_search.Budget(None), layouts="searched", allow_offload=False, facts=None,
                       constraints=plan_search.NONE, gap=-1e9, solver="highs", progress=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_search, "dp_bounds_s", dp_bounds)
        result = search.run()
    assert result.complete and result.best is not None
    assert any(raised) and not all(raised)
    checked = 0
    for s, c in search.scorer.memo.items():
        if not c.fits:
            continue
        key = (s.cp, s.tp, s.micro_batch, s.ep, s.expert_tp, s.pp, s.dp, s.vpp,
               plan_search.RECOMPUTES.index(s.recompute))
        for depth in (1, 2, 3, 5, 8, 9):
            if key[:depth] in bounds:
                checked += 1
                assert c.step_s >= bounds[key[:depth]] * (1 - 1e-9), (s.short(), depth, c.step_s, bounds[key[:depth]])
    assert checked > 100
