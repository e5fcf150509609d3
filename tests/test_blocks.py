"""Block discovery on hand-built graphs: layers, types, sub-models, propagation, speed."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

import pytest

from planner.graph.blocks import ROOT_BLOCK, discover_blocks, layer_of_path
from planner.graph.ir import Graph, Node, Tensor
from planner.graph.towers import towers_of_stacks

B, S, H, F, V = 2, 8, 16, 32, 50


@dataclass
class GB:
    """A tiny graph builder: params, ops with scopes, and a Graph at the end."""

    scoped: bool = True
    nodes: list[Node] = field(default_factory=list)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)

    def param(self, name: str, *shape: int) -> str:
        if name not in self.tensors:
            self.tensors[name] = Tensor(name, tuple(shape), "float32", is_param=True)
            self.params.append(name)
        return name

    def op(self, op: str, inputs: list[str], shape: tuple[int, ...], scope: str, *, dtype: str = "float32",
           flops: float = 1.0, **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.tensors[out] = Tensor(out, shape, dtype)
        self.nodes.append(Node(f"n{len(self.nodes)}", op, tuple(inputs), (out,), attrs,
                               scope=scope if self.scoped else "", flops=flops))
        return out

    def graph(self, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> Graph:
        return Graph("g", tuple(self.nodes), dict(self.tensors), inputs, outputs, tuple(self.params))


def rms_norm(g: GB, x: str, path: str) -> str:
    sq = g.op("Pow", [x], (B, S, H), path)
    mean = g.op("ReduceMean", [sq], (B, S, 1), path, keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [mean], (B, S, 1), path)], (B, S, 1), path)
    return g.op("Mul", [g.op("Mul", [x, inv], (B, S, H), path), g.param(f"{path}.weight", H)], (B, S, H), path)


def linear(g: GB, x: str, path: str, n_in: int, n_out: int, lead: tuple[int, ...] = (B, S)) -> str:
    return g.op("MatMul", [x, g.param(f"{path}.weight", n_in, n_out)], (*lead, n_out), path, flops=2.0 * n_in * n_out)


def decoder_layer(g: GB, x: str, p: str, *, moe: bool = False, shared: dict[str, str] | None = None,
                  softmax_axis: int = -1, ffn: int = F, rope: str | None = None) -> str:
    """Pre-norm attention + MLP (or top-2 MoE over 4 experts). `shared` holds constants made once.

    `rope` names a table of cosines every layer multiplies its queries by; the first layer unsqueezes it for
    all of them, as TorchScript's exporter writes it.
    """
    shared = shared if shared is not None else {}
    h = rms_norm(g, x, f"{p}.input_layernorm")
    a = f"{p}.self_attn"
    q, k, v = (linear(g, h, f"{a}.{n}_proj", H, H) for n in "qkv")
    if rope is not None:
        if "cos" not in shared:
            shared["cos"] = g.op("Unsqueeze", [rope], (1, S, H), a)
        q = g.op("Mul", [q, shared["cos"]], (B, S, H), a)
    if "scale" not in shared:  # the exporter makes a constant once; later layers read it
        shared["scale"] = g.op("Constant", [], (), a, value=0.25)
    if "rows" not in shared:  # ... and a symbolic size (batch * seq), an int64 scalar
        shape = g.op("Shape", [x], (3,), a, dtype="int64")
        shared["rows"] = g.op("Mul", [shape, shape], (), a, dtype="int64")
    kt = g.op("Transpose", [k], (B, H, S), a, perm=[0, 2, 1])
    scores = g.op("Mul", [g.op("MatMul", [q, kt], (B, S, S), a), shared["scale"]], (B, S, S), a)
    attn = g.op("MatMul", [g.op("Softmax", [scores], (B, S, S), a, axis=softmax_axis), v], (B, S, H), a)
    x = g.op("Add", [x, linear(g, attn, f"{a}.o_proj", H, H)], (B, S, H), p)
    h = rms_norm(g, x, f"{p}.post_attention_layernorm")
    m = f"{p}.mlp"
    flat = g.op("Reshape", [h, shared["rows"]], (B * S, H), m)
    if moe:
        logits = linear(g, flat, f"{m}.gate", H, 4, lead=(B * S,))
        g.op("TopK", [logits], (B * S, 2), m, axis=-1)
        idx = g.op("TopK", [logits], (B * S, 2), m, dtype="int64")
        w = g.op("Gather", [g.param(f"{m}.experts.gate_up_proj", 4, H, 2 * ffn), idx], (B * S, 2, H, 2 * ffn), m)
        up = g.op("MatMul", [flat, w], (B * S, 2, 2 * ffn), f"{m}.experts")
        wd = g.op("Gather", [g.param(f"{m}.experts.down_proj", 4, ffn, H), idx], (B * S, 2, ffn, H), m)
        out = g.op("ReduceSum", [g.op("MatMul", [up, wd], (B * S, 2, H), f"{m}.experts")], (B * S, H), m)
    else:
        gate = g.op("Sigmoid", [linear(g, flat, f"{m}.gate_proj", H, ffn, lead=(B * S,))], (B * S, ffn), m)
        up = linear(g, flat, f"{m}.up_proj", H, ffn, lead=(B * S,))
        out = linear(g, g.op("Mul", [gate, up], (B * S, ffn), m), f"{m}.down_proj", ffn, H, lead=(B * S,))
    return g.op("Add", [x, g.op("Reshape", [out], (B, S, H), m)], (B, S, H), p)


def llama(n_layers: int = 4, *, scoped: bool = True, stack: str = "model.layers", root: str = "model",
          moe_from: int | None = None, tied: bool = False, rope: bool = False) -> Graph:
    g = GB(scoped=scoped)
    g.tensors["input_ids"] = Tensor("input_ids", (B, S), "int64")
    cos = g.op("Cos", [g.op("Range", [], (S, H), f"{root}.rotary_emb")], (S, H), f"{root}.rotary_emb") if rope else None
    table = g.param(f"{root}.embed_tokens.weight", V, H)
    x = g.op("Gather", [table, "input_ids"], (B, S, H), f"{root}.embed_tokens")
    shared: dict[str, str] = {}
    for i in range(n_layers):
        x = decoder_layer(g, x, f"{stack}.{i}", moe=moe_from is not None and i >= moe_from, shared=shared, rope=cos)
    x = rms_norm(g, x, f"{root}.norm")
    head = table if tied else g.param("lm_head.weight", H, V)
    logits = g.op("MatMul", [x, head], (B, S, V), "lm_head", flops=2.0 * H * V)
    return g.graph(("input_ids",), (logits,))


def test_layer_of_path_takes_the_outermost_number():
    assert layer_of_path("model.layers.3.mlp.experts.7.w1") == ("model.layers", 3)
    assert layer_of_path("transformer.h.11") == ("transformer.h", 11)
    assert layer_of_path("0.conv") == ("", 0)
    assert layer_of_path("model.embed_tokens") is None
    assert layer_of_path("") is None


def test_llama_layers_are_one_type_and_blocks_cover_every_node():
    graph = llama(4)
    st = discover_blocks(graph)
    layers = st.layers()
    assert [b.name for b in layers] == [f"model.layers.{i}" for i in range(4)]
    assert [b.index for b in layers] == [0, 1, 2, 3]
    assert len({b.type_id for b in layers}) == 1
    t = st.type_of("model.layers.2")
    assert t.count == 4 and t.kind == "attention" and t.label == "model.layers (transformer layer)"
    names = [b.name for b in st.blocks]
    assert {"model.embed_tokens", "model.norm", "lm_head"} <= set(names)
    assert [s.name for s in st.submodels] == ["model"] and st.submodels[0].layers == 4
    assert sorted(i for b in st.blocks for i in b.nodes) == list(range(len(graph.nodes)))
    assert sum(b.param_count for b in st.blocks) == graph.param_count
    assert sum(b.flops for b in st.blocks) == pytest.approx(graph.flops)
    # the shared constant and size live in layer 0, yet every layer has the same type
    assert len(layers[0].nodes) > len(layers[1].nodes) == len(layers[3].nodes)
    per_layer = 4 * H * H + 3 * H * F + 2 * H
    assert all(b.param_count == per_layer for b in layers) and t.param_count == per_layer
    for i, node in enumerate(graph.nodes):
        assert st.block_of_node(i).name in node.scope or node.scope.startswith(st.block_of_node(i).name)
    assert st.block_of_node(len(graph.nodes)) is None


def test_without_scopes_parameter_names_and_neighbours_give_the_same_layers():
    scoped, bare = discover_blocks(llama(4)), discover_blocks(llama(4, scoped=False))
    assert [b.name for b in bare.layers()] == [b.name for b in scoped.layers()]
    assert len({b.type_id for b in bare.layers()}) == 1
    assert [b.param_count for b in bare.layers()] == [b.param_count for b in scoped.layers()]
    graph = llama(4, scoped=False)
    for i, node in enumerate(graph.nodes):  # every op reading a weight sits in the weight's module
        weights = [n for n in node.inputs if n in graph.tensors and graph.tensors[n].is_param]
        if weights:
            assert weights[0].startswith(bare.block_of_node(i).name + ".")
    # the softmax of layer 2 sits between layer-2 matmuls: it joins layer 2
    softmaxes = [i for i, n in enumerate(graph.nodes) if n.op_type == "Softmax"]
    assert [bare.block_of_node(i).name for i in softmaxes] == [f"model.layers.{k}" for k in range(4)]


@pytest.mark.parametrize("n_layers", [2, 4])
@pytest.mark.parametrize("scoped", [True, False])
def test_a_table_the_first_layer_prepares_for_all_keeps_the_layers_one_type(n_layers, scoped):
    """TorchScript's exporter unsqueezes the rotary table once, inside layer 0: still a layer like the rest."""
    graph = llama(n_layers, scoped=scoped, rope=True)
    st = discover_blocks(graph)
    unsqueeze = next(i for i, n in enumerate(graph.nodes) if n.op_type == "Unsqueeze")
    assert st.block_of_node(unsqueeze).name == "model.layers.0"
    assert len({b.type_id for b in st.layers()}) == 1
    assert len(st.layers()[0].nodes) > len(st.layers()[1].nodes)


