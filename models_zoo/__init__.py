"""Weightless ONNX graphs of reference architectures, by name, with free hyperparameters.

    >>> import models_zoo
    >>> m = models_zoo.build("llama3-8b", layers=2, seq_len=512)   # onnx.ModelProto
    >>> models_zoo.param_counts("deepseek-v3")                      # (total, active)
    >>> models_zoo.build_hf("path/to/config.json", layers=2)       # a Hugging Face config, by the same builders

Graphs hold no weights: parameters are initializers with external data at
``#weightless`` (see `graph_builder`); read a saved one with
``onnx.load(path, load_external_data=False)``. Repeated layers are
model-local functions unless ``build(..., flat=True)``. Summing initializer dims
gives the parameter count; ``model.metadata_props`` carries
``hyperplan.family``, ``hyperplan.preset``, ``hyperplan.config`` (JSON),
``hyperplan.params`` and ``hyperplan.active_params``.

A Hugging Face ``config.json`` (or a folder holding one) is built by the
same builders (`hf_config`: ``model_type`` picks the family, fields set the
switches); overrides apply to it as to a preset.

This package imports onnx (and numpy) only: nothing of hyperplan. Bad names,
files or overrides raise ValueError with one sentence; the planner wraps it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from onnx import ModelProto

from models_zoo import deepseek, gpt, gpt_oss, hf_config, llama, multimodal, vision
from models_zoo.common import require, typed, with_overrides
from models_zoo.graph_builder import WEIGHTLESS_LOCATION, materialize
from models_zoo.layer_functions import inlined_node_count
from models_zoo.multimodal import MultimodalConfig
from models_zoo.presets import BY_NAME, PRESETS, Preset

__all__ = [
    "PresetInfo", "WEIGHTLESS_LOCATION", "build", "build_hf", "config", "hf_config_file", "hf_model_config",
    "hf_model_types", "hf_param_counts", "inlined_node_count", "is_zoo_name", "materialize", "names", "param_counts",
    "presets",
]

_FAMILIES: dict[str, tuple[Callable[..., ModelProto], Callable[[Any], tuple[int, int]]]] = {
    "gpt": (gpt.build, gpt.param_counts),
    "llama": (llama.build, llama.param_counts),
    "mixtral": (llama.build, llama.param_counts),
    "deepseek": (deepseek.build, deepseek.param_counts),
    "gpt-oss": (gpt_oss.build, gpt_oss.param_counts),
    "vit": (vision.build, vision.param_counts),
    "multimodal": (multimodal.build, multimodal.param_counts),
}


@dataclass(frozen=True, slots=True)
class PresetInfo:
    """One row of `presets()`: our analytic counts beside the published ones."""

    name: str
    family: str
    params: int
    active_params: int
    layers: int
    source: str
    published_params: float
    published_active: float
    tolerance: float
    note: str
    active_basis: str  # how the source counts active parameters: "all", or "no_input_embedding"
    active_compared: int  # our active count on the source's basis (what `published_active` is checked against)


def presets() -> list[PresetInfo]:
    """Every preset in a fixed order (by family as listed, then size)."""
    rows = []
    for p in PRESETS:
        total, active = _FAMILIES[p.family][1](p.config)
        compared = active - (_input_embedding(p.config) if p.active_basis == "no_input_embedding" else 0)
        rows.append(PresetInfo(
            p.name, p.family, total, active, _layers(p.config), p.source,
            p.published_params, p.published_active, p.tolerance, p.note, p.active_basis, compared,
        ))
    return rows


def names() -> list[str]:
    """Preset names in listing order."""
    return [p.name for p in PRESETS]


def is_zoo_name(name: str) -> bool:
    return isinstance(name, str) and name in BY_NAME


def config(name: str, **overrides: Any) -> Any:
    """The preset's config dataclass with `overrides` applied and checked."""
    preset = _preset(name)
    return _checked(_apply(preset.config, f"zoo model {preset.name!r}", overrides))


def _checked(cfg: Any) -> Any:
    (cfg.synced() if isinstance(cfg, MultimodalConfig) else cfg).validate()
    return cfg


# -- Hugging Face config.json files ---------------------------------------------------------------
def hf_config_file(path: Any) -> str | None:
    """The config.json a path names (the file itself, or a folder's ``config.json``), or None."""
    return hf_config.locate(path)


