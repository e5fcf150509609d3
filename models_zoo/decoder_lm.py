"""The frame a decoder-only LM shares whatever its layers: ids -> embedding -> layers -> norm -> logits.

``model.embed_tokens`` (a Gather), ``model.rotary_emb`` tables and the causal
mask, the family's layers, ``model.norm`` (RMSNorm) and an untied
``lm_head``, in that order, as transformers' ``*ForCausalLM`` classes of
DeepSeek-V3 and gpt-oss lay them out. The family gives the rotary width and
a function that emits its layers; the frame seals the graph with the
family's parameter counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnx import ModelProto, TensorProto

from models_zoo.common import finish
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layers import causal_mask, linear, rms_norm, rope_tables

#: Emits the layers in the ``model`` scope: (builder, hidden [B, S, H], cos, sin, causal mask) -> hidden, or
#: (hidden, [(value, name)]): further [B, S, V] logits the graph outputs after ``logits`` (DeepSeek-V3's MTP heads).
Stack = Callable[[GraphBuilder, str, str, str, str], "str | tuple[str, list[tuple[str, str]]]"]
#: The graph input every layer may read: the token ids [B, S].
INPUT_IDS = "input_ids"
#: The output layer's weight [V, H], which a layer may share (DeepSeek-V3's MTP logits).
OUTPUT_WEIGHT = "lm_head.weight"


def build_decoder_lm(
    cfg: Any, family: str, preset: str, flat: bool, rope_dim: int, stack: Stack, counts: tuple[int, int],
    rope_scale: float = 1.0,
) -> ModelProto:
    """``input_ids`` [B, S] int64 -> ``logits`` [B, S, V] around `stack`; `counts` is the (total, active) formula;
    the rotary tables times `rope_scale` (YaRN's attention factor) when it is not 1."""
    b = GraphBuilder(preset or family, cfg.dtype, flat=flat)
    B, S, H = cfg.batch, cfg.seq_len, cfg.hidden
    ids = b.input(INPUT_IDS, TensorProto.INT64, [B, S])
    with b.scope("model"):
        with b.scope("embed_tokens"):
            h = b.op("Gather", [b.param("weight", [cfg.vocab, H]), ids], axis=0)
        with b.scope("rotary_emb"):
            cos, sin = rope_tables(b, S, rope_dim, cfg.rope_theta, rope_scale)
        out = stack(b, h, cos, sin, causal_mask(b, S))
        h, extra = (out, []) if isinstance(out, str) else out
        h = rms_norm(b, h, H, "norm", cfg.norm_eps)
    logits = linear(b, h, H, cfg.vocab, "lm_head")
    b.output(logits, "logits", b.elem, [B, S, cfg.vocab])
    for value, name in extra:
        b.output(value, name, b.elem, [B, S, cfg.vocab])
    return finish(b, family, preset, cfg, *counts)
