"""Projections of one input run as one GEMM where the stack builds them so: Megatron-Core's linear_qkv (query,
key and value at once) and linear_fc1 (a gated MLP's gate and up halves), where an exported graph, like
torchtitan's Llama, has a GEMM per weight. Hand physics on a small Llama: the group's FLOPs at the overhead
law's efficiency for their sum, one kernel, the shared input read and (in FP8) quantised once.
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from cost_models.compute import op_time_s
from planner.api import _graph_for_costing, make_workload
from planner.costing.execution import load_execution, parse_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

SEQ = 512


@pytest.fixture(scope="module")
def llama():
    graph = _graph_for_costing("llama3-8b", SEQ, None, dict(layers=1, hidden=512, heads=8, kv_heads=2, vocab=1000))
    return GraphFacts(graph, discover_blocks(graph))


def _cluster():
    return dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=0.0)


def _times(facts, stack: str, dtype: str = "bf16") -> NodeTimes:
    work = make_workload("train", 8, SEQ, dtype, None)
    return NodeTimes(facts, _cluster(), work, Strategy(dp=8, micro_batch=1), load_execution(stack))


def _groups(facts):
    return sorted({g for g in facts.siblings.values()})


def test_the_siblings_are_a_layers_query_key_value_and_its_gate_and_up(llama):
    names = [[llama.graph.nodes[i].name.split("/")[-2] for i in g] for g in _groups(llama)]
    assert names == [["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]]
    assert load_execution("megatron-core").fuse_sibling_gemms and not load_execution("torchtitan").fuse_sibling_gemms
    text = '[stack]\nbase = "megatron-core"\n[kernels]\nfuse_sibling_gemms = false\n'
    assert not parse_execution(text, source="s.toml", default_name="s").fuse_sibling_gemms


def test_a_fused_group_is_one_gemm_of_their_summed_flops(llama):
    """Megatron-Core: the first of the group takes the GEMM of all their FLOPs, the shared input read once; the
    others cost nothing. torchtitan: each its own GEMM, each paying the per-kernel overhead."""
    fused, apart = _times(llama, "megatron-core"), _times(llama, "torchtitan")
    work, cluster = llama.work, _cluster()
    for group in _groups(llama):
        x = next(t for t in llama.graph.nodes[group[0]].inputs if not llama.index.is_weight(t))
        nbytes = (sum(work.act_bytes[j] + work.param_bytes[j] for j in group)
                  - (len(group) - 1) * llama.graph.tensors[x].nbytes)
        flops = sum(work.flops[j] for j in group)
        assert fused.forward(group[0], 1) == pytest.approx(op_time_s(cluster, flops, nbytes), rel=1e-9)
        assert all(fused.forward(j, 1) == 0.0 and fused.backward(j, 1) == 0.0 for j in group[1:])
        alone = [op_time_s(cluster, work.flops[j], work.act_bytes[j] + work.param_bytes[j]) for j in group]
        assert [apart.forward(j, 1) for j in group] == pytest.approx(alone, rel=1e-9)
        assert sum(alone) > fused.forward(group[0], 1)  # one kernel's overhead, and a larger GEMM's efficiency


def test_fp8_quantises_the_shared_input_once(llama):
    """Forward, the group's FP8 cast reads its input once (not once per sibling) beside each weight's cast;
    backward, every sibling's output gradient is quantised."""
    ex = load_execution("megatron-core")
    fp8 = _times(llama, "megatron-core", "fp8")
    group = _groups(llama)[0]
    graph = llama.graph
    x = next(t for t in graph.nodes[group[0]].inputs if not llama.index.is_weight(t))
    casts = fp8._casts(group, 1, fp8.bs, backward=False)
    weights = 0.0 if ex.fp8_params else sum(graph.tensors[w].numel for j in group for w in graph.nodes[j].inputs
                                            if llama.index.is_weight(w)) * fp8.weight_casts_per_mb
    elements = graph.tensors[x].numel * fp8.bs + weights
    assert casts == pytest.approx(op_time_s(_cluster(), 0.0, ex.fp8_cast_bytes * elements, "elementwise"), rel=1e-9)
    grads = sum(graph.tensors[o].numel for j in group for o in graph.nodes[j].outputs) * fp8.bs
    assert fp8._casts(group, 1, fp8.bs, backward=True) == pytest.approx(
        op_time_s(_cluster(), 0.0, ex.fp8_cast_bytes * grads, "elementwise"), rel=1e-9)