def hf_model_types() -> list[str]:
    """The ``model_type`` values `build_hf` reads."""
    return hf_config.supported()


def hf_model_config(path: Any, **overrides: Any) -> tuple[str, Any]:
    """(family, config dataclass) of a Hugging Face config.json (or its folder), with `overrides` applied."""
    family, cfg = hf_config.read_config(path)
    return family, _checked(_apply(cfg, f"'{path}'", overrides))


def build_hf(path: Any, *, flat: bool = False, **overrides: Any) -> ModelProto:
    """The weightless graph of a Hugging Face config.json, as `build` makes a preset's (same builders, overrides)."""
    require(isinstance(flat, bool), f"flat must be True or False, got {flat!r}.")
    family, cfg = hf_model_config(path, **overrides)
    return _FAMILIES[family][0](cfg, family, "", flat=flat)


def hf_param_counts(path: Any, **overrides: Any) -> tuple[int, int]:
    """(total, active) parameters of a Hugging Face config.json from the formulas, without building the graph."""
    family, cfg = hf_model_config(path, **overrides)
    return _FAMILIES[family][1](cfg.synced() if isinstance(cfg, MultimodalConfig) else cfg)


def build(name: str, *, flat: bool = False, **overrides: Any) -> ModelProto:
    """The weightless graph of preset `name` with `overrides` (e.g. layers=2, seq_len=512, batch=4).

    Each repeated layer is a model-local function called once per layer
    (`layer_functions`: a few hundred KB for 671B parameters); `flat=True`
    gives the same graph with every layer's nodes written out (what a
    consumer that annotates nodes one by one needs). Both import, run in
    onnxruntime and cost the same.
    """
    preset = _preset(name)
    require(isinstance(flat, bool), f"flat must be True or False, got {flat!r}.")
    return _FAMILIES[preset.family][0](config(name, **overrides), preset.family, preset.name, flat=flat)


def param_counts(name: str, **overrides: Any) -> tuple[int, int]:
    """(total, active) parameters from the config's formula, without building the graph."""
    preset = _preset(name)
    cfg = config(name, **overrides)
    return _FAMILIES[preset.family][1](cfg.synced() if isinstance(cfg, MultimodalConfig) else cfg)


def _preset(name: str) -> Preset:
    require(
        isinstance(name, str) and name in BY_NAME,
        f"unknown zoo model {name!r}; known: {', '.join(p.name for p in PRESETS)}.",
    )
    return BY_NAME[name]


def _layers(cfg: Any) -> int:
    return cfg.text.layers if isinstance(cfg, MultimodalConfig) else cfg.layers


def _input_embedding(cfg: Any) -> int:
    """Parameters of the token-embedding table (the LLM's, for a multimodal model)."""
    text = cfg.text if isinstance(cfg, MultimodalConfig) else cfg
    return text.vocab * text.hidden


def _apply(cfg: Any, what: str, overrides: dict[str, Any]) -> Any:
    """Route flat overrides to the config; a multimodal model splits them by prefix.

    For a multimodal model, ``vision_<field>`` and ``audio_<field>`` go to the
    towers, ``merge``/``projector_*``/``deepstack`` to the model, and every
    other key (layers, hidden, seq_len, batch, experts, ...) to the LLM.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not isinstance(cfg, MultimodalConfig):
        return with_overrides(cfg, overrides, what)
    own = {f.name for f in dataclasses.fields(cfg)} - {"text", "vision", "audio"}
    parts: dict[str, dict[str, Any]] = {"text": {}, "vision": {}, "audio": {}, "own": {}}
    for key in sorted(overrides):
        if key.startswith("vision_"):
            parts["vision"][key[len("vision_"):]] = overrides[key]
        elif key.startswith("audio_"):
            require(cfg.audio is not None, f"{what} has no audio tower; drop {key!r}.")
            parts["audio"][key[len("audio_"):]] = overrides[key]
        elif key in own:
            parts["own"][key] = typed(key, getattr(cfg, key), overrides[key])
        else:
            parts["text"][key] = overrides[key]
    return dataclasses.replace(
        cfg,
        text=with_overrides(cfg.text, parts["text"], what),
        vision=with_overrides(cfg.vision, parts["vision"], f"{what}'s vision tower (vision_*)"),
        audio=with_overrides(cfg.audio, parts["audio"], f"{what}'s audio tower (audio_*)") if cfg.audio else None,
        **parts["own"],
    )
