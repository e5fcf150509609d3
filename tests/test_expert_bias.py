"""What Megatron-Core runs beside its fused kernels on gpt-oss's routed rows, at the stack's bytes per element:
- the experts' output bias (down_proj_bias), added beside the grouped GEMM expert by expert through fp32
  (TEGroupedMLP._apply_bias, megatron/core/transformer/moe/experts.py at core_v0.16.1; `Execution.expert_bias_bytes`),
  not as an elementwise add;
- the clamps of the gated activation: weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py,
  core_v0.15.0-core_v0.16.1) chunks the fc1 output, clamps each half and concatenates them in eager PyTorch before
  its fused kernel (`Execution.glu_clamp_bytes`), not for nothing inside a fused chain; Transformer Engine's fused
  grouped MLP takes the clamp inside (the sweep zeroes the bytes where a preset sets it)."""

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

SEQ, HIDDEN, FFN, EXPERTS, TOP_K = 256, 64, 32, 8, 2
SMALL = dict(layers=2, hidden=HIDDEN, heads=4, kv_heads=2, head_dim=16, ffn=FFN, experts=EXPERTS, top_k=TOP_K,
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


CASES = {  # what is flagged, its elements a layer (2 x 256 tokens, each to 2 experts), bytes forward and backward
    "output bias": ("expert_out_bias", 2 * SEQ * TOP_K * HIDDEN, 28, 36, ("expert_bias_bytes", "expert_bias_grad_bytes")),
    "clamp": ("glu_clamp", 2 * SEQ * TOP_K * FFN, 8, 10, ("glu_clamp_bytes", "glu_clamp_grad_bytes")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_its_bytes_are_the_stacks_per_element_of_the_routed_rows(oss, case):
    """The output bias: 64 wide, 28 bytes an element forward, 36 backward; a clamp: one 32-wide half, 8 forward (its
    read and write, the concatenation's), 10 backward; one launch forward, two backward, on balanced routing.
    Without the stack's bytes (0: fused) each is an ordinary elementwise op of a fused chain, cheaper."""
    flag, elements, fwd, bwd, fields = CASES[case]
    i = int(np.flatnonzero(getattr(oss, flag))[0])
    times, plain = _times(oss), _times(oss, **{f: 0.0 for f in fields})
    cluster = times.cluster
    host = cluster.host_overhead_s
    assert times.forward(i, 1) == pytest.approx(op_time_s(cluster, 0.0, fwd * elements, "elementwise", "bf16") + host)
    assert times.backward(i, 1) == pytest.approx(op_time_s(cluster, 0.0, bwd * elements, "elementwise", "bf16")
                                                 + 2 * host)
    assert plain.forward(i, 1) < times.forward(i, 1) and plain.backward(i, 1) < times.backward(i, 1)


def test_the_two_clamps_of_each_layers_experts_are_found(oss):
    """A Min on the gate half and a Clip on the linear half, in each of the two layers; nothing outside the experts."""
    flagged = np.flatnonzero(oss.glu_clamp)
    assert sorted(oss.graph.nodes[i].op_type for i in flagged) == ["Clip", "Clip", "Min", "Min"]
    assert all(oss.in_routed[i] for i in flagged)


def test_a_model_without_expert_biases_or_clamps_has_none(oss):
    graph = _graph_for_costing("qwen3-30b-a3b", SEQ, None, dict(layers=2, hidden=HIDDEN, heads=4, kv_heads=2,
                                                                  head_dim=16, ffn=FFN, experts=EXPERTS, top_k=TOP_K,
                                                                  vocab=1000))
    facts = GraphFacts(graph, discover_blocks(graph))
    assert not facts.expert_out_bias.any() and not facts.glu_clamp.any()


@pytest.mark.parametrize("fields", [("expert_bias_bytes", "expert_bias_grad_bytes"),
                                    ("glu_clamp_bytes", "glu_clamp_grad_bytes")])
def test_a_stack_file_gives_the_bytes_and_refuses_negative_ones(fields):
    ex = with_changes(load_execution("torchtitan"), {fields[0]: 12, fields[1]: 0}, "test")
    assert (getattr(ex, fields[0]), getattr(ex, fields[1])) == (12.0, 0.0)
    assert getattr(load_execution("torchtitan"), fields[0]) == 0.0  # a stack that says nothing fuses it
    with pytest.raises(InvalidInput, match=fields[0]):
        with_changes(load_execution("megatron-core"), {fields[0]: -1}, "test")


def test_the_sweep_reads_a_fused_grouped_mlp_as_clamping_and_adding_the_bias_inside_it():
    """Megatron-Bridge 26.06's GPT-OSS presets on GB200 and GB300 set the CuTe DSL fused grouped MLP: one grouped
    kernel a projection, no eager clamps and no bias loop (Transformer Engine's op fuser: ScaledClampedQGeGLU with
    the limit, GroupedLinear with scale_bias; megatron/core/transformer/moe/experts.py on main of 2026-08-22);
    B300's 26.06 preset does not set it."""
    import json

    from benchmarks.bench_bridge_sweep import DATA, run_of

    rows = json.loads(DATA.read_text())["rows"]
    specs = [s for s in (run_of(r, i) for i, r in enumerate(rows)) if s and s["id"].startswith("26.06-")
             and s["model"] == "gpt-oss-120b"]
    by_hw = {s["hardware"]: s["execution"] for s in specs}
    for hw in ("gb200-nvl72", "gb300-nvl72"):
        ex = by_hw[hw]
        assert ex["glu_clamp_bytes"] == ex["glu_clamp_grad_bytes"] == ex["expert_bias_bytes"] == 0.0
        assert ex["expert_bias_grad_bytes"] == 0.0 and ex["expert_gemm_streams"] == 0
    assert not {"glu_clamp_bytes", "expert_bias_bytes", "expert_gemm_streams"} & set(by_hw["dgx-b300"])


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