def test_dense_first_layers_and_moe_layers_are_two_types():
    st = discover_blocks(llama(5, moe_from=2))
    types = [st.type_of(b.name) for b in st.layers()]
    assert [t.kind for t in types] == ["attention", "attention", "moe", "moe", "moe"]
    assert types[0].count == 2 and types[2].count == 3 and types[0].type_id != types[2].type_id
    assert (types[0].label, types[2].label) == ("model.layers[dense]", "model.layers[moe]")
    assert len(st.repeated_types()) == 2


def test_structure_not_names_decides_the_type():
    a = discover_blocks(llama(2))
    b = discover_blocks(llama(2, stack="decoder.blocks", root="decoder"))
    assert a.layers()[0].type_id == b.layers()[0].type_id
    assert b.layers()[1].name == "decoder.blocks.1"
    g = GB()
    g.tensors["x"] = Tensor("x", (B, S, H), "float32")
    y = decoder_layer(g, "x", "layers.0")
    decoder_layer(g, y, "layers.1", softmax_axis=1)  # one attribute differs
    decoder_layer(g, y, "layers.2", ffn=2 * F)  # parameter shapes differ
    st = discover_blocks(g.graph(("x",), ()))
    assert len({b.type_id for b in st.layers()}) == 3


def test_numbered_leaves_are_not_layers_and_a_shortened_scope_gives_way_to_the_weight():
    """A Sequential(Linear, GELU, Linear) after the layers is one block; an embedding reached through a getter
    (scope `model.embed_tokens`, weight `model.text.embed_tokens.weight`) sits in the weight's module."""
    g = GB()
    g.tensors["input_ids"] = Tensor("input_ids", (B, S), "int64")
    x = g.op("Gather", [g.param("model.text.embed_tokens.weight", V, H), "input_ids"], (B, S, H), "model.embed_tokens")
    for i in range(2):
        x = decoder_layer(g, x, f"model.text.layers.{i}")
    x = linear(g, x, "model.merger.mlp.0", H, F)
    x = g.op("Gelu", [x], (B, S, F), "model.merger.mlp.1")
    x = linear(g, x, "model.merger.mlp.2", F, H)
    st = discover_blocks(g.graph(("input_ids",), (x,)))
    assert [b.name for b in st.layers()] == ["model.text.layers.0", "model.text.layers.1"]
    assert st.block("model.merger").param_count == 2 * H * F
    assert st.block("model.text.embed_tokens").param_count == V * H


