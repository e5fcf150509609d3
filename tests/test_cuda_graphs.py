"""CUDA graphs: a stack that replays a layer's modules (or the whole step) from CUDA graphs issues no kernel of
theirs from the host, so they pay no host overhead; what the graphs capture is read off the graph by Megatron-Core's
module boundaries (`planner.costing.graph_capture`)."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, make_workload
from planner.costing.execution import load_execution, with_changes
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.errors import InvalidInput
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

US = 1e-6


def _facts(model: str, **arch):
    graph = _graph_for_costing(model, 256, None, dict(layers=2, hidden=256, heads=4, kv_heads=2, vocab=1000, **arch))
    return GraphFacts(graph, discover_blocks(graph))


@pytest.fixture(scope="module")
def dense():
    return _facts("llama3-8b")


@pytest.fixture(scope="module")
def moe():
    return _facts("qwen3-30b-a3b", experts=8, top_k=2)


def _layer0(facts, scopes: tuple[str, ...]) -> set[str]:
    """The names of layer 0's ops the scopes capture."""
    cap = facts.captured(scopes)
    return {n.name for i, n in enumerate(facts.graph.nodes) if cap[i] and "layers.0/" in n.name}


def test_attention_scope_ends_at_the_residual_add_after_attention(dense):
    """Megatron-Core's "attn" captures _forward_attention(): the input norm, the projections, the attention and the
    residual add after it; the norm before the MLP and the MLP are _forward_mlp()'s, which "mlp" captures."""
    attn, mlp = _layer0(dense, ("attn",)), _layer0(dense, ("mlp",))
    assert any("input_layernorm" in n for n in attn) and any("q_proj" in n for n in attn)
    assert any("o_proj" in n for n in attn) and "/model/layers.0/Add" in attn
    assert not any("mlp" in n or "post_attention_layernorm" in n for n in attn)
    assert any("post_attention_layernorm" in n for n in mlp) and any("down_proj" in n for n in mlp)
    assert not attn & mlp and "/model/layers.0/Add_1" in mlp


def test_router_scopes_capture_the_router_and_not_the_experts(moe):
    """"moe_router" (with "moe_preprocess") captures a MoE layer up to its router's output (Megatron-Core's graph
    ends after route()): the norm, the router's GEMM, its top-k and probabilities, not the routed experts' GEMMs,
    the gather of the tokens they read, nor what combines their outputs; "mlp" captures nothing of a MoE layer."""
    cap = _layer0(moe, ("moe_router", "moe_preprocess"))
    assert any("gate/MatMul" in n for n in cap) and any("post_attention_layernorm" in n for n in cap)
    assert "/model/layers.0/mlp/TopK" in cap and "/model/layers.0/mlp/Gather" not in cap
    assert not any("experts/MatMul" in n for n in cap) and not any("ScatterND" in n for n in cap)
    assert not any("mlp/" in n for n in _layer0(moe, ("mlp",)))
    assert any("experts/MatMul" in n for n in _layer0(moe, ("moe",)))


def test_per_layer_graphs_hold_the_language_models_layers_not_an_encoders():
    """A VLM's vision tower runs eagerly beside a decoder whose layers' attention is graphed."""
    graph = _graph_for_costing("llava-style-7b", 1024, None, dict(layers=2, vision_layers=2))
    facts = GraphFacts(graph, discover_blocks(graph))
    cap = facts.captured(("attn",))
    by = {b.submodel: bool(cap[list(b.nodes)].any()) for b in facts.structure.layers()}
    assert by == {"language_model": True, "vision_tower": False}


def _times(facts, host_us: float, scopes: tuple[str, ...]):
    cluster = dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=host_us * US)
    execution = dataclasses.replace(load_execution("megatron-core"), cuda_graphs=scopes)
    return NodeTimes(facts, cluster, make_workload("train", 8, 256, "bf16", None), Strategy(dp=8, micro_batch=1),
                     execution)


def test_captured_ops_pay_no_host_overhead_and_the_others_pay_it(dense):
    """With 10 us per kernel issued: under "attn" graphs the attention's ops cost what they cost with no host
    overhead and the MLP's GEMMs 10 us more forward (20 backward); under a full-iteration graph those too pay none."""
    nodes = dense.graph.nodes
    bare, attn, whole = _times(dense, 0.0, ()), _times(dense, 10.0, ("attn",)), _times(dense, 10.0,
                                                                                      ("full_iteration",))
    q = next(i for i, n in enumerate(nodes) if "layers.0/self_attn/q_proj/MatMul" in n.name)
    down = next(i for i, n in enumerate(nodes) if "layers.0/mlp/down_proj/MatMul" in n.name)
    assert attn.forward(q, 1) == pytest.approx(bare.forward(q, 1))
    assert attn.forward(down, 1) == pytest.approx(bare.forward(down, 1) + 10 * US)
    assert attn.backward(down, 1) == pytest.approx(bare.backward(down, 1) + 20 * US)
    assert whole.forward(down, 1) == pytest.approx(bare.forward(down, 1))


def test_a_scope_megatron_core_does_not_have_is_refused_by_name():
    ex = load_execution("megatron-core")
    assert with_changes(ex, {"cuda_graphs": ["attn", "moe_router"]}, "run").cuda_graphs == ("attn", "moe_router")
    with pytest.raises(InvalidInput, match="cuda_graphs.*full_iteration.*'layer'"):
        with_changes(ex, {"cuda_graphs": ["layer"]}, "run")
    with pytest.raises(InvalidInput, match="cuda_graphs"):
        with_changes(ex, {"cuda_graphs": ["full_iteration", "attn"]}, "run")
    with pytest.raises(InvalidInput, match="not both"):
        with_changes(ex, {"cuda_graphs": ["moe", "moe_router"]}, "run")
    with pytest.raises(InvalidInput, match="only together with"):
        with_changes(ex, {"cuda_graphs": ["attn", "moe_preprocess"]}, "run")


def test_an_estimate_with_graphs_says_what_they_leave_out():
    """The caveats name the graphs the figures assume, and that the router's scope is taken with its preprocessing."""
    from planner.caveats import assumptions

    ex = with_changes(load_execution("megatron-core"), {"cuda_graphs": ["attn", "moe_router"]}, "run")
    work = dataclasses.replace(make_workload("train", 8, 256, "bf16", None), execution=ex)
    said = [a for a in assumptions(load_cluster("dgx-h100", devices=8), work) if "CUDA graphs" in a]
    assert len(said) == 1 and "attn, moe_router" in said[0] and "dispatcher preprocessing" in said[0]
    plain = make_workload("train", 8, 256, "bf16", None)
    assert not any("CUDA graphs" in a for a in assumptions(load_cluster("dgx-h100", devices=8), plain))
