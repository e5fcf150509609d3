"""Every zoo preset: valid ONNX, parameter counts that match the published sizes, clean names.

Presets are built in their default, compact form (layers as local functions);
`test_zoo_functions` checks that it imports to the same graph as the flat one.
"""

from __future__ import annotations

import ast
import json
import math

import onnx
import pytest

import models_zoo
from models_zoo.graph_builder import FUNCTION_DOMAIN, NAME_SCOPES_KEY, WEIGHTLESS_LOCATION

PRESETS = models_zoo.presets()
NAMES = [p.name for p in PRESETS]


@pytest.fixture(scope="module")
def built() -> dict[str, onnx.ModelProto]:
    return {name: models_zoo.build(name) for name in NAMES}


def graph_params(model: onnx.ModelProto) -> int:
    return sum(math.prod(t.dims) for t in model.graph.initializer)


@pytest.mark.parametrize("name", NAMES)
def test_preset_is_valid_onnx_and_strictly_inferable(built, name):
    model = built[name]
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = inferred.graph.output[0]
    assert all(d.dim_value > 0 for d in out.type.tensor_type.shape.dim)


@pytest.mark.parametrize("info", PRESETS, ids=NAMES)
def test_counts_match_graph_and_published_figures(built, info):
    model = built[info.name]
    assert graph_params(model) == info.params
    meta = {p.key: p.value for p in model.metadata_props}
    assert int(meta["hyperplan.params"]) == info.params
    assert int(meta["hyperplan.active_params"]) == info.active_params
    assert meta["hyperplan.family"] == info.family and meta["hyperplan.preset"] == info.name
    assert info.tolerance <= 0.02 and info.source
    assert abs(info.params / info.published_params - 1) <= info.tolerance, info.note
    assert abs(info.active_compared / info.published_active - 1) <= info.tolerance, info.note
    assert info.active_basis in ("all", "no_input_embedding")
    if info.active_basis == "all":
        assert info.active_compared == info.active_params
    else:  # the source leaves the input embedding table out of its active figure
        cfg = models_zoo.config(info.name)
        assert info.active_compared == info.active_params - cfg.vocab * cfg.hidden
        assert meta["hyperplan.active_params"] == str(info.active_params)  # the graph still states ours
    assert info.active_params <= info.params


def test_moe_active_is_a_fraction_and_dense_is_not():
    rows = {p.name: p for p in PRESETS}
    assert rows["deepseek-v3"].active_params < 0.06 * rows["deepseek-v3"].params
    assert rows["mixtral-8x7b"].active_params < 0.3 * rows["mixtral-8x7b"].params
    assert rows["llama3-70b"].active_params == rows["llama3-70b"].params


@pytest.mark.parametrize("name", NAMES)
def test_initializers_are_weightless_parameters_only(built, name):
    model = built[name]
    for t in model.graph.initializer:
        assert t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data
        assert {e.key: e.value for e in t.external_data} == {"location": WEIGHTLESS_LOCATION}
        assert t.data_type == onnx.TensorProto.BFLOAT16
    assert len(model.SerializeToString()) < 400_000  # layers as functions: a few hundred KB at most


@pytest.mark.parametrize("name", ["llama3-8b", "deepseek-v3", "llava-style-7b"])
def test_node_names_and_scopes_follow_the_exporters(name):
    """TorchScript-style names (/model/layers.0/self_attn/...) and dynamo-style name_scopes agree (flat form)."""
    model = models_zoo.build(name, flat=True)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names)
    for node in model.graph.node:
        scopes = ast.literal_eval({p.key: p.value for p in node.metadata_props}[NAME_SCOPES_KEY])
        assert scopes[0] == ""
        for a, b in zip(scopes[1:-2], scopes[2:-1]):  # each scope extends its parent
            assert b.startswith(a + ".")
        deepest = scopes[-2]
        assert node.name.startswith("/" + "/".join(_components(deepest)) + "/" if deepest else "/")
    expected = {
        "llama3-8b": "/model/layers.0/self_attn/q_proj/MatMul",
        "deepseek-v3": "/model/layers.0/self_attn/q_b_proj/MatMul",
        "llava-style-7b": "/model/language_model/layers.0/self_attn/q_proj/MatMul",
    }[name]
    assert expected in set(names)


