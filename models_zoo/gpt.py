"""GPT-3-style decoders (Brown et al. 2020): learned positions, pre-LayerNorm, GeLU MLP.

The graph is the training graph Megatron-LM runs: dropout (p = 0.1 by
default) after the embeddings, on the attention probabilities and after
each residual branch, whose masks are part of what a layer keeps for
backward (Korthikanti et al. 2022, section 4.1).

Names and shapes are HF ``GPT2LMHeadModel``'s (``transformer.h.N.attn.c_attn``...),
the one HF class with GPT-3's layout. GPT-2's ``Conv1D`` stores weights
[in, out] and computes x @ W + b, so the graph has no Transpose there.
GPT-3's alternating locally-banded sparse attention is not modelled: every
layer is dense causal attention (the same FLOPs as Megatron's GPT runs,
which the calibration rows use). ``head_dim`` lets heads * head_dim differ
from hidden (GPT-3 13B: d_model 5140, 40 heads of 128, Brown et al. Table 2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx import ModelProto, TensorProto

from models_zoo.common import check_divides, check_dtype, check_positive, finish, require
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import causal_mask, conv1d_linear, drop, gelu, layer_norm, linear, merge_heads, sdpa, split_heads


@dataclass(frozen=True, slots=True, kw_only=True)
class GptConfig:
    hidden: int
    layers: int
    heads: int
    vocab: int
    seq_len: int
    batch: int = 1
    ffn: int = 0  # 0: 4 * hidden
    head_dim: int = 0  # 0: hidden // heads
    max_positions: int = 0  # 0: seq_len (Narayanan et al. 2021 count s position rows)
    tie_embeddings: bool = True
    dropout: float = 0.1  # attention, hidden and embedding dropout, Megatron-LM's GPT default; 0 removes the nodes
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def positions(self) -> int:
        return self.max_positions or self.seq_len

    def validate(self) -> None:
        check_positive(self, "hidden", "layers", "heads", "vocab", "seq_len", "batch")
        check_dtype(self.dtype)
        if not self.head_dim:
            check_divides(self.heads, self.hidden, "heads", "hidden")
        require(self.ffn >= 0 and self.head_dim >= 0, "ffn and head_dim must be >= 0 (0 picks the default).")
        require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}.")
        require(
            self.positions >= self.seq_len,
            f"seq_len={self.seq_len} exceeds max_positions={self.positions}; raise max_positions.",
        )


def param_counts(cfg: GptConfig) -> tuple[int, int]:
    """12*L*h^2 + 13*L*h + (V + s)*h + 2h when heads*head_dim == h (Narayanan et al. 2021, section 5.1)."""
    h, a = cfg.hidden, cfg.heads * cfg.hd
    attn = h * 3 * a + 3 * a + a * h + h
    mlp = h * cfg.width + cfg.width + cfg.width * h + h
    layer = attn + mlp + 4 * h
    total = cfg.layers * layer + cfg.vocab * h + cfg.positions * h + 2 * h
    total += 0 if cfg.tie_embeddings else cfg.vocab * h
    return total, total


def block(b: GraphBuilder, cfg: GptConfig, h: str, mask: str) -> str:
    """One pre-LayerNorm block in the current ``h.N`` scope (HF ``GPT2Block``)."""
    B, S, H, a = cfg.batch, cfg.seq_len, cfg.hidden, cfg.heads * cfg.hd
    x = layer_norm(b, h, H, "ln_1", cfg.norm_eps)
    with b.scope("attn"):
        qkv = conv1d_linear(b, x, H, 3 * a, "c_attn")
        q, k, v = b.op("Split", [qkv, b.const([a, a, a])], n_out=3, axis=-1)
        q, k, v = (split_heads(b, t, B, S, cfg.heads, cfg.hd) for t in (q, k, v))
        o = merge_heads(b, sdpa(b, q, k, v, 1.0 / math.sqrt(cfg.hd), mask, cfg.dropout), B, S, a)
        h = b.op("Add", [h, drop(b, conv1d_linear(b, o, a, H, "c_proj"), cfg.dropout)])
    x = layer_norm(b, h, H, "ln_2", cfg.norm_eps)
    with b.scope("mlp"):
        y = gelu(b, conv1d_linear(b, x, H, cfg.width, "c_fc"), tanh=True)
        return b.op("Add", [h, drop(b, conv1d_linear(b, y, cfg.width, H, "c_proj"), cfg.dropout)])


def build(cfg: GptConfig, family: str = "gpt", preset: str = "", flat: bool = False) -> ModelProto:
    """``input_ids`` [B, S] int64 -> ``logits`` [B, S, V]; layers as functions unless `flat`."""
    cfg.validate()
    b = GraphBuilder(preset or family, cfg.dtype, flat=flat)
    B, S, H = cfg.batch, cfg.seq_len, cfg.hidden
    ids = b.input("input_ids", TensorProto.INT64, [B, S])
    with b.scope("transformer"):
        with b.scope("wte"):
            wte = b.param("weight", [cfg.vocab, H])
            h = b.op("Gather", [wte, ids], axis=0)
        with b.scope("wpe"):
            pos = b.param("weight", [cfg.positions, H])
            if cfg.positions > S:
                pos = b.op("Slice", [pos, b.const([0]), b.const([S]), b.const([0])])
            h = drop(b, b.op("Add", [h, pos]), cfg.dropout)
        mask = causal_mask(b, S)
        for i in range(cfg.layers):
            h = call_layer(b, "GPT2Block", f"h.{i}", lambda lb, x, m: block(lb, cfg, x, m),
                           {"hidden_states": h, "attention_mask": mask})
        h = layer_norm(b, h, H, "ln_f", cfg.norm_eps)
    if cfg.tie_embeddings:  # GPT-2 ties lm_head to wte: no parameter of its own
        with b.scope("lm_head"):
            logits = b.op("MatMul", [h, b.op("Transpose", [wte], perm=[1, 0])])
    else:
        logits = linear(b, h, H, cfg.vocab, "lm_head")
    b.output(logits, "logits", b.elem, [B, S, cfg.vocab])
    total, active = param_counts(cfg)
    return finish(b, family, preset, cfg, total, active)
