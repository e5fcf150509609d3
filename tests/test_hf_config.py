"""Hugging Face config.json files as zoo models: the same graph as the preset of that model, clear errors.

The parameter counts against transformers' own models are `test_hf_config_transformers` (torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import models_zoo

CONFIGS = Path(__file__).parent / "data" / "hf_configs"

#: config folder -> the zoo preset of the same model.
SAME_AS_PRESET = {
    "Meta-Llama-3-8B": "llama3-8b", "Qwen3-8B": "qwen3-8b", "Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Mixtral-8x7B-v0.1": "mixtral-8x7b", "DeepSeek-V3": "deepseek-v3", "Kimi-K2-Instruct": "kimi-k2",
    "gpt-oss-20b": "gpt-oss-20b", "Llama-4-Scout-17B-16E": "llama4-scout",
    "Llama-4-Maverick-17B-128E": "llama4-maverick", "llava-1.5-7b-hf": "llava-style-7b",
}


def write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("folder", sorted(SAME_AS_PRESET))
def test_config_route_gives_the_presets_config(folder):
    _, cfg = models_zoo.hf_model_config(CONFIGS / folder, seq_len=4096)
    assert cfg == models_zoo.config(SAME_AS_PRESET[folder], seq_len=4096)


@pytest.mark.parametrize("folder", ["Meta-Llama-3-8B", "Llama-4-Maverick-17B-128E"])
def test_config_route_gives_the_presets_graph(folder):
    """Same nodes, initializers and layer functions; only the graph's name and preset label differ."""
    ours = models_zoo.build_hf(CONFIGS / folder, layers=4, seq_len=512)
    zoo = models_zoo.build(SAME_AS_PRESET[folder], layers=4, seq_len=512)
    assert list(ours.graph.node) == list(zoo.graph.node)
    assert list(ours.graph.initializer) == list(zoo.graph.initializer)
    assert list(ours.functions) == list(zoo.functions)
    meta = {p.key: p.value for p in ours.metadata_props}
    assert meta["hyperplan.params"] == {p.key: p.value for p in zoo.metadata_props}["hyperplan.params"]


def test_a_folder_and_its_config_json_are_the_same_model():
    folder = CONFIGS / "Qwen3-8B"
    assert models_zoo.hf_config_file(folder) == str(folder / "config.json")
    assert models_zoo.hf_param_counts(folder) == models_zoo.hf_param_counts(folder / "config.json")
    assert models_zoo.hf_config_file(CONFIGS) is None  # a folder without a config.json


def test_sequence_length_defaults_to_4096_within_the_context_limit(tmp_path):
    _, cfg = models_zoo.hf_model_config(CONFIGS / "Meta-Llama-3-8B")
    assert cfg.seq_len == 4096
    short = json.loads((CONFIGS / "Meta-Llama-3-8B" / "config.json").read_text()) | {"max_position_embeddings": 2048}
    assert models_zoo.hf_model_config(write(tmp_path, short))[1].seq_len == 2048


def test_overrides_apply_to_a_config_as_to_a_preset():
    _, cfg = models_zoo.hf_model_config(CONFIGS / "DeepSeek-V3", layers=5, experts=16, top_k=4)
    assert (cfg.layers, cfg.experts, cfg.top_k, cfg.dense_layers) == (5, 16, 4, 3)
    with pytest.raises(ValueError, match="has no setting 'expert_count'; valid settings: .*kv_lora_rank"):
        models_zoo.build_hf(CONFIGS / "DeepSeek-V3", expert_count=3)