def test_tied_embedding_counts_once():
    graph = llama(2, tied=True)
    st = discover_blocks(graph)
    assert st.block("model.embed_tokens").param_count == V * H
    assert st.block("lm_head").param_count == 0
    assert sum(b.param_count for b in st.blocks) == graph.param_count


def _two_towers(vision: str, text: str, extra: list[tuple[str, str]]) -> Graph:
    """A vision stack feeding a projector feeding a text stack; `extra` adds (scope, reads) single ops."""
    g = GB()
    g.tensors["pixels"] = Tensor("pixels", (B, S, H), "float32")
    g.tensors["input_ids"] = Tensor("input_ids", (B, S), "int64")
    x = g.op("Conv", ["pixels", g.param(f"{vision.rsplit('.', 2)[0]}.embeddings.patch.weight", H, H)], (B, S, H),
             f"{vision.rsplit('.', 2)[0]}.embeddings")
    x = decoder_layer(g, x, f"{vision}.0", ffn=2 * F)
    x = decoder_layer(g, x, f"{vision}.1", ffn=2 * F)
    outs = {"vision": x}
    for scope, reads in extra:
        outs[scope] = linear(g, outs[reads], scope, H, H)
    t = g.op("Gather", [g.param("model.language_model.embed_tokens.weight", V, H), "input_ids"], (B, S, H),
             "model.language_model.embed_tokens")
    t = g.op("Add", [t, outs[extra[0][0]] if extra else x], (B, S, H), "model")
    for i in range(3):
        t = decoder_layer(g, t, f"{text}.{i}")
    logits = linear(g, t, "lm_head", H, V)
    return g.graph(("pixels", "input_ids"), (logits,))


