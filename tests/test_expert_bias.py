"""The routed experts' output bias (gpt-oss's down_proj_bias) as Megatron-Core adds it: beside the grouped GEMM,
expert by expert through fp32 (TEGroupedMLP._apply_bias, megatron/core/transformer/moe/experts.py at
core_v0.16.1), so its bytes are the stack's (`Execution.expert_bias_bytes`), not an elementwise add's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cost_models import load_cluster
from cost_models.compute import op_time_s
from planner.api import _graph_for_costing, make_workload
from planner.costing.execution import load_execution, with_changes
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.errors import InvalidInput
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

SEQ, HIDDEN, EXPERTS, TOP_K = 256, 64, 8, 2
SMALL = dict(layers=2, hidden=HIDDEN, heads=4, kv_heads=2, head_dim=16, ffn=32, experts=EXPERTS, top_k=TOP_K,
             vocab=1000, sliding_window=16)


@pytest.fixture(scope="module")
def oss():
    graph = _graph_for_costing("gpt-oss-120b", SEQ, None, SMALL)
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, stack: str = "megatron-core", **changes):
    execution = load_execution(stack)
    execution = dataclasses.replace(execution, **changes) if changes else execution
    work = make_workload("train", 8, SEQ, "bf16", None)
    return NodeTimes(facts, load_cluster("dgx-h100", devices=8), work, Strategy(dp=8, micro_batch=2), execution)


def test_the_down_projections_bias_is_found_once_a_layer_and_the_up_projections_is_not(oss):
    flagged = np.flatnonzero(oss.expert_out_bias)
    assert len(flagged) == SMALL["layers"]
    for i in flagged:
        reads = set().union(*(oss.index.weight_of.get(x, frozenset()) for x in oss.graph.nodes[i].inputs if x))
        assert any(p.endswith("down_proj_bias") for p in reads) and not any("gate_up" in p for p in reads)


def test_its_bytes_are_the_stacks_per_element_of_the_routed_rows(oss):
    """A micro-batch of 2 x 256 tokens, each to 2 experts, 64 wide: 65,536 routed elements a layer, 28 bytes each
    forward and 36 backward under Megatron-Core, on balanced routing; without the stack's loop (0 bytes) it is an
    ordinary elementwise add, cheaper."""
    i = int(np.flatnonzero(oss.expert_out_bias)[0])
    times, plain = _times(oss), _times(oss, expert_bias_bytes=0.0, expert_bias_grad_bytes=0.0)
    cluster, elements = times.cluster, 2 * SEQ * TOP_K * HIDDEN
    host = cluster.host_overhead_s
    assert times.forward(i, 1) == pytest.approx(op_time_s(cluster, 0.0, 28 * elements, "elementwise", "bf16") + host)
    assert times.backward(i, 1) == pytest.approx(op_time_s(cluster, 0.0, 36 * elements, "elementwise", "bf16")
                                                 + 2 * host)
    assert plain.forward(i, 1) < times.forward(i, 1) and plain.backward(i, 1) < times.backward(i, 1)


def test_a_model_without_expert_biases_has_none(oss):
    graph = _graph_for_costing("qwen3-30b-a3b", SEQ, None, dict(layers=2, hidden=HIDDEN, heads=4, kv_heads=2,
                                                                  head_dim=16, ffn=32, experts=EXPERTS, top_k=TOP_K,
                                                                  vocab=1000))
    assert not GraphFacts(graph, discover_blocks(graph)).expert_out_bias.any()


def test_a_stack_file_gives_the_bytes_and_refuses_negative_ones():
    ex = with_changes(load_execution("torchtitan"), {"expert_bias_bytes": 12, "expert_bias_grad_bytes": 0}, "test")
    assert (ex.expert_bias_bytes, ex.expert_bias_grad_bytes) == (12.0, 0.0)
    assert load_execution("torchtitan").expert_bias_bytes == 0.0  # a stack that says nothing fuses it
    with pytest.raises(InvalidInput, match="expert_bias_bytes"):
        with_changes(load_execution("megatron-core"), {"expert_bias_bytes": -1}, "test")


def test_an_estimate_of_gpt_oss_on_megatron_core_states_the_bias_assumption():
    """A training estimate of a model whose experts carry an output bias says how it is costed and what is not
    charged; a model without one, or a stack that fuses the bias, says nothing of it."""
    from planner.api import estimate_model

    kw = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=SEQ, ep=4)
    said = [n for n in estimate_model("gpt-oss-120b", overrides=SMALL, **kw)["assumptions"] if "output bias" in n]
    assert len(said) == 1 and "28 bytes" in said[0] and "launches not charged" in said[0]
    fused = estimate_model("gpt-oss-120b", overrides=SMALL, stack="torchtitan", **kw)["assumptions"]
    plain = estimate_model("qwen3-30b-a3b", overrides={k: v for k, v in SMALL.items() if k != "sliding_window"},
                           **kw)["assumptions"]
    assert not [n for n in fused + plain if "output bias" in n]
