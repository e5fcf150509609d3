"""Rotary embeddings with scaled tables (planner.costing.rotary): found in hand-built graphs and in a real
transformers export of gpt-oss, costed as eager ops on Megatron-Core (each op its own kernel at its own bytes, the
slices views) and as the fused kernel elsewhere; the Megatron source lines behind that are pinned."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

import models_zoo
from cost_models import load_cluster
from cost_models.compute import op_time_s
from planner.costing.execution import load_execution as load_stack
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.costing.rotary import scaled_rotary_nodes, table_scales
from planner.graph.blocks import discover_blocks as find_structure
from planner.graph.onnx_import import import_model
from planner.graph.walk import index_graph
from planner.strategy import Strategy, Workload

DATA = Path(__file__).parent / "data"
FIXTURES = Path(__file__).parent / "fixtures" / "hf"
B, H, S, D = 2, 4, 8, 16  # batch, heads, tokens, head dim


def rope_graph(scale: float | None) -> onnx.ModelProto:
    """q [B, H, S, D] -> q * cos + rotate_half(q) * sin, the tables from Cos/Sin of an input angle, multiplied by
    `scale` (None: no product at all), as transformers' rotary classes write them."""
    nodes = [helper.make_node("Cos", ["angle"], ["cos0"]), helper.make_node("Sin", ["angle"], ["sin0"])]
    cos, sin = "cos0", "sin0"
    if scale is not None:
        nodes.append(helper.make_node("Constant", [], ["f"], value=helper.make_tensor("v", TensorProto.FLOAT, [],
                                                                                        [scale])))
        nodes += [helper.make_node("Mul", ["cos0", "f"], ["cos"]), helper.make_node("Mul", ["sin0", "f"], ["sin"])]
        cos, sin = "cos", "sin"
    half = [helper.make_node("Constant", [], [n], value=helper.make_tensor("v", TensorProto.INT64, [1], [v]))
            for n, v in (("zero", 0), ("mid", D // 2), ("end", D), ("last", -1))]
    nodes += half + [
        helper.make_node("Slice", ["q", "zero", "mid", "last"], ["q1"]),
        helper.make_node("Slice", ["q", "mid", "end", "last"], ["q2"]),
        helper.make_node("Neg", ["q2"], ["nq2"]),
        helper.make_node("Concat", ["nq2", "q1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["q", cos], ["qc"]),
        helper.make_node("Mul", ["rot", sin], ["rs"]),
        helper.make_node("Add", ["qc", "rs"], ["out"]),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("q", f, [B, H, S, D]),
                                              helper.make_tensor_value_info("angle", f, [S, D])],
                              [helper.make_tensor_value_info("out", f, [B, H, S, D])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def marked(graph) -> list[str]:
    mask = scaled_rotary_nodes(graph, index_graph(graph))
    return sorted(graph.nodes[i].op_type for i in np.flatnonzero(mask))


def test_a_scaled_table_marks_the_products_their_sum_and_the_rotation():
    g = import_model(rope_graph(1.25))
    assert table_scales(g)["cos"] == 1.25 and table_scales(g)["sin0"] == 1.0
    assert marked(g) == ["Add", "Concat", "Mul", "Mul", "Neg", "Slice", "Slice"]


def test_unscaled_tables_mark_nothing():
    assert marked(import_model(rope_graph(1.0))) == []  # transformers multiplies by an attention_scaling of 1
    assert marked(import_model(rope_graph(None))) == []


def test_a_real_gpt_oss_export_scales_its_tables_by_yarns_factor():
    """transformers 5's GptOssForCausalLM (YaRN, factor 32 by default), exported by torch's dynamo exporter: its
    two layers' queries and keys each apply RoPE with tables scaled by 0.1 ln 32 + 1; Llama's are not scaled."""
    g = import_model(FIXTURES / "gpt_oss_dyn20_inline_named.onnx", batch=1, seq_len=16)
    assert {round(v, 6) for v in table_scales(g).values()} == {1.0, round(0.1 * math.log(32.0) + 1.0, 6)}
    ops = marked(g)  # per layer and head tensor: its chunk (views), 4 half products, a difference, a sum, a concat
    assert {op: ops.count(op) for op in set(ops)} == {"SplitToSequence": 4, "SequenceAt": 8, "Mul": 16, "Sub": 4,
                                                      "Add": 4, "Concat": 4}
    assert marked(import_model(FIXTURES / "llama_dyn18_inputs_named.onnx", batch=1, seq_len=16)) == []


def node_times(stack: str, graph) -> NodeTimes:
    facts = GraphFacts(graph, find_structure(graph))
    cluster = load_cluster("dgx-h100", devices=8)
    workload = Workload(mode="train", dtype="fp32", seq_len=S, global_batch=B, execution=load_stack(stack))
    return NodeTimes(facts, cluster, workload, Strategy(micro_batch=B), workload.execution)


def test_megatron_core_runs_a_scaled_rope_as_eager_ops_and_torchtitan_fuses_it():
    """Hand-worked: on Megatron-Core each op is a kernel reading its inputs and writing its output (the Add: two
    [B, H, S, D] fp32 tensors in, one out) plus one host issue; the slices are views. torchtitan fuses the chain:
    the sum's inputs never reach HBM."""
    g = import_model(rope_graph(1.25))
    idx = {n.op_type: i for i, n in enumerate(g.nodes)}
    mc = node_times("megatron-core", g)
    n = B * H * S * D
    want = op_time_s(mc.cluster, 0.0, 3 * 4 * n, "elementwise", "fp32") + mc.cluster.host_overhead_s
    assert math.isclose(mc.forward(idx["Add"], 1), want, rel_tol=1e-9)
    assert mc.forward(next(i for i, x in enumerate(g.nodes) if x.op_type == "Slice"), 1) == 0.0
    tt = node_times("torchtitan", g)
    fused = tt.forward(idx["Add"], 1) - (tt.cluster.host_overhead_s if tt.training else 0.0)
    assert fused < op_time_s(tt.cluster, 0.0, 3 * 4 * n, "elementwise", "fp32")
    unscaled = import_model(rope_graph(1.0))
    plain = node_times("megatron-core", unscaled)
    add = next(i for i, x in enumerate(unscaled.nodes) if x.op_type == "Add")
    assert plain.forward(add, 1) < mc.forward(idx["Add"], 1)


def test_megatron_source_pins_the_stack_and_gpt_oss_factor():
    """The fallback line in rope_utils at both commits, Megatron's concentration factor with mscale unset, and
    Megatron-Bridge's GPT-OSS bridge leaving both unset in every release: the stack and the zoo follow them."""
    pins = json.loads((DATA / "megatron_rope.json").read_text())
    for rev in pins["megatron_lm"]["rope_utils"].values():
        lines = [x.strip() for x in rev["lines"]]
        assert lines[0] == "if mscale != 1.0:" and "Using unfused implementation." in lines[3]
        assert lines[-1] == "use_unfused = True"
    concentration = [x.strip() for x in pins["megatron_lm"]["yarn"]["concentration"]]
    assert "if mscale is None or mscale_all_dim is None:" in concentration
    assert "return _yarn_get_mscale(scaling_factor)" in concentration
    assert pins["megatron_lm"]["yarn"]["get_mscale"][-1].strip() == "return 0.1 * mscale * math.log(scale) + 1.0"
    for tag in pins["megatron_bridge"]["gpt_oss_yarn_by_tag"].values():
        text = " ".join(tag["lines"])
        assert "yarn_mscale" in text and text.count("None") == 2 and "32.0" in text
    assert load_stack("megatron-core").scaled_rope_unfused and not load_stack("torchtitan").scaled_rope_unfused
    from models_zoo.gpt_oss import GptOssConfig
    assert math.isclose(GptOssConfig.__dataclass_fields__["rope_attention_factor"].default, 0.1 * math.log(32) + 1)


def test_hugging_face_configs_carry_yarns_attention_factor_into_the_zoo_graph(tmp_path):
    """gpt-oss-20b's own config.json (YaRN factor 32) and Qwen3-8B's with the YaRN rope_scaling its model card gives for
    128K tokens (factor 4): their zoo graphs scale the tables as transformers does, 0.1 ln(factor) + 1; Qwen3-8B's
    config as shipped (no scaling) does not."""
    oss = import_model(models_zoo.build_hf(DATA / "hf_configs" / "gpt-oss-20b", layers=2, seq_len=64), seq_len=64)
    assert {round(v, 6) for v in table_scales(oss).values()} == {1.0, round(0.1 * math.log(32.0) + 1.0, 6)}
    qwen = json.loads((DATA / "hf_configs" / "Qwen3-8B" / "config.json").read_text())
    plain = import_model(models_zoo.build_hf(DATA / "hf_configs" / "Qwen3-8B", layers=2, seq_len=64), seq_len=64)
    assert marked(plain) == []
    qwen["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    long = import_model(models_zoo.build_hf(tmp_path, layers=2, seq_len=64), seq_len=64)
    assert {round(v, 6) for v in table_scales(long).values()} == {1.0, round(0.1 * math.log(4.0) + 1.0, 6)}
    assert marked(long).count("Mul") == 2 * 2 * 2  # each layer's queries and keys, by cos and by sin


def test_an_eager_rope_is_a_kernel_boundary_for_the_ops_around_it():
    """In transformers' gpt-oss export the queries' bias add feeds the RoPE's chunk alone: fused, its output never
    reaches HBM; with the RoPE run eagerly the add writes it (and launches), for the chunk's products read it. (Where
    Transformer Engine's linear_qkv adds the bias in its GEMM, as Megatron-Core's does, that add is the graph's
    spelling of the GEMM's epilogue: the estimate charges it for every biased model alike.)"""
    g = import_model(FIXTURES / "gpt_oss_dyn20_inline_named.onnx", batch=1, seq_len=16)
    facts = GraphFacts(g, find_structure(g))
    index = facts.index
    chunks = [i for i in np.flatnonzero(facts.scaled_rope) if g.nodes[i].op_type == "SplitToSequence"]
    feeders = set()
    for i in chunks:  # through the head split's views (a reshape and a transpose)
        p = index.producer[g.nodes[i].inputs[0]]
        while g.nodes[p].op_type in ("Reshape", "Transpose"):
            p = index.producer[g.nodes[p].inputs[0]]
        feeders.add(p)
    adds = [i for i in feeders if g.nodes[i].op_type == "Add"]
    assert adds
    fused, eager = (facts.act_bytes(True, 2.0, True, True, eager_rope=e) for e in (False, True))
    for i in adds:
        written = g.tensors[g.nodes[i].outputs[0]].nbytes
        assert eager[i] - fused[i] == written
        assert facts.absorbed(False)[i] and not facts.absorbed(True)[i]


def test_estimate_says_when_the_stack_runs_a_scaled_rope_eagerly():
    """The assumption line: on megatron-core for gpt-oss (scaled tables), not for Llama (unscaled) nor on torchtitan
    (which fuses it)."""
    from planner.api import estimate_model

    def said(model: str, stack: str) -> bool:
        est = estimate_model(model, cluster="dgx-h100", devices=8, global_batch=8, seq_len=256, stack=stack,
                             overrides=dict(layers=2))
        return any("YaRN-scaled rotary embedding" in a for a in est["assumptions"])
    assert said("gpt-oss-20b", "megatron-core")
    assert not said("gpt-oss-20b", "torchtitan") and not said("llama3-8b", "megatron-core")