def test_vision_tower_projector_and_language_model_are_three_submodels():
    graph = _two_towers("model.vision_tower.vision_model.encoder.layers", "model.language_model.layers",
                        [("model.multi_modal_projector", "vision")])
    st = discover_blocks(graph)
    assert [s.name for s in st.submodels] == ["vision_tower", "multi_modal_projector", "language_model"]
    assert st.submodel("vision_tower").layers == 2 and st.submodel("language_model").layers == 3
    assert st.block("lm_head").submodel == "language_model"
    assert st.block("model.language_model.embed_tokens").submodel == "language_model"
    assert st.block("model.vision_tower.vision_model.embeddings").submodel == "vision_tower"
    vis, txt = st.layers()[0], st.layers()[-1]
    assert vis.type_id != txt.type_id and st.type(vis.type_id).submodel == "vision_tower"
    assert sum(s.param_count for s in st.submodels) == graph.param_count


def test_clip_like_projections_join_their_tower_by_data_flow():
    graph = _two_towers("vision_model.encoder.layers", "text_model.encoder.layers",
                        [("visual_projection", "vision")])
    st = discover_blocks(graph)
    assert [s.name for s in st.submodels] == ["vision_model", "text_model"]
    assert st.block("visual_projection").submodel == "vision_model"
    assert st.block("lm_head").submodel == "text_model"


def test_tower_naming_rules():
    assert towers_of_stacks(["model.encoder.layers", "model.decoder.layers"]) == {
        "model.encoder.layers": ("encoder", ("model.encoder",)),
        "model.decoder.layers": ("decoder", ("model.decoder",))}
    stages = towers_of_stacks(["layer1", "layer2", "layer3"])  # ResNet stages: one tower
    assert {name for name, _ in stages.values()} == {"model"}
    assert towers_of_stacks(["transformer.h"]) == {"transformer.h": ("transformer", ("transformer.h",))}
    assert towers_of_stacks([]) == {}


def test_graph_without_any_path_is_one_root_block():
    g = GB(scoped=False)
    g.tensors["x"] = Tensor("x", (B, H), "float32")
    y = g.op("Relu", [g.op("Relu", ["x"], (B, H), "")], (B, H), "")
    st = discover_blocks(g.graph(("x",), (y,)))
    assert [b.name for b in st.blocks] == [ROOT_BLOCK] and st.layers() == ()
    assert [s.name for s in st.submodels] == ["model"]


def _calls(fn) -> int:
    """Python and C function calls made by fn(): a measure of work that does not depend on the machine's speed."""
    n = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            n[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def test_deterministic_and_linear_time_at_16k_nodes():
    small, big = llama(140), llama(280)
    work = _calls(lambda: discover_blocks(small)), _calls(lambda: discover_blocks(big))
    assert work[1] <= 2.2 * work[0], f"twice the layers cost {work[1] / work[0]:.2f}x the calls: not linear"
    graph = llama(560)
    assert len(graph.nodes) > 16_000
    st = discover_blocks(graph)
    assert st.type_of("model.layers.559").count == 560
    assert discover_blocks(graph) == st
    shuffled = replace(graph, tensors=dict(reversed(list(graph.tensors.items()))))
    assert discover_blocks(shuffled) == st
