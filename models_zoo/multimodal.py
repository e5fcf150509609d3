"""Vision (and audio) encoders feeding an LLM backbone: LLaVA, InternVL, omni models.

Layout of transformers 5's ``LlavaForConditionalGeneration`` /
``InternVLForConditionalGeneration``: ``model.vision_tower``,
``model.multi_modal_projector``, ``model.language_model`` (a Llama-style
decoder, dense or MoE) and a root ``lm_head``; an audio encoder sits at
``model.audio_tower``. The sub-models are separate scopes so a planner can
give each its own device group (HyperMPMD).

Sequence assembly: the LLM reads [image tokens, audio tokens, text tokens]
(a Concat; HF scatters media features into placeholder positions of the
same total length, which costs the same). ``seq_len`` is the LLM's total
length; ``input_ids`` carries the rest after the media tokens.

A ``qwen2vl`` tower lays the model out as transformers' ``Qwen2VLForConditionalGeneration``:
the tower and its patch merger under ``model.visual`` (``merger.ln_q``, a LayerNorm of each patch
before the 2 x 2 merge, then ``merger.mlp.0`` / ``mlp.2``), the LLM under ``model.language_model``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnx import ModelProto, TensorProto

from models_zoo import audio as audio_mod
from models_zoo import llama, vision
from models_zoo.audio import AudioConfig
from models_zoo.common import finish, require
from models_zoo.graph_builder import GraphBuilder
from models_zoo.layers import gelu, layer_norm, linear, reshape
from models_zoo.llama import LlamaConfig
from models_zoo.vision import VisionConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class MultimodalConfig:
    text: LlamaConfig
    vision: VisionConfig
    merge: int = 1  # pixel-shuffle factor: merge x merge patches into one token (InternVL: 2)
    projector_norm: bool = False  # LayerNorm before the projector MLP (InternVL, Qwen mergers)
    projector_hidden: int = 0  # projector MLP width (0: the LLM's hidden)
    drop_cls: bool = True
    deepstack: tuple[int, ...] = ()  # vision layers merged and added after LLM layers 0, 1, ...
    audio: AudioConfig | None = None

    @property
    def grid(self) -> int:
        return self.vision.image_size // self.vision.patch_size

    @property
    def image_tokens(self) -> int:
        return (self.grid // self.merge) ** 2

    @property
    def media_tokens(self) -> int:
        return self.image_tokens + (self.audio.tokens if self.audio else 0)

    @property
    def text_tokens(self) -> int:
        return self.text.seq_len - self.media_tokens

    def synced(self) -> MultimodalConfig:
        """Towers take the backbone's batch and dtype (one run setting for the whole model)."""
        t = self.text
        vis = dataclasses.replace(self.vision, batch=t.batch, dtype=t.dtype)
        aud = dataclasses.replace(self.audio, batch=t.batch, dtype=t.dtype) if self.audio else None
        return dataclasses.replace(self, vision=vis, audio=aud)

    def validate(self) -> None:
        self.text.validate()
        self.vision.validate()
        if self.audio:
            self.audio.validate()
        require(self.vision.style != "vit", "a VLM's vision tower uses style clip, siglip or internvit.")
        require(
            self.merge > 0 and self.grid % self.merge == 0,
            f"merge={self.merge} must divide the patch grid {self.grid}.",
        )
        require(self.cls_dropped, "a tower with a class token needs drop_cls (merging needs a square grid).")
        require(
            self.text_tokens > 0,
            f"seq_len={self.text.seq_len} leaves no text after {self.media_tokens} media tokens; raise seq_len.",
        )
        for j in self.deepstack:
            require(
                0 <= j < self.vision.layers,
                f"deepstack layer {j} is outside the {self.vision.layers} vision layers.",
            )
        require(len(self.deepstack) <= self.text.layers,
                f"{len(self.deepstack)} deepstack features but {self.text.layers} LLM layers to add them to; give "
                f"at least {len(self.deepstack)} layers.")

    @property
    def cls_dropped(self) -> bool:
        return self.drop_cls or not self.vision.cls


def projector_params(cfg: MultimodalConfig) -> int:
    width = cfg.vision.hidden * cfg.merge**2
    hid = cfg.projector_hidden or cfg.text.hidden
    norm = (2 * (cfg.vision.hidden if _qwen(cfg) else width)) if cfg.projector_norm else 0
    return norm + width * hid + hid + hid * cfg.text.hidden + cfg.text.hidden