def test_families_read_their_switches():
    def cfg(folder: str):
        return models_zoo.hf_model_config(CONFIGS / folder)[1]

    gemma = cfg("gemma-3-27b-it")  # text_config of a multimodal file; vocab from Gemma3TextConfig's default
    assert (gemma.vocab, gemma.sliding_window, gemma.full_every, gemma.norm_place) == (262208, 1024, 6, "sandwich")
    assert gemma.attn_scale == pytest.approx(168 ** -0.5) and gemma.local_rope_theta == 10000.0
    assert cfg("gemma-2-9b").full_every == 2 and cfg("gemma-2-9b").final_softcap == 30.0
    assert cfg("Mistral-7B-v0.1").sliding_window == 4096 and cfg("Mistral-7B-v0.1").full_every == 0
    assert cfg("Mixtral-8x7B-v0.1").sliding_window == 0  # null in the file
    assert cfg("Qwen2.5-7B").sliding_window == 0  # use_sliding_window false
    assert (cfg("Phi-3-mini-4k-instruct").fused_proj, cfg("Phi-3-mini-4k-instruct").sliding_window) == (True, 2047)
    qmoe = cfg("Qwen1.5-MoE-A2.7B")
    assert (qmoe.experts, qmoe.top_k, qmoe.ffn, qmoe.shared_experts, qmoe.shared_gate, qmoe.norm_topk) == \
        (60, 4, 1408, 4, True, False)
    granite = cfg("granite-3.1-8b-instruct")
    assert (granite.embed_scale, granite.residual_scale, granite.logits_divisor, granite.tie_embeddings) == \
        (12.0, 0.22, 16.0, True)
    olmo = cfg("OLMo-2-1124-7B")
    assert (olmo.norm_place, olmo.qk_norm, olmo.qk_norm_per_head) == ("post", True, False)
    vl = cfg("Qwen2-VL-7B-Instruct")  # text fields at the top level, as published
    assert (vl.text.hidden, vl.text.qkv_bias, vl.vision.style, vl.vision.temporal_patch, vl.merge) == \
        (3584, True, "qwen2vl", 2, 2)
    assert (vl.image_tokens, vl.projector_hidden) == (256, 5120)  # one 448 px image: 32 x 32 patches, 2 x 2 merged


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"model_type": "bert"}, "has model_type 'bert'; the zoo builds deepseek_v3, gemma2,"),
        ({"hidden_size": 64}, "has no model_type; the zoo builds"),
        ({"model_type": "llama", "hidden_size": "4096"}, "hidden_size must be an integer, got '4096'"),
        ({"model_type": "llama", "hidden_act": "relu"}, "hidden activation 'relu' is not one the zoo builds"),
        ({"model_type": "gemma2", "num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention",
                                                                          "sliding_attention"]},
         "attention pattern fbb (b: banded, f: full) is not every n-th layer full"),
        ({"model_type": "qwen2_moe", "mlp_only_layers": [0, 3]}, "mlp_only_layers [0, 3] makes layers dense"),
        ({"model_type": "llama", "num_attention_heads": 7}, "hidden=4096 is not a multiple of heads=7"),
        # QA of 2026-12-07: Python's own words had come through ("could not convert string to float: 'x'",
        # "range() arg 3 must not be zero")
        ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": "x"}},
         "rope scaling's factor must be a positive number, got 'x'"),
        ({"model_type": "llama4", "text_config": {"interleave_moe_layer_step": 0}},
         "interleave_moe_layer_step must be at least 1 (every step-th layer is MoE), got 0"),
        # transformers takes a 0 as given where null means "derive it": a 0 had been read as null
        ({"model_type": "llama", "head_dim": 0}, "head_dim must be at least 1 (or null for the class's default)"),
        ({"model_type": "qwen3", "num_key_value_heads": 0}, "num_key_value_heads must be at least 1"),
    ],
)
def test_bad_configs_raise_one_sentence(tmp_path, data, words):
    with pytest.raises(ValueError) as err:
        models_zoo.build_hf(write(tmp_path, data))
    message = str(err.value)
    assert words in message and "\n" not in message
    if "model_type" in words:
        assert "export any other model to ONNX" in message and "qwen3_moe" in message


def test_unreadable_files_raise_one_sentence(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    for path, words in ((bad, "is not valid JSON"), (tmp_path / "nothing.json", "is neither a .json file"),
                        (write(tmp_path, [1, 2], "list.json"), "holds a JSON list, not a config object")):
        with pytest.raises(ValueError, match=words):
            models_zoo.build_hf(path)


def test_supported_model_types_are_listed():
    assert {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2",
            "gpt_oss", "gemma2", "gemma3", "phi3", "olmo2", "granite", "llama4", "llava", "qwen2_vl"} <= set(
        models_zoo.hf_model_types())
