"""Layers as model-local functions: the compact zoo graph imports to exactly the flat one."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import models_zoo
from models_zoo.graph_builder import FUNCTION_DOMAIN, NAME_SCOPES_KEY
from planner.graph.ir import Graph
from planner.graph.onnx_import import import_model
from tests import graphs

# One small member per family and tower style; each keeps every layer type of its preset.
SMALL = {
    "gpt3-13b": dict(layers=3),
    "llama3-8b": dict(layers=3),
    "mixtral-8x7b": dict(layers=3, seq_len=256),
    "deepseek-v3": dict(layers=5, seq_len=256),  # 3 dense layers, then 2 MoE layers
    "vit-l-16": dict(layers=3),
    "llava-style-7b": dict(layers=3, vision_layers=3),
    "internvl2-76b": dict(layers=3, vision_layers=3),
    "omni-moe-30b-a3b": dict(layers=3, vision_layers=3, deepstack=(0, 2), audio_layers=2),
    "qwen3-8b": dict(layers=3),
    "qwen3-30b-a3b": dict(layers=3, seq_len=256),
    "nemotron4-15b": dict(layers=3),
    "kimi-k2": dict(layers=3, seq_len=256),  # 1 dense layer, then 2 MoE layers
    "gpt-oss-20b": dict(layers=3, seq_len=256),  # banded, full, banded
    "llama4-maverick": dict(layers=4, seq_len=256),  # dense, MoE, dense, MoE without RoPE
}


def _node_rows(g: Graph) -> list[tuple]:
    """Everything about a node except the names of intermediate values (the inliner renames those)."""
    def desc(names: tuple[str, ...]) -> tuple:
        out = []
        for n in names:
            t = g.tensors.get(n) if n else None
            out.append(None if t is None else (t.shape, t.dtype, t.is_param, n if t.is_param else ""))
        return tuple(out)

    return [(n.name, n.op_type, n.domain, n.scope, n.attrs, n.flops, n.bytes_read, n.bytes_written, n.cost_known,
             desc(n.inputs), desc(n.outputs)) for n in g.nodes]


def assert_same_graph(flat: Graph, compact: Graph) -> None:
    assert len(compact.nodes) == len(flat.nodes)
    for a, b in zip(_node_rows(flat), _node_rows(compact)):
        assert a == b, f"{a[0]} differs"
    assert compact.params == flat.params
    assert [compact.tensors[p] for p in compact.params] == [flat.tensors[p] for p in flat.params]
    assert (compact.inputs, compact.outputs, compact.flops) == (flat.inputs, flat.outputs, flat.flops)
    assert compact.param_count == flat.param_count and dict(compact.metadata) == dict(flat.metadata)
    assert [n for n in compact.notes if not n.startswith("inlined ")] == list(flat.notes)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_compact_graph_imports_to_the_flat_graph(name):
    flat = models_zoo.build(name, flat=True, **SMALL[name])
    compact = models_zoo.build(name, **SMALL[name])
    assert compact.functions and not flat.functions
    assert len(compact.SerializeToString()) < len(flat.SerializeToString()) / 2
    assert models_zoo.inlined_node_count(compact) == len(flat.graph.node)
    assert [(t.name, list(t.dims)) for t in compact.graph.initializer] == \
        [(t.name, list(t.dims)) for t in flat.graph.initializer]
    onnx.checker.check_model(compact, full_check=True)
    assert_same_graph(import_model(flat), import_model(compact))


def test_per_expert_layout_as_functions_imports_the_same():
    cfg = dict(layers=4, experts=16, top_k=4, seq_len=64)
    flat = import_model(models_zoo.build("deepseek-v3", flat=True, expert_layout="per_expert", **cfg))
    compact = import_model(models_zoo.build("deepseek-v3", expert_layout="per_expert", **cfg))
    assert_same_graph(flat, compact)
    assert "model.layers.3.mlp.experts.15.down_proj.weight" in compact.params


def test_one_function_per_layer_type_called_once_per_layer():
    model = models_zoo.build("deepseek-v3", layers=6)
    funcs = {f.name: f for f in model.functions}
    assert sorted(funcs) == ["DeepseekV3DenseLayer", "DeepseekV3MoeLayer"]
    calls = [n for n in model.graph.node if n.domain == FUNCTION_DOMAIN]
    assert [(n.name, n.op_type) for n in calls] == \
        [(f"/model/layers.{i}/DeepseekV3{'Dense' if i < 3 else 'Moe'}Layer", n.op_type) for i, n in enumerate(calls)]
    moe = funcs["DeepseekV3MoeLayer"]
    assert list(moe.input[:4]) == ["hidden_states", "cos", "sin", "attention_mask"]
    assert "mlp.experts.gate_up_proj" in moe.input and "self_attn.q_a_proj.weight" in moe.input
    # each call passes its own layer's parameters, in the body's order
    call = calls[4]
    assert list(call.input[4:]) == [f"model.layers.4.{p}" for p in moe.input[4:]]
    # bodies are named relative to the layer and carry no per-node metadata
    body = [n.name for n in moe.node]
    assert "/self_attn/q_b_proj/MatMul" in body and "/mlp/experts/MatMul" in body
    assert not any(n.metadata_props for f in model.functions for n in f.node)
    scopes = {p.value for n in calls for p in n.metadata_props if p.key == NAME_SCOPES_KEY}
    assert "['', 'model', 'model.layers.0', 'deepseekv3denselayer']" in scopes


def test_every_preset_is_a_few_hundred_kilobytes_and_much_smaller_than_flat():
    for name in ("deepseek-v3", "llama3-405b"):
        compact = len(models_zoo.build(name).SerializeToString())
        flat = len(models_zoo.build(name, flat=True).SerializeToString())
        assert compact < 250_000 and compact * 8 < flat, (name, compact, flat)


def test_compact_build_is_deterministic_and_flat_must_be_a_bool():
    a = models_zoo.build("omni-moe-30b-a3b", **SMALL["omni-moe-30b-a3b"]).SerializeToString()
    assert a == models_zoo.build("omni-moe-30b-a3b", **SMALL["omni-moe-30b-a3b"]).SerializeToString()
    with pytest.raises(ValueError, match="flat must be True or False, got 'yes'"):
        models_zoo.build("gpt", flat="yes")


def test_importer_names_inlined_nodes_by_path_and_keeps_other_names_unique():
    g = import_model(graphs.with_functions(), batch=4)
    assert [n.name for n in g.nodes] == ["/layers.0/fc/MatMul", "/layers.0/act/Relu", "/layers.1/fc/MatMul",
                                         "/layers.1/act/Relu"]
    body = helper.make_function("lib", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"], name="relu")],
                                opset_imports=graphs.opset(18))
    calls = [helper.make_node("F", ["x"], ["h"], domain="lib", name="/layers.0/F"),
             helper.make_node("F", ["h"], ["y"], domain="lib", name="/layers.1/F")]
    model = graphs.model(calls, [graphs.vi("x", [2, 3])], [graphs.vi("y", None)], (), 18, functions=[body],
                         extra=[("lib", 1)])
    names = [n.name for n in import_model(model).nodes]
    assert len(set(names)) == 2 and all(n.startswith("relu") for n in names)
