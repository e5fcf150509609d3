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
from planner.costing.node_times import NodeTimes, cast_bytes_per_element
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
    """Megatron-Core: the group is one GEMM of all their FLOPs, the shared input read once, one kernel issued;
    each sibling carries its FLOPs' share of that GEMM's time (so a sibling on another shard still pays for
    its own work). torchtitan: each its own GEMM, each paying the per-kernel overhead and the host's issue."""
    fused, apart = _times(llama, "megatron-core"), _times(llama, "torchtitan")
    work, cluster = llama.work, _cluster()
    for group in _groups(llama):
        x = next(t for t in llama.graph.nodes[group[0]].inputs if not llama.index.is_weight(t))
        nbytes = (sum(work.act_bytes[j] + work.param_bytes[j] for j in group)
                  - (len(group) - 1) * llama.graph.tensors[x].nbytes)
        flops = sum(work.flops[j] for j in group)
        whole = op_time_s(cluster, flops, nbytes)
        assert sum(fused.forward(j, 1) for j in group) == pytest.approx(whole, rel=1e-9)
        assert [fused.forward(j, 1) for j in group] == pytest.approx([whole * work.flops[j] / flops for j in group])
        # backward: the input gradient as the forward, and the weight gradient added into Megatron's main grad
        weights = sum(work.param_bytes[j] for j in group)
        grad = 2 * load_execution("megatron-core").grad_bytes * weights / work.float_bytes
        wgrad = op_time_s(cluster, flops, nbytes - weights + grad)
        assert sum(fused.backward(j, 1) for j in group) == pytest.approx(whole + wgrad, rel=1e-9)
        # torchtitan's GEMMs at its kernel efficiency (of Megatron-Core's on the same die, fitted on DGX H200)
        ke = load_execution("torchtitan").kernel_efficiency
        alone = [op_time_s(cluster, work.flops[j], work.act_bytes[j] + work.param_bytes[j]) / ke for j in group]
        assert [apart.forward(j, 1) for j in group] == pytest.approx(alone, rel=1e-9)
        assert sum(alone) > whole  # one kernel's overhead, and a larger GEMM's efficiency


def test_one_kernel_is_issued_for_the_group(llama):
    """The host issues the group's GEMM once (forward) and its two gradient GEMMs once (backward)."""
    host = 10e-6
    work = make_workload("train", 8, SEQ, "bf16", None)
    cluster = dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=host)
    with_host = NodeTimes(llama, cluster, work, Strategy(dp=8, micro_batch=1), load_execution("megatron-core"))
    without = _times(llama, "megatron-core")
    for group in _groups(llama):
        assert sum(with_host.forward(j, 1) - without.forward(j, 1) for j in group) == pytest.approx(host)
        assert sum(with_host.backward(j, 1) - without.backward(j, 1) for j in group) == pytest.approx(2 * host)


def test_fp8_quantises_the_shared_input_once(llama):
    """Megatron-Core keeps FP8 weights (no weight casts): forward, the group's first GEMM quantises the shared
    input and its siblings nothing; backward, each quantises its own output gradient."""
    ex = load_execution("megatron-core")
    assert ex.fp8_params
    fp8 = _times(llama, "megatron-core", "fp8")
    graph = llama.graph

    def cast(elements):
        return op_time_s(_cluster(), 0.0, cast_bytes_per_element(ex, _cluster().device) * elements, "elementwise")

    for group in _groups(llama):
        x = next(t for t in graph.nodes[group[0]].inputs if not llama.index.is_weight(t))
        got = [fp8._casts(j, 1, fp8.bs, backward=False, inputs=j == group[0]) for j in group]
        assert got == pytest.approx([cast(graph.tensors[x].numel * fp8.bs)] + [0.0] * (len(group) - 1), rel=1e-9)
        for j in group:
            grads = sum(graph.tensors[o].numel for o in graph.nodes[j].outputs) * fp8.bs
            assert fp8._casts(j, 1, fp8.bs, backward=True) == pytest.approx(cast(grads), rel=1e-9)


def test_projections_whose_results_go_their_own_ways_stay_apart():
    """MLA's query and key-value down-projections read the same input, but each result goes through its own
    up-projection before they meet: Megatron-Core runs them as two GEMMs (mla_down_proj_fusion is opt-in).
    The shared expert's gate and up meet in their product: one GEMM."""
    graph = _graph_for_costing("deepseek-v3", 256, None, dict(layers=4))
    facts = GraphFacts(graph, discover_blocks(graph))
    down = [i for i, n in enumerate(graph.nodes) if n.op_type == "MatMul"
            and n.name.split("/")[-2] in ("q_a_proj", "kv_a_proj_with_mqa")]
    assert len(down) == 8 and not any(i in facts.siblings for i in down)
    shared = [g for g in set(facts.siblings.values()) if "shared" in graph.nodes[g[0]].name]
    assert [[graph.nodes[i].name.split("/")[-2] for i in g] for g in shared] == [["gate_proj", "up_proj"]]
