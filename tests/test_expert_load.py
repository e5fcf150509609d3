"""A learned router's load spread: the busiest expert-parallel rank sets the pace of a dropless MoE layer.

The order statistic against its exact values; hand-computed imbalances on small cases; a stack file that sets
it; the costing that applies it to the routed ops and the exchange; and, against measurements, the Megatron MoE
ModelZoo's forced-balance against dropless Qwen3-235B runs on 256 H100s: the spread fitted on 16k and 64k
tokens predicts the 32k and 128k ratios (held out), and the fit gives the value the stack default carries.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from benchmarks import fit_expert_load as fit
from cost_models import load_cluster
from cost_models.expert_load import expected_max_normal, load_imbalance
from planner.api import estimate_model
from planner.calibration.predict import Predictor
from planner.costing.block_costs import Parts
from planner.costing.exchange import add_expert_exchange
from planner.costing.execution import Execution, load_execution, parse_execution
from planner.errors import InvalidInput
from planner.graph.moe import MoeFacts
from planner.strategy import Strategy

#: E[max of n standard normals], exact (Harter 1961, Table 1): 1/sqrt(pi) for n = 2
EXACT_MAX = {2: 1 / math.sqrt(math.pi), 4: 1.0294, 8: 1.4236, 16: 1.7660, 64: 2.3373}
DEFAULT_CV = Execution(name="default").moe_expert_load_cv


@pytest.mark.parametrize("n", sorted(EXACT_MAX))
def test_blom_order_statistic_is_within_three_hundredths_of_the_exact_maximum(n):
    assert expected_max_normal(n) == pytest.approx(EXACT_MAX[n], abs=0.03)


def test_hand_computed_imbalances():
    # 2 ranks of 1 expert each, cv 0.5: the busier rank is 0.5 x E[max of 2] above the mean
    assert load_imbalance(2, 2, 0.5) == pytest.approx(1 + 0.5 * expected_max_normal(2), rel=1e-12)
    # 8 ranks of 16 experts, cv 1.12: each rank's load spreads by 1.12 / 4
    assert load_imbalance(8, 128, 1.12) == pytest.approx(1 + 0.28 * expected_max_normal(8), rel=1e-12)
    assert load_imbalance(1, 128, 1.12) == 1.0  # one rank holds every expert
    assert load_imbalance(8, 128, 0.0) == 1.0  # forced balance
    assert load_imbalance(8, 128, 1.12, capacity_factor=1.25) == 1.25  # tokens past the capacity are dropped


def test_more_ranks_spread_more_and_more_experts_per_rank_average_out():
    assert load_imbalance(4, 128, 1.0) < load_imbalance(16, 128, 1.0) < load_imbalance(64, 128, 1.0)
    assert load_imbalance(8, 256, 1.0) < load_imbalance(8, 64, 1.0)


@pytest.mark.parametrize("kw", [{"cv": -0.1}, {"cv": math.nan}, {"capacity_factor": -1.0}])
def test_bad_spreads_are_refused(kw):
    args = {"ep": 8, "experts": 64, "cv": 1.0} | kw
    with pytest.raises(ValueError):
        load_imbalance(**args)


def test_a_stack_file_sets_a_learned_router_and_refuses_a_negative_spread():
    ex = parse_execution('[stack]\nbase = "megatron-core"\n[moe]\nmoe_routing = "learned"\n'
                         'moe_expert_load_cv = 0.5\nmoe_capacity_factor = 1.5\n', source="s.toml", default_name="s")
    assert (ex.moe_routing, ex.moe_expert_load_cv, ex.moe_capacity_factor) == ("learned", 0.5, 1.5)
    assert ex.routed_load(8, 64) == pytest.approx(load_imbalance(8, 64, 0.5, 1.5))
    assert Execution(name="x").routed_load(8, 64) == 1.0  # the default router is forced to balance
    with pytest.raises(InvalidInput, match="moe_expert_load_cv"):
        parse_execution('[stack]\n[moe]\nmoe_expert_load_cv = -1\n', source="s.toml", default_name="s")


def test_the_exchange_waits_for_the_busiest_rank():
    facts = SimpleNamespace(moe={"l": MoeFacts(experts=64, top_k=8, params=frozenset(), router_params=frozenset(),
                                               expert_nodes=frozenset(), tokens=4096, hidden=4096)})
    cluster = load_cluster("dgx-h100", devices=16)
    parts = []
    for routing in ("uniform", "learned"):
        ex = dataclasses.replace(load_execution("megatron-core"), moe_routing=routing)
        p = {"l": Parts()}
        add_expert_exchange(facts, cluster, Strategy(tp=2, dp=8, ep=16, etp=1), ex, 2.0, 1.0, {"l": "none"}, p)
        parts.append(p["l"])
    assert parts[1].ep_fwd == pytest.approx(parts[0].ep_fwd * load_imbalance(16, 64, DEFAULT_CV), rel=1e-9)


@pytest.fixture(scope="module")
def long_context(shared_graphs):
    return Predictor(graphs=shared_graphs), fit.shipped_runs(), fit.measured_pairs()


@pytest.mark.calibration
@pytest.mark.parametrize("seq", [32768, 131072])
def test_the_spread_predicts_the_held_out_dropless_slowdowns(long_context, seq):
    predictor, runs, pairs = long_context
    forced, dropless = pairs[seq]
    ratio = fit.predicted_ratio(predictor, runs[seq], load_execution("megatron-core").moe_expert_load_cv)
    assert ratio == pytest.approx(forced / dropless, rel=0.03)  # measured 1.209 (32k) and 1.090 (128k)
    assert fit.predicted_ratio(predictor, runs[seq], 0.0) == pytest.approx(1.0)  # no spread, no slowdown


@pytest.mark.calibration
def test_the_fit_on_16k_and_64k_gives_the_stack_default(long_context):
    predictor, runs, pairs = long_context
    assert fit.fit_cv(predictor, runs, pairs) == pytest.approx(Execution(name="x").moe_expert_load_cv, abs=0.02)


def test_an_estimate_with_a_learned_router_waits_for_and_stores_on_the_busiest_rank(tmp_path):
    stack = tmp_path / "learned.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[moe]\nmoe_routing = "learned"\n', encoding="utf-8")
    small = dict(layers=2, hidden=512, heads=8, kv_heads=2, vocab=8000)  # 8 experts, top-2

    def est(ep, stack_file=None):
        return estimate_model("mixtral-8x7b", cluster="dgx-h100", devices=8, global_batch=16, seq_len=1024,
                              overrides=small, stack=stack_file, ep=ep, micro_batch=2)

    uniform, learned = est(4), est(4, str(stack))
    load = load_imbalance(4, 8, DEFAULT_CV)  # 2 experts per rank: about 1.9
    assert learned["breakdown_s"]["ep_comm"] == pytest.approx(uniform["breakdown_s"]["ep_comm"] * load, rel=1e-6)
    assert learned["breakdown_s"]["compute"] > uniform["breakdown_s"]["compute"]
    assert learned["memory_gib"]["activations"] > uniform["memory_gib"]["activations"]
    assert any("learned router" in a for a in learned["assumptions"])
    assert not any("learned router" in a for a in uniform["assumptions"])
    # one expert-parallel rank holds every expert: nothing to wait for
    assert est(1, str(stack))["step_time_s"] == pytest.approx(est(1)["step_time_s"], rel=1e-12)
