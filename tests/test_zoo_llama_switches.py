"""The Llama family's switches against the transformers class each one stands for: names, shapes, counts, logits.

Each case builds a tiny model both ways, loads transformers' random weights
(norms and biases moved off their constants) into our graph and compares the
logits; MoE cases route every token to every expert (experts = top_k), the
one routing our balanced dispatch computes exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import models_zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from tests.hf_models import (  # noqa: E402
    hf_count, hf_params, instantiate, logits, perturb_norms_and_biases, zoo_params,
)

pytestmark = pytest.mark.torch

_HF = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
           attn_implementation="eager")
_ZOO = dict(layers=4, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=128, seq_len=10, batch=2, dtype="float32",
            rope_theta=10000.0)
_GEMMA = dict(norm="rms1p", norm_place="sandwich", mlp="geglu", embed_scale=8.0, tie_embeddings=True, head_dim=16,
              norm_eps=1e-6, sliding_window=4, full_every=2)

CASES = {
    "mistral (every layer banded)": ("MistralConfig", dict(sliding_window=4), dict(sliding_window=4, norm_eps=1e-6)),
    "qwen2 (q/k/v biases)": ("Qwen2Config", {}, dict(qkv_bias=True, norm_eps=1e-6)),
    "phi3 (fused projections, half RoPE, banded)": (
        "Phi3Config", dict(sliding_window=4, partial_rotary_factor=0.5),
        dict(fused_proj=True, sliding_window=4, rotary_fraction=0.5)),
    "olmo2 (post-norms, QK-norm over the projection)": (
        "Olmo2Config", {}, dict(norm_place="post", qk_norm=True, qk_norm_per_head=False)),
    "granite (multipliers, biases, tied)": (
        "GraniteConfig", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                              logits_scaling=16.0, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
        dict(embed_scale=12.0, residual_scale=0.22, attn_scale=0.0078125, logits_divisor=16.0, qkv_bias=True,
             o_bias=True, mlp_bias=True, tie_embeddings=True, norm_eps=1e-6)),
    "gemma2 (sandwich norms, GeGLU, soft-capped logits)": (
        "Gemma2Config", dict(head_dim=16, sliding_window=4, attn_logit_softcapping=None, query_pre_attn_scalar=24),
        dict(_GEMMA, attn_scale=24 ** -0.5, final_softcap=30.0)),
    "gemma3 (plus QK-norm, local RoPE base, 1 full in 2)": (
        "Gemma3TextConfig", dict(head_dim=16, sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=16,
                                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                                  "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
        dict(_GEMMA, qk_norm=True, attn_scale=0.25, rope_theta=1e6, local_rope_theta=1000.0)),
    "qwen2_moe (gated shared expert, MoE every 2nd layer)": (
        "Qwen2MoeConfig", dict(num_experts=2, num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=32, decoder_sparse_step=2),
        dict(experts=2, top_k=2, ffn=16, shared_experts=2, shared_gate=True, moe_every=2, dense_ffn=96,
             qkv_bias=True, norm_topk=False, norm_eps=1e-6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_switches_match_transformers(case):
    config_class, hf_extra, zoo_extra = CASES[case]
    cfg = getattr(transformers, config_class)(**(_HF | hf_extra))
    model_class = config_class.replace("TextConfig", "ForCausalLM").replace("Config", "ForCausalLM")
    hf = instantiate(getattr(transformers, model_class), cfg)
    perturb_norms_and_biases(hf)
    zoo = models_zoo.build("llama3-8b", **(_ZOO | zoo_extra))
    assert zoo_params(zoo) == hf_params(hf)
    assert models_zoo.param_counts("llama3-8b", **(_ZOO | zoo_extra))[0] == hf_count(hf)
    np.testing.assert_allclose(*logits(zoo, hf), rtol=1e-4, atol=1e-4)


def test_llama4_names_shapes_and_counts_match_transformers():
    """Interleaved MoE (shared expert, [E, H, 2I] experts, router), NoPE layers: Llama4ForCausalLM's layout.
    Logits are not compared: Llama 4 rotates interleaved channel pairs, the graph rotates halves (same work)."""
    cfg = transformers.Llama4TextConfig(**(_HF | dict(num_local_experts=4, num_experts_per_tok=1, head_dim=16,
                                                      intermediate_size_mlp=128, interleave_moe_layer_step=2)))
    hf = instantiate(transformers.Llama4ForCausalLM, cfg, meta=True)
    settings = _ZOO | dict(experts=4, top_k=1, head_dim=16, dense_ffn=128, moe_every=2, shared_experts=1,
                           variant="llama4", expert_layout="fused_io", nope_every=4, qk_l2norm=True, norm_eps=1e-6)
    zoo = models_zoo.build("llama3-8b", **settings)
    assert zoo_params(zoo) == hf_params(hf)
    total, active = models_zoo.param_counts("llama3-8b", **settings)
    assert total == hf_count(hf)
    assert total - active == 2 * (4 - 1) * 3 * 64 * 96  # two MoE layers, three idle experts each
    assert [f.name for f in zoo.functions] == ["Llama4TextDecoderLayerDense", "Llama4TextDecoderLayerMoe",
                                               "Llama4TextDecoderLayerMoeNoRope"]
