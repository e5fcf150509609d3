"""Vision transformers (Dosovitskiy et al. 2021): a Conv patch embedding and an encoder.

One encoder, four naming styles, because VLMs ship their vision tower in the
exact layout of the model it was initialised from:

- ``vit``: HF ``ViTForImageClassification`` (transformers 5: ``vit.layers.N.attention.q_proj``);
- ``clip``: HF ``CLIPVisionModel`` (LLaVA's tower; QuickGELU costed as GELU);
- ``siglip``: HF ``SiglipVisionModel`` (no class token, post-LayerNorm kept);
- ``internvit``: HF ``InternVLVisionModel`` (RMSNorm, QK-norm, layer scale, no qkv bias);
- ``qwen2vl``: HF ``Qwen2VisionTransformerPretrainedModel`` (a Conv3d over ``temporal_patch``
  frames without bias, no class token nor position table, fused qkv, no final norm). Its 2-D
  rotary embedding of q and k is left out: elementwise on q and k, it changes no parameter and
  no shape.

Tower outputs are the last computed layer's hidden states; a VLM that
reads an earlier layer (LLaVA: the penultimate) builds only the layers it
reads, as the exporter would after dead-code elimination.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx import ModelProto

from models_zoo.common import check_divides, check_dtype, check_positive, finish, require, switch
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layer_functions import call_layer
from models_zoo.layers import gelu, layer_norm, linear, merge_heads, reshape, rms_norm, sdpa, split_heads

STYLES = ("vit", "clip", "siglip", "internvit", "qwen2vl")
#: Function name of an encoder layer: HF's class for each style.
LAYER_KINDS = {"vit": "ViTLayer", "clip": "CLIPEncoderLayer", "siglip": "SiglipEncoderLayer",
               "internvit": "InternVLVisionLayer", "qwen2vl": "Qwen2VLVisionBlock"}


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionConfig:
    hidden: int
    layers: int
    heads: int
    ffn: int
    image_size: int
    patch_size: int
    style: str = "vit"
    channels: int = 3
    num_labels: int = 1000  # the classifier of the ``vit`` style only
    batch: int = 1
    norm_eps: float = 1e-6
    dtype: str = "bfloat16"
    temporal_patch: int = switch(1)  # frames per patch (Qwen2-VL: 2, an image being two equal frames)

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def cls(self) -> int:
        return 0 if self.style in ("siglip", "qwen2vl") else 1

    @property
    def pixel_shape(self) -> list[int]:
        """``pixel_values``: [B, C, I, I], or [B, C, T, I, I] for a tower whose patches span T frames."""
        frames = [self.temporal_patch] if self.style == "qwen2vl" else []
        return [self.batch, self.channels, *frames, self.image_size, self.image_size]

    @property
    def tokens(self) -> int:
        return self.patches + self.cls

    def validate(self) -> None:
        check_positive(
            self, "hidden", "layers", "heads", "ffn", "image_size", "patch_size", "channels", "num_labels", "batch",
            "temporal_patch",
        )
        check_dtype(self.dtype)
        require(self.style in STYLES, f"vision style {self.style!r} is unknown; use one of {', '.join(STYLES)}.")
        check_divides(self.heads, self.hidden, "heads", "hidden")
        check_divides(self.patch_size, self.image_size, "patch_size", "image_size")


def tower_params(cfg: VisionConfig) -> int:
    """Parameters of the tower (embeddings + encoder + its own final norm), no head."""
    h, f = cfg.hidden, cfg.ffn
    if cfg.style == "qwen2vl":  # the patch Conv3d alone: no bias, no class token, no position table
        emb = cfg.channels * cfg.temporal_patch * cfg.patch_size**2 * h
    else:
        emb = cfg.channels * cfg.patch_size**2 * h + (0 if cfg.style == "clip" else h)
        emb += cfg.tokens * h + cfg.cls * h + (2 * h if cfg.style == "clip" else 0)
    if cfg.style == "internvit":
        layer = 4 * h * h + h + 2 * h + 2 * h + 2 * h  # no qkv bias; out bias; 2 RMSNorms; qk-norm; 2 layer scales
    else:
        layer = 4 * h * h + 4 * h + 4 * h  # q, k, v, out with bias; two LayerNorms
    layer += 2 * h * f + f + h
    final = 2 * h if cfg.style in ("vit", "siglip") else 0
    return emb + cfg.layers * layer + final


def param_counts(cfg: VisionConfig) -> tuple[int, int]:
    total = tower_params(cfg) + cfg.hidden * cfg.num_labels + cfg.num_labels
    return total, total


def _embeddings(b: GraphBuilder, cfg: VisionConfig, pixels: str) -> str:
    B, H, p, style = cfg.batch, cfg.hidden, cfg.patch_size, cfg.style
    if style == "qwen2vl":
        T = cfg.temporal_patch
        with b.scope("patch_embed.proj"):
            w = b.param("weight", [H, cfg.channels, T, p, p])
            x = b.op("Conv", [pixels, w], kernel_shape=[T, p, p], strides=[T, p, p])
        return b.op("Transpose", [reshape(b, x, [B, H, cfg.patches])], perm=[0, 2, 1])
    with b.scope("embeddings"):
        conv_scope = "patch_embeddings.projection" if style in ("vit", "internvit") else "patch_embedding"
        with b.scope(conv_scope):
            ins = [pixels, b.param("weight", [H, cfg.channels, p, p])]
            if style != "clip":
                ins.append(b.param("bias", [H]))
            x = b.op("Conv", ins, kernel_shape=[p, p], strides=[p, p])
        x = b.op("Transpose", [reshape(b, x, [B, H, cfg.patches])], perm=[0, 2, 1])
        if cfg.cls:
            cls = b.param("class_embedding", [H]) if style == "clip" else b.param("cls_token", [1, 1, H])
            cls = b.op("Expand", [reshape(b, cls, [1, 1, H]), b.const([B, 1, H])])
            x = b.op("Concat", [cls, x], axis=1)
        if style == "clip" or style == "siglip":
            with b.scope("position_embedding"):
                pos = b.param("weight", [cfg.tokens, H])
        else:
            pos = b.param("position_embeddings", [1, cfg.tokens, H])
        x = b.op("Add", [x, pos])
    if style == "clip":
        x = layer_norm(b, x, H, "pre_layrnorm", cfg.norm_eps)
    return x


def _layer(b: GraphBuilder, cfg: VisionConfig, h: str) -> str:
    B, H, T, n = cfg.batch, cfg.hidden, cfg.tokens, cfg.heads
    intern, qwen = cfg.style == "internvit", cfg.style == "qwen2vl"
    hf_vit = cfg.style in ("vit", "internvit")
    if hf_vit:
        norm1, norm2 = "layernorm_before", "layernorm_after"
    else:
        norm1, norm2 = ("norm1", "norm2") if qwen else ("layer_norm1", "layer_norm2")
    x = rms_norm(b, h, H, norm1, cfg.norm_eps) if intern else layer_norm(b, h, H, norm1, cfg.norm_eps)
    with b.scope("attention" if hf_vit else "attn" if qwen else "self_attn"):
        if qwen:
            q, k, v = b.op("Split", [linear(b, x, H, 3 * H, "qkv", bias=True), b.const([H, H, H])], n_out=3, axis=-1)
        else:
            q = linear(b, x, H, H, "q_proj", bias=not intern)
            k = linear(b, x, H, H, "k_proj", bias=not intern)
            v = linear(b, x, H, H, "v_proj", bias=not intern)
        if intern:
            q = rms_norm(b, q, H, "q_norm", cfg.norm_eps)
            k = rms_norm(b, k, H, "k_norm", cfg.norm_eps)
        q, k, v = (split_heads(b, t, B, T, n, H // n) for t in (q, k, v))
        o = merge_heads(b, sdpa(b, q, k, v, 1.0 / math.sqrt(H // n), None), B, T, H)
        out_name = {"vit": "o_proj", "internvit": "projection_layer", "qwen2vl": "proj"}.get(cfg.style, "out_proj")
        o = linear(b, o, H, H, out_name, bias=True)
    if intern:
        o = b.op("Mul", [o, b.param("lambda_1", [H])])
    h = b.op("Add", [h, o])
    x = rms_norm(b, h, H, norm2, cfg.norm_eps) if intern else layer_norm(b, h, H, norm2, cfg.norm_eps)
    with b.scope("mlp"):
        y = gelu(b, linear(b, x, H, cfg.ffn, "fc1", bias=True), tanh=cfg.style == "siglip")
        y = linear(b, y, cfg.ffn, H, "fc2", bias=True)
    if intern:
        y = b.op("Mul", [y, b.param("lambda_2", [H])])
    return b.op("Add", [h, y])


def tower(b: GraphBuilder, cfg: VisionConfig, pixels: str, taps: dict[int, str] | None = None) -> str:
    """Embeddings and encoder in the current scope (the tower's module); returns [B, tokens, H].

    `taps`, when given, is filled with the output of each layer index it
    already holds as a key (intermediate features, e.g. DeepStack's).
    """
    h = _embeddings(b, cfg, pixels)
    container = {"vit": "layers", "internvit": "encoder.layer", "qwen2vl": "blocks"}.get(cfg.style, "encoder.layers")
    for i in range(cfg.layers):
        h = call_layer(b, LAYER_KINDS[cfg.style], f"{container}.{i}", lambda lb, x: _layer(lb, cfg, x),
                       {"hidden_states": h})
        if taps is not None and i in taps:
            taps[i] = h
    if cfg.style == "vit":
        h = layer_norm(b, h, cfg.hidden, "layernorm", cfg.norm_eps)
    elif cfg.style == "siglip":
        h = layer_norm(b, h, cfg.hidden, "post_layernorm", cfg.norm_eps)
    return h


def build(cfg: VisionConfig, family: str = "vit", preset: str = "", flat: bool = False) -> ModelProto:
    """``pixel_values`` [B, C, I, I] -> ``logits`` [B, num_labels] (ViT image classifier); layers as
    functions unless `flat`."""
    cfg.validate()
    require(cfg.style == "vit", f"a stand-alone vision model uses style 'vit', not {cfg.style!r}.")
    b = GraphBuilder(preset or family, cfg.dtype, flat=flat)
    B = cfg.batch
    pixels = b.input("pixel_values", b.elem, cfg.pixel_shape)
    with b.scope("vit"):
        h = tower(b, cfg, pixels)
    with b.scope("classifier"):
        first = b.op("Gather", [h, b.const(0)], axis=1)  # the class token
    logits = linear(b, first, cfg.hidden, cfg.num_labels, "classifier", bias=True)
    b.output(logits, "logits", b.elem, [B, cfg.num_labels])
    total, active = param_counts(cfg)
    return finish(b, family, preset, cfg, total, active)

