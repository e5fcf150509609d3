"""The bound of what fitting in HBM costs (`planner.search.fitting`): below every strategy of its region that fits,
and above the compute bound where memory is short."""

from __future__ import annotations

import math

import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, make_workload, with_memory_cap
from planner.graph.blocks import discover_blocks
from planner.search import plan_search
from planner.search.fitting import least_offload_s

MOE = ("mixtral-8x7b", dict(layers=2, hidden=512, heads=8, kv_heads=2, vocab=8000))


def test_the_cheapest_way_to_move_an_excess_off_hbm():
    """2 GB over, a 10 GB/s link, 0.1 s of pipeline: the stream at 2 bytes per byte hides 0.5 GB under it, then
    the optimizer at 1.5 bytes per byte is cheaper than streaming on (1.5 GB, 0.225 s); classes too small: inf."""
    classes = [(1e9, 2.0, True), (4e9, 1.5, False)]
    x, y = least_offload_s(2e9, classes, 10e9, 0.1)
    assert x == pytest.approx(0.1) and y == pytest.approx(1.5e9 * 1.5 / 10e9)
    assert least_offload_s(0.0, classes, 10e9, 0.1) == (0.0, 0.0)
    assert least_offload_s(6e9, classes, 10e9, 0.1) == (math.inf, math.inf)


def test_no_strategy_that_fits_is_faster_than_its_regions_fitting_bound(monkeypatch):
    """Every region opened (a gap that closes none), memory so short that most strategies offload: each strategy
    scored that fits is at least its region's bound, and the fitting bound is above the compute bound somewhere
    (else this would test nothing). Four GPUs with 1.5 GiB each score about 700 strategies that fit, three in
    four of them offloading."""
    model, over = MOE
    graph = _graph_for_costing(model, 1024, None, over)
    structure = discover_blocks(graph)
    workload = make_workload("train", 16, 1024, "bf16", None)
    ex = workload.execution
    cluster = with_memory_cap(load_cluster("dgx-h100", devices=4),
                              1.5 / (1.0 - ex.allocator_reserve) + ex.runtime_reserve_gib)
    raised = []
    real = plan_search.fitting_bound_s

    def fitting(*args):
        out = real(*args)
        raised.append(out > min(p + t for p, t in args[-2].values()) * (1 + 1e-9))
        return out
    monkeypatch.setattr(plan_search, "fitting_bound_s", fitting)
    checked = []

    class Recording(plan_search._Search):
        def _leaves(self, node):
            before = set(self.scorer.memo)
            super()._leaves(node)
            checked.extend((node.bound_s, c) for s, c in self.scorer.memo.items() if s not in before and c.fits)

    search = Recording(graph, structure, cluster, workload, budget=plan_search.Budget(None), layouts="searched",
                       allow_offload=True, facts=None, constraints=plan_search.NONE, gap=-1e9, solver="highs",
                       progress=None)
    result = search.run()
    assert result.complete and result.best is not None
    assert any(raised) and any(c.strategy.offload for _, c in checked)
    assert any(not c.strategy.offload for _, c in checked)  # both kinds of fit are held to the bound
    for bound, c in checked:
        assert c.step_s >= bound * (1 - 1e-9), (c.strategy.short(), c.step_s, bound)
