"""Whisper-style audio encoder (Radford et al. 2022): a Conv1d stem and a transformer.

Names are HF ``WhisperEncoder``'s (``conv1``, ``conv2``, ``embed_positions``,
``layers.N.self_attn.k_proj`` without bias, ``fc1``/``fc2``, ``layer_norm``).
Audio LLMs built on it (Qwen2-Audio, Qwen2.5-Omni) average-pool the
frames by 2 and project to the LLM width (``proj1`` -> GELU -> ``proj2``, as
Qwen3-Omni's audio tower names them), which ``pool`` and ``out_dim`` add.
30 s of 16 kHz audio is 3000 mel frames -> 1500 positions -> 750 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models_zoo.common import check_divides, check_dtype, check_positive, require
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import gelu, layer_norm, linear, merge_heads, sdpa, split_heads


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioConfig:
    hidden: int
    layers: int
    heads: int
    ffn: int
    mel_bins: int = 128
    frames: int = 3000
    max_positions: int = 1500
    pool: int = 2  # average-pool stride after the encoder (1: none)
    out_dim: int = 0  # width of proj1 -> proj2 output (0: no projection)
    batch: int = 1
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"

    @property
    def positions(self) -> int:
        return self.frames // 2

    @property
    def tokens(self) -> int:
        return self.positions // self.pool

    def validate(self) -> None:
        check_positive(self, "hidden", "layers", "heads", "ffn", "mel_bins", "frames", "max_positions", "pool", "batch")
        check_dtype(self.dtype)
        check_divides(self.heads, self.hidden, "audio heads", "audio hidden")
        require(self.frames % 2 == 0, f"audio frames={self.frames} must be even (conv2 has stride 2).")
        require(
            self.positions <= self.max_positions,
            f"audio frames={self.frames} give {self.positions} positions, "
            f"more than max_positions={self.max_positions}.",
        )
        check_divides(self.pool, self.positions, "audio pool", "audio positions (frames / 2)")
        require(self.out_dim >= 0, f"audio out_dim must be >= 0, got {self.out_dim}.")


def param_counts(cfg: AudioConfig) -> int:
    d, f = cfg.hidden, cfg.ffn
    stem = cfg.mel_bins * d * 3 + d + d * d * 3 + d + cfg.max_positions * d
    layer = 4 * d * d + 3 * d + 4 * d + 2 * d * f + f + d  # k_proj has no bias
    proj = (d * d + d + d * cfg.out_dim + cfg.out_dim) if cfg.out_dim else 0
    return stem + cfg.layers * layer + 2 * d + proj


def _layer(b: GraphBuilder, cfg: AudioConfig, h: str) -> str:
    """One pre-LayerNorm encoder layer in the current ``layers.N`` scope (HF ``WhisperEncoderLayer``)."""
    B, d, T, n = cfg.batch, cfg.hidden, cfg.positions, cfg.heads
    x = layer_norm(b, h, d, "self_attn_layer_norm", cfg.norm_eps)
    with b.scope("self_attn"):
        q = split_heads(b, linear(b, x, d, d, "q_proj", bias=True), B, T, n, d // n)
        k = split_heads(b, linear(b, x, d, d, "k_proj"), B, T, n, d // n)
        v = split_heads(b, linear(b, x, d, d, "v_proj", bias=True), B, T, n, d // n)
        o = merge_heads(b, sdpa(b, q, k, v, 1.0 / math.sqrt(d // n), None), B, T, d)
        h = b.op("Add", [h, linear(b, o, d, d, "out_proj", bias=True)])
    x = layer_norm(b, h, d, "final_layer_norm", cfg.norm_eps)
    y = linear(b, gelu(b, linear(b, x, d, cfg.ffn, "fc1", bias=True)), cfg.ffn, d, "fc2", bias=True)
    return b.op("Add", [h, y])


def tower(b: GraphBuilder, cfg: AudioConfig, features: str) -> str:
    """input_features [B, mel, frames] -> [B, tokens, out_dim or hidden], in the current scope."""
    d, T = cfg.hidden, cfg.positions
    with b.scope("conv1"):
        x = b.op("Conv", [features, b.param("weight", [d, cfg.mel_bins, 3]), b.param("bias", [d])],
                 kernel_shape=[3], pads=[1, 1])
    x = gelu(b, x)
    with b.scope("conv2"):
        x = b.op("Conv", [x, b.param("weight", [d, d, 3]), b.param("bias", [d])],
                 kernel_shape=[3], strides=[2], pads=[1, 1])
    x = b.op("Transpose", [gelu(b, x)], perm=[0, 2, 1])
    with b.scope("embed_positions"):
        pos = b.param("weight", [cfg.max_positions, d])
        if cfg.max_positions > T:
            pos = b.op("Slice", [pos, b.const([0]), b.const([T]), b.const([0])])
    h = b.op("Add", [x, pos])
    for i in range(cfg.layers):
        h = call_layer(b, "WhisperEncoderLayer", f"layers.{i}", lambda lb, x: _layer(lb, cfg, x),
                       {"hidden_states": h})
    if cfg.pool > 1:
        with b.scope("avg_pooler"):
            h = b.op("Transpose", [h], perm=[0, 2, 1])
            h = b.op("AveragePool", [h], kernel_shape=[cfg.pool], strides=[cfg.pool])
            h = b.op("Transpose", [h], perm=[0, 2, 1])
    h = layer_norm(b, h, d, "layer_norm", cfg.norm_eps)
    if cfg.out_dim:
        h = linear(b, gelu(b, linear(b, h, d, d, "proj1", bias=True)), d, cfg.out_dim, "proj2", bias=True)
    return h
