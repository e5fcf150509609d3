"""Zoo graphs against transformers' own classes: same parameter names, shapes, counts and (dense) logits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import models_zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from tests.hf_models import hf_params, instantiate, logits, run, with_hf_weights, zoo_params  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

_RUN = dict(seq_len=10, batch=2, dtype="float32")


LLAMA = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=128, rope_theta=10000.0, norm_eps=1e-5)


def _llama_hf(cls, **extra):
    settings = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    cfg = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**(settings | extra))
    return instantiate(getattr(transformers, cls), cfg)


def test_llama_names_shapes_and_logits_match_transformers():
    hf = _llama_hf("LlamaForCausalLM")
    zoo = models_zoo.build("llama3-8b", **LLAMA, **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    ids = np.random.default_rng(0).integers(0, 128, (2, 10), dtype=np.int64)
    with torch.no_grad():
        expected = hf(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
    got = run(with_hf_weights(zoo, hf), {"input_ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_mixtral_names_shapes_and_counts_match_transformers():
    hf = _llama_hf("MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)
    hf_total = sum(p.numel() for p in hf.parameters())
    zoo = models_zoo.build("mixtral-8x7b", **dict(LLAMA, experts=4, top_k=2), **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    assert models_zoo.param_counts("mixtral-8x7b", **dict(LLAMA, experts=4, top_k=2))[0] == hf_total


def test_qwen3_moe_backbone_matches_transformers():
    """The omni model's LLM is transformers' Qwen3MoeForCausalLM under ``model.language_model``."""
    hf = _llama_hf("Qwen3MoeForCausalLM", moe_intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                   head_dim=16, num_hidden_layers=3)
    zoo = models_zoo.build("omni-moe-30b-a3b", **dict(LLAMA, experts=4, top_k=2, head_dim=16, layers=3),
                           **dict(_RUN, seq_len=1200))
    ours = {k.replace("model.language_model.", "model."): v for k, v in zoo_params(zoo).items()
            if k.startswith(("model.language_model.", "lm_head."))}
    assert ours == hf_params(hf)


def test_deepseek_v3_names_and_shapes_match_transformers():
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_group=2, topk_group=1, tie_word_embeddings=False,
    )
    hf = instantiate(transformers.DeepseekV3ForCausalLM, cfg)
    zoo = models_zoo.build(
        "deepseek-v3", layers=3, dense_layers=1, hidden=64, heads=4, q_lora_rank=24, kv_lora_rank=16,
        qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16, ffn=96, expert_ffn=16, experts=8, top_k=2, vocab=128, **_RUN,
    )
    assert zoo_params(zoo) == hf_params(hf)


def test_gpt2_names_shapes_and_logits_match_transformers():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=10,
                                  attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    hf = instantiate(transformers.GPT2LMHeadModel, cfg)
    zoo = models_zoo.build("gpt", hidden=64, layers=2, heads=4, vocab=128, **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    ids = np.random.default_rng(1).integers(0, 128, (2, 10), dtype=np.int64)
    with torch.no_grad():
        expected = hf(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(run(with_hf_weights(zoo, hf), {"input_ids": ids}), expected, rtol=1e-4, atol=1e-4)


def test_vit_names_and_shapes_match_transformers():
    cfg = transformers.ViTConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=32, patch_size=8, num_labels=10)
    hf = instantiate(transformers.ViTForImageClassification, cfg)
    zoo = models_zoo.build("vit-l-16", hidden=64, ffn=96, layers=2, heads=4, image_size=32, patch_size=8,
                           num_labels=10, batch=2, dtype="float32")
    assert zoo_params(zoo) == hf_params(hf)


def test_llava_tower_projector_and_backbone_match_transformers():
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                           num_attention_heads=4, image_size=28, patch_size=7)
    text = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    hf = instantiate(transformers.LlavaForConditionalGeneration,
             transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=5))
    zoo = models_zoo.build("llava-style-7b", layers=2, hidden=64, heads=4, kv_heads=4, ffn=96, vocab=128,
                           vision_layers=2, vision_hidden=32, vision_heads=4, vision_ffn=64, vision_image_size=28,
                           vision_patch_size=7, seq_len=40, batch=2, dtype="float32")
    ours, theirs = zoo_params(zoo), hf_params(hf)
    assert all(theirs[k] == v for k, v in ours.items())
    unused = {k for k in theirs if ".encoder.layers.2." in k or "post_layernorm" in k}  # penultimate-layer features
    assert set(theirs) - set(ours) == unused


def test_qwen3_dense_names_shapes_and_logits_match_transformers():
    hf = _llama_hf("Qwen3ForCausalLM", head_dim=16)
    zoo = models_zoo.build("qwen3-8b", **dict(LLAMA, head_dim=16), **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    assert [f.name for f in zoo.functions] == ["Qwen3DecoderLayer"]
    np.testing.assert_allclose(*logits(zoo, hf), rtol=1e-4, atol=1e-4)


def test_nemotron_names_shapes_and_logits_match_transformers():
    """Squared-ReLU MLP, LayerNorm1P (weight + 1, with bias) and RoPE on half of each head, as NemotronForCausalLM."""
    cfg = transformers.NemotronConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, norm_eps=1e-5, partial_rotary_factor=0.5,
        tie_word_embeddings=False, attn_implementation="eager",
    )
    hf = instantiate(transformers.NemotronForCausalLM, cfg)
    with torch.no_grad():  # norms start at weight 0 (= gain 1), bias 0: perturb them so both are exercised
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    zoo = models_zoo.build("nemotron4-15b", **LLAMA, **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    assert "model.layers.1.input_layernorm.bias" in zoo_params(zoo) and "model.norm.bias" in zoo_params(zoo)
    np.testing.assert_allclose(*logits(zoo, hf), rtol=1e-4, atol=1e-4)


_SMALL_MOE = dict(moe_intermediate_size=96, num_experts=8, num_experts_per_tok=2, head_dim=16)
_SMALL_MLA = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
    first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
    num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1, tie_word_embeddings=False,
)
_ZOO_MLA = dict(layers=3, dense_layers=1, hidden=64, heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_dim=16,
                qk_rope_dim=8, v_head_dim=16, ffn=96, expert_ffn=16, experts=8, top_k=2, vocab=128)


@pytest.mark.parametrize(
    ("name", "hf_class", "hf_settings", "zoo_settings"),
    [
        ("qwen3-32b", "Qwen3ForCausalLM", dict(head_dim=16), dict(LLAMA, head_dim=16)),
        ("qwen3-30b-a3b", "Qwen3MoeForCausalLM", _SMALL_MOE, dict(LLAMA, ffn=96, experts=8, top_k=2, head_dim=16)),
        ("qwen3-235b-a22b", "Qwen3MoeForCausalLM", _SMALL_MOE, dict(LLAMA, ffn=96, experts=8, top_k=2, head_dim=16)),
        ("nemotron4-340b", "NemotronForCausalLM", dict(partial_rotary_factor=0.5), LLAMA),
        ("kimi-k2", "DeepseekV3ForCausalLM", _SMALL_MLA, _ZOO_MLA),
    ],
)
def test_counts_names_and_shapes_match_transformers_on_meta(name, hf_class, hf_settings, zoo_settings):
    """Our formula's count is sum(p.numel()) of transformers' model of the same (small) config, built on meta."""
    cls = getattr(transformers, hf_class)
    if hf_class == "DeepseekV3ForCausalLM":
        cfg = transformers.DeepseekV3Config(**hf_settings)
    else:
        base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=False)
        cfg = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))(**(base | hf_settings))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = cls(cfg)
    total, active = models_zoo.param_counts(name, **zoo_settings)
    assert total == sum(p.numel() for p in hf.parameters())
    assert zoo_params(models_zoo.build(name, **zoo_settings, **_RUN)) == hf_params(hf)
    assert active <= total


_OSS_HF = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, sliding_window=4, max_position_embeddings=64,
               tie_word_embeddings=False, attn_implementation="eager")
_OSS_ZOO = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=32, vocab=128, sliding_window=4)


def test_gpt_oss_logits_match_transformers_when_routing_is_balanced():
    """Sinks, biases, banded (window 4 < 10 tokens) and full layers, clamped SwiGLU: the same logits as
    GptOssForCausalLM. Every expert runs every token (experts = top_k), the one routing our balanced
    dispatch computes exactly; RoPE without YaRN on both sides (YaRN changes only the tables' values: the zoo keeps
    its attention factor, here 1, and leaves out its frequency interpolation)."""
    cfg = transformers.GptOssConfig(**_OSS_HF, num_local_experts=2, num_experts_per_tok=2,
                                    rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
    hf = instantiate(transformers.GptOssForCausalLM, cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("bias", "sinks")):  # zero at init: make them matter
                p.normal_(0.0, 0.5)
            elif ".experts." in name:
                p.mul_(20.0)  # pre-activations past the +-7 clamp
    zoo = models_zoo.build("gpt-oss-20b", **_OSS_ZOO, experts=2, top_k=2, rope_attention_factor=1.0, **_RUN)
    assert zoo_params(zoo) == hf_params(hf)
    np.testing.assert_allclose(*logits(zoo, hf), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_counts_names_and_shapes_match_transformers_on_meta(name):
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**_OSS_HF, num_local_experts=8,
                                                                      num_experts_per_tok=2))
    total, active = models_zoo.param_counts(name, **_OSS_ZOO, experts=8, top_k=2)
    assert total == sum(p.numel() for p in hf.parameters())
    assert zoo_params(models_zoo.build(name, **_OSS_ZOO, experts=8, top_k=2, **_RUN)) == hf_params(hf)
    per_expert = 64 * 2 * 32 + 2 * 32 + 32 * 64 + 64
    assert total - active == 2 * (8 - 2) * per_expert