def param_counts(cfg: MultimodalConfig) -> tuple[int, int]:
    """Towers and projectors run for every sample: only the backbone's idle experts are inactive."""
    text_total, text_active = llama.param_counts(cfg.text)
    towers = vision.tower_params(cfg.vision) + projector_params(cfg) * (1 + len(cfg.deepstack))
    towers += audio_mod.param_counts(cfg.audio) if cfg.audio else 0
    return text_total + towers, text_active + towers


def _qwen(cfg: MultimodalConfig) -> bool:
    return cfg.vision.style == "qwen2vl"


def _project(b: GraphBuilder, cfg: MultimodalConfig, x: str) -> str:
    """Pixel-shuffle (HF InternVL ``pixel_shuffle``) then [LayerNorm] -> linear_1 -> GELU -> linear_2; Qwen2-VL's
    merger normalises each patch before merging (``ln_q``) and names its linears ``mlp.0`` and ``mlp.2``."""
    B, C, g, m = cfg.text.batch, cfg.vision.hidden, cfg.grid, cfg.merge
    qwen = _qwen(cfg)
    if qwen and cfg.projector_norm:
        x = layer_norm(b, x, C, "ln_q", 1e-6)
    if m > 1:
        x = reshape(b, x, [B, g, g // m, m * C])
        x = reshape(b, b.op("Transpose", [x], perm=[0, 2, 1, 3]), [B, g // m, g // m, m * m * C])
        x = reshape(b, b.op("Transpose", [x], perm=[0, 2, 1, 3]), [B, cfg.image_tokens, m * m * C])
    width, hid = C * m * m, cfg.projector_hidden or cfg.text.hidden
    if cfg.projector_norm and not qwen:
        x = layer_norm(b, x, width, "layer_norm")
    first, second = ("mlp.0", "mlp.2") if qwen else ("linear_1", "linear_2")
    x = gelu(b, linear(b, x, width, hid, first, bias=True))
    return linear(b, x, hid, cfg.text.hidden, second, bias=True)


def build(cfg: MultimodalConfig, family: str = "multimodal", preset: str = "", flat: bool = False) -> ModelProto:
    """``pixel_values`` (+ ``input_features``) + ``input_ids`` -> ``logits`` [B, seq_len, V]; layers as
    functions unless `flat`."""
    cfg = cfg.synced()
    cfg.validate()
    t, v = cfg.text, cfg.vision
    b = GraphBuilder(preset or family, t.dtype, flat=flat)
    B, S = t.batch, t.seq_len
    pixels = b.input("pixel_values", b.elem, v.pixel_shape)
    feats = None
    if cfg.audio:
        feats = b.input("input_features", b.elem, [B, cfg.audio.mel_bins, cfg.audio.frames])
    ids = b.input("input_ids", TensorProto.INT64, [B, cfg.text_tokens])
    with b.scope("model"):
        taps: dict[int, str] = {j: "" for j in cfg.deepstack}
        with b.scope("visual" if _qwen(cfg) else "vision_tower"):
            img = vision.tower(b, v, pixels, taps)
            extra = []
            for n, j in enumerate(cfg.deepstack):
                with b.scope(f"deepstack_merger_list.{n}"):
                    extra.append(_project(b, cfg, _drop_cls(b, cfg, taps[j])))
            if _qwen(cfg):
                with b.scope("merger"):
                    parts = [_project(b, cfg, img)]
        if not _qwen(cfg):
            with b.scope("multi_modal_projector"):
                parts = [_project(b, cfg, _drop_cls(b, cfg, img))]
        if cfg.audio and feats:
            with b.scope("audio_tower"):
                parts.append(audio_mod.tower(b, cfg.audio, feats))
        with b.scope("language_model"):
            text_emb, table = llama.embed(b, t, ids)
            h = b.op("Concat", parts + [text_emb], axis=1)
            hooks = {}
            for n, f in enumerate(extra):  # DeepStack: add features at the image positions
                hooks[n] = b.op("Pad", [f, b.const([0, 0, 0, 0, S - cfg.image_tokens, 0])])
            h = llama.decoder_stack(b, t, h, S, hooks)
    logits = llama.lm_head(b, t, h, table)
    b.output(logits, "logits", b.elem, [B, S, t.vocab])
    total, active = param_counts(cfg)
    return finish(b, family, preset, cfg, total, active)


def _drop_cls(b: GraphBuilder, cfg: MultimodalConfig, x: str) -> str:
    if not cfg.vision.cls:
        return x
    return b.op("Slice", [x, b.const([1]), b.const([cfg.vision.tokens]), b.const([1])])
