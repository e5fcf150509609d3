"""Small configs of every zoo family run in onnxruntime on random weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import models_zoo
from models_zoo.graph_builder import materialize

ort = pytest.importorskip("onnxruntime")

_LLM = dict(layers=2, hidden=32, heads=4, vocab=96, seq_len=12, batch=2, dtype="float32")
_TOWER = dict(vision_layers=2, vision_hidden=16, vision_heads=2, vision_ffn=32, vision_image_size=32,
              vision_patch_size=8)
TINY = {
    "gpt3-13b": dict(_LLM, head_dim=8, ffn=64),
    "llama3-8b": dict(_LLM, kv_heads=2, ffn=64),
    "mixtral-8x7b": dict(_LLM, kv_heads=2, ffn=24, experts=4, top_k=2),
    "deepseek-v3": dict(_LLM, dense_layers=1, q_lora_rank=16, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4,
                        v_head_dim=8, ffn=64, expert_ffn=16, experts=8, top_k=3),
    "qwen3-8b": dict(_LLM, kv_heads=2, head_dim=8, ffn=64),
    "nemotron4-15b": dict(_LLM, kv_heads=2, ffn=64),
    "kimi-k2": dict(_LLM, dense_layers=1, q_lora_rank=16, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4,
                    v_head_dim=8, ffn=64, expert_ffn=16, experts=8, top_k=3),
    "gpt-oss-120b": dict(_LLM, kv_heads=2, head_dim=8, ffn=16, experts=4, top_k=2, sliding_window=4),
    "vit-h-14": dict(layers=2, hidden=32, heads=4, ffn=64, image_size=28, patch_size=7, num_labels=10, batch=2,
                     dtype="float32"),
    "llava-style-7b": dict(_LLM, seq_len=40, kv_heads=4, ffn=64, **_TOWER),
    "internvl2-76b": dict(_LLM, seq_len=40, kv_heads=2, ffn=64, **_TOWER),
    "omni-moe-30b-a3b": dict(_LLM, seq_len=40, layers=3, kv_heads=2, head_dim=8, ffn=16, experts=4, top_k=2,
                             projector_hidden=48, deepstack=(0,), **_TOWER, audio_layers=1, audio_hidden=16,
                             audio_heads=2, audio_ffn=32, audio_mel_bins=8, audio_frames=40, audio_out_dim=32),
}


def _feeds(model: onnx.ModelProto, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[value.name] = rng.integers(0, vocab, shape, dtype=np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run(model: onnx.ModelProto, vocab: int = 96, seed: int = 0) -> np.ndarray:
    data = materialize(model, seed=seed).SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, _feeds(model, vocab))[0]


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_family_member_runs_with_finite_output(name):
    model = models_zoo.build(name, **TINY[name])
    onnx.checker.check_model(model, full_check=True)
    out = run(model)
    expected = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert list(out.shape) == expected
    assert np.isfinite(out).all() and float(np.abs(out).max()) > 0
    if "seq_len" in TINY[name]:
        assert out.shape == (2, TINY[name]["seq_len"], 96)


@pytest.mark.parametrize("name", sorted(TINY))
def test_flat_and_function_forms_compute_the_same_logits(name):
    """Same parameter names and order, so the same random weights: the two forms must agree."""
    compact = models_zoo.build(name, **TINY[name])
    flat = models_zoo.build(name, flat=True, **TINY[name])
    assert compact.functions and not flat.functions
    np.testing.assert_allclose(run(compact, seed=5), run(flat, seed=5), rtol=1e-6, atol=1e-6)


def test_uneven_routing_pads_to_capacity():
    """T*k not a multiple of E: the dispatch pads to E*ceil(T*k/E) rows and still runs."""
    model = models_zoo.build("mixtral-8x7b", **dict(TINY["mixtral-8x7b"], experts=5, top_k=2, seq_len=7))
    assert run(model).shape == (2, 7, 96)


def test_fused_and_per_expert_layouts_compute_the_same():
    """The same weights stored stacked (transformers 5) or per expert (checkpoints) give the same logits."""
    cfg = dict(TINY["mixtral-8x7b"], experts=3, top_k=2)
    fused = materialize(models_zoo.build("mixtral-8x7b", **cfg), seed=3)
    split = models_zoo.build("mixtral-8x7b", expert_layout="per_expert", **cfg)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in fused.graph.initializer}
    ffn = cfg["ffn"]
    for t in split.graph.initializer:
        if ".experts." in t.name:
            layer, rest = t.name.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            stack = f"{layer}.mlp.experts."
            if proj == "down_proj":
                value = weights[stack + "down_proj"][int(e)]
            else:
                half = slice(0, ffn) if proj == "gate_proj" else slice(ffn, 2 * ffn)
                value = weights[stack + "gate_up_proj"][int(e), half, :]
        else:
            value = weights[t.name]
        t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(value), t.name))
    feeds = _feeds(fused, 96)
    a = ort.InferenceSession(fused.SerializeToString()).run(None, feeds)[0]
    b = ort.InferenceSession(split.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bfloat16_graph_passes_strict_inference_at_tiny_size():
    model = models_zoo.build("omni-moe-30b-a3b", **dict(TINY["omni-moe-30b-a3b"], dtype="bfloat16"))
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