def _components(dotted: str) -> list[str]:
    out: list[str] = []
    for part in dotted.split("."):
        if part.isdigit():
            out[-1] += "." + part
        else:
            out.append(part)
    return out


def test_parameter_names_are_hf_module_paths(built):
    llama = {t.name: list(t.dims) for t in built["llama3-8b"].graph.initializer}
    assert llama["model.embed_tokens.weight"] == [128256, 4096]
    assert llama["model.layers.0.self_attn.q_proj.weight"] == [4096, 4096]
    assert llama["model.layers.31.self_attn.k_proj.weight"] == [1024, 4096]
    assert llama["model.layers.0.mlp.down_proj.weight"] == [4096, 14336]
    assert llama["lm_head.weight"] == [128256, 4096]
    ds = {t.name: list(t.dims) for t in built["deepseek-v3"].graph.initializer}
    assert ds["model.layers.2.mlp.gate_proj.weight"] == [18432, 7168]
    assert ds["model.layers.3.mlp.experts.gate_up_proj"] == [256, 4096, 7168]
    assert ds["model.layers.60.mlp.experts.down_proj"] == [256, 7168, 2048]
    assert ds["model.layers.3.mlp.gate.weight"] == [256, 7168]
    assert ds["model.layers.3.mlp.shared_experts.up_proj.weight"] == [2048, 7168]
    assert ds["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == [576, 7168]
    llava = {t.name for t in built["llava-style-7b"].graph.initializer}
    assert "model.vision_tower.encoder.layers.22.self_attn.q_proj.weight" in llava
    assert "model.multi_modal_projector.linear_1.weight" in llava
    assert "model.language_model.layers.31.mlp.up_proj.weight" in llava
    omni = {t.name for t in built["omni-moe-30b-a3b"].graph.initializer}
    assert "model.audio_tower.layers.31.fc2.weight" in omni
    assert "model.language_model.layers.47.mlp.experts.gate_up_proj" in omni
    gpt = {t.name: list(t.dims) for t in built["gpt3-175b"].graph.initializer}
    assert gpt["transformer.h.95.attn.c_attn.weight"] == [12288, 3 * 12288]
    assert "lm_head.weight" not in gpt  # tied to transformer.wte.weight


def test_new_architecture_switches_name_parameters_as_transformers_does(built):
    qwen = {t.name: list(t.dims) for t in built["qwen3-32b"].graph.initializer}
    assert qwen["model.layers.63.self_attn.q_proj.weight"] == [8192, 5120]
    assert qwen["model.layers.0.self_attn.q_norm.weight"] == [128] and "lm_head.weight" in qwen
    nemo = {t.name: list(t.dims) for t in built["nemotron4-340b"].graph.initializer}
    assert nemo["model.layers.95.mlp.up_proj.weight"] == [73728, 18432]
    assert nemo["model.layers.0.self_attn.k_proj.weight"] == [1536, 18432]  # 8 KV heads of 192
    assert nemo["model.layers.0.input_layernorm.bias"] == [18432] and nemo["model.norm.bias"] == [18432]
    assert not any(".gate_proj." in n for n in nemo)  # non-gated MLP
    kimi = {t.name: list(t.dims) for t in built["kimi-k2"].graph.initializer}
    assert kimi["model.layers.0.mlp.gate_proj.weight"] == [18432, 7168]  # the one dense layer
    assert kimi["model.layers.1.mlp.experts.gate_up_proj"] == [384, 4096, 7168]
    assert kimi["model.layers.1.self_attn.q_b_proj.weight"] == [64 * 192, 1536]
    assert kimi["model.embed_tokens.weight"] == [163840, 7168]
    oss = {t.name: list(t.dims) for t in built["gpt-oss-120b"].graph.initializer}
    assert oss["model.layers.35.self_attn.sinks"] == [64] and oss["model.layers.0.self_attn.q_proj.bias"] == [4096]
    assert oss["model.layers.0.mlp.router.weight"] == [128, 2880] and oss["model.layers.0.mlp.router.bias"] == [128]
    assert oss["model.layers.0.mlp.experts.gate_up_proj"] == [128, 2880, 5760]
    assert oss["model.layers.0.mlp.experts.down_proj"] == [128, 2880, 2880]
    assert oss["model.layers.0.mlp.experts.down_proj_bias"] == [128, 2880]
    mav = {t.name: list(t.dims) for t in built["llama4-maverick"].graph.initializer}
    assert mav["model.layers.0.feed_forward.gate_proj.weight"] == [16384, 5120]  # dense layers between MoE ones
    assert mav["model.layers.1.feed_forward.experts.gate_up_proj"] == [128, 5120, 16384]
    assert mav["model.layers.47.feed_forward.experts.down_proj"] == [128, 8192, 5120]
    assert mav["model.layers.1.feed_forward.router.weight"] == [128, 5120]
    assert mav["model.layers.1.feed_forward.shared_expert.up_proj.weight"] == [8192, 5120]
    assert "model.layers.0.feed_forward.router.weight" not in mav
    scout = {t.name: list(t.dims) for t in built["llama4-scout"].graph.initializer}
    assert scout["model.layers.0.feed_forward.experts.gate_up_proj"] == [16, 5120, 16384]
    rows = {p.name: p for p in PRESETS}
    assert rows["kimi-k2"].active_params < 0.035 * rows["kimi-k2"].params
    assert rows["qwen3-8b"].active_params == rows["qwen3-8b"].params


def test_switches_at_their_defaults_stay_out_of_the_config_json():
    """A later switch (mlp, norm, rotary_fraction) is written only when set: older presets keep their bytes."""
    def config_of(name: str) -> dict:
        return json.loads({p.key: p.value for p in models_zoo.build(name, layers=3).metadata_props}["hyperplan.config"])

    assert not {"mlp", "norm", "rotary_fraction"} & set(config_of("llama3-8b"))
    assert not {"mlp", "norm", "rotary_fraction"} & set(config_of("omni-moe-30b-a3b")["text"])
    nemo = config_of("nemotron4-15b")
    assert (nemo["mlp"], nemo["norm"], nemo["rotary_fraction"]) == ("relu2", "layernorm1p", 0.5)


def test_gpt_oss_alternates_banded_and_full_attention():
    """Even layers get the 128-token banded mask, odd layers the causal one; both call one layer function."""
    model = models_zoo.build("gpt-oss-20b", layers=4, seq_len=512)
    calls = [n for n in model.graph.node if n.op_type == "GptOssDecoderLayer"]
    masks = [n.input[3] for n in calls]
    assert len(calls) == 4 and masks[0] == masks[2] != masks[1] == masks[3]
    producer = {o: n for n in model.graph.node for o in n.output}
    assert producer[masks[0]].op_type == "Add" and producer[masks[1]].op_type == "Trilu"
    short = models_zoo.build("gpt-oss-20b", layers=2, seq_len=128)  # no key is 128 back: one causal mask
    assert len({n.input[3] for n in short.graph.node if n.op_type == "GptOssDecoderLayer"}) == 1


def test_llama4_chunks_its_rope_layers_and_leaves_every_fourth_without_rope():
    """Past the 8,192-token chunk, RoPE layers get the banded mask and NoPE layers (every 4th) the causal one;
    NoPE layers read no rotary tables. Below the chunk every layer is plainly causal."""
    model = models_zoo.build("llama4-scout", layers=8, seq_len=16384)
    calls = [n for n in model.graph.node if n.domain == FUNCTION_DOMAIN]
    kinds = (["Llama4TextDecoderLayer"] * 3 + ["Llama4TextDecoderLayerNoRope"]) * 2
    assert [n.op_type for n in calls] == kinds
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    assert [producer[m] for m in _masks(model)] == (["Add"] * 3 + ["Trilu"]) * 2
    assert len(set(_masks(models_zoo.build("llama4-scout", layers=4, seq_len=4096)))) == 1


def _masks(model: onnx.ModelProto) -> list[str]:
    """The attention mask each layer call reads: after the activations, and the rotary tables of a RoPE layer."""
    return [n.input[1 if n.op_type.endswith("NoRope") else 3] for n in model.graph.node if n.domain == FUNCTION_DOMAIN]


def test_moe_expert_matmuls_cost_active_flops():
    """Expert MatMuls see ceil(T*k/E) tokens per expert, not T: the graph's FLOPs are the active ones."""
    model = models_zoo.build("mixtral-8x7b", layers=1, seq_len=1000, flat=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    expert_mm = [n for n in model.graph.node if n.op_type == "MatMul" and "/experts/" in n.name]
    assert len(expert_mm) == 2
    assert shapes[expert_mm[0].input[0]] == [8, 250, 4096]  # 1000 tokens * top-2 / 8 experts
    assert shapes[expert_mm[0].output[0]] == [8, 250, 2 * 14336]


def test_overrides_change_the_graph_and_counts_agree():
    total, active = models_zoo.param_counts("deepseek-v3", layers=5, experts=16, top_k=4)
    model = models_zoo.build("deepseek-v3", layers=5, experts=16, top_k=4, seq_len=64, batch=2)
    assert graph_params(model) == total and active < total
    cfg = json.loads({p.key: p.value for p in model.metadata_props}["hyperplan.config"])
    assert (cfg["layers"], cfg["experts"], cfg["top_k"], cfg["seq_len"], cfg["batch"]) == (5, 16, 4, 64, 2)
    ids = model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in ids] == [2, 64]
    mm = json.loads({p.key: p.value for p in models_zoo.build("llava-style-7b", seq_len=1024, batch=3,
                                                              vision_layers=2).metadata_props}["hyperplan.config"])
    assert (mm["batch"], mm["seq_len"], mm["vision"]["layers"], mm["vision"]["batch"]) == (3, 1024, 2, 3)


@pytest.mark.parametrize("flat", [False, True])
def test_build_is_deterministic(flat):
    a = models_zoo.build("omni-moe-30b-a3b", layers=3, vision_layers=25, flat=flat).SerializeToString()
    b = models_zoo.build("omni-moe-30b-a3b", layers=3, vision_layers=25, flat=flat).SerializeToString()
    assert a == b


@pytest.mark.parametrize(
    ("name", "overrides", "words"),
    [
        ("llama3-8b", {"experts_count": 8}, "no setting 'experts_count'"),
        ("llama3-8b", {"heads": 7}, "hidden=4096 is not a multiple of heads=7"),
        ("llama3-8b", {"layers": 0}, "layers must be a positive integer"),
        ("mixtral-8x7b", {"top_k": 9}, "top_k=9"),
        ("vit-l-16", {"seq_len": 128}, "no setting 'seq_len'"),
        ("llava-style-7b", {"seq_len": 500}, "leaves no text after 576 media tokens"),
        ("llava-style-7b", {"audio_layers": 2}, "has no audio tower"),
        ("llama3-8b", {"qk_norm": "yes"}, "qk_norm must be true or false, got 'yes'"),
        ("deepseek-v3", {"kv_lora_rank": 1.5}, "kv_lora_rank must be an integer, got 1.5"),
        ("llava-style-7b", {"deepstack": 3}, "deepstack must be a list, got 3"),
        ("no-such-model", {}, "unknown zoo model 'no-such-model'"),
    ],
)
def test_bad_names_and_overrides_raise_one_sentence(name, overrides, words):
    with pytest.raises(ValueError) as err:
        models_zoo.build(name, **overrides)
    message = str(err.value)
    assert words in message and "\n" not in message


def test_listing_api():
    assert models_zoo.is_zoo_name("deepseek-v3") and not models_zoo.is_zoo_name("deepseek")
    assert models_zoo.names() == NAMES
    families = {p.family for p in PRESETS}
    assert families == {"gpt", "llama", "mixtral", "deepseek", "gpt-oss", "vit", "multimodal"}
