"""What every family shares: config checks, the run settings, model metadata.

Configs are frozen dataclasses of plain numbers; a bad value raises
ValueError with one sentence naming the field and the fix (the planner
turns it into its own InvalidInput).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from onnx import ModelProto

from models_zoo.graph_builder import DTYPES, GraphBuilder


def require(ok: bool, message: str) -> None:
    """Raise ValueError(message) unless ok: the one check used on every config field."""
    if not ok:
        raise ValueError(message)


def check_positive(cfg: object, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        require(
            isinstance(value, int) and not isinstance(value, bool) and value > 0,
            f"{name} must be a positive integer, got {value!r}.",
        )


def check_dtype(dtype: str) -> None:
    require(dtype in DTYPES, f"dtype {dtype!r} is not supported; use one of {', '.join(sorted(DTYPES))}.")


def check_divides(part: int, whole: int, part_name: str, whole_name: str) -> None:
    require(
        whole % part == 0,
        f"{whole_name}={whole} is not a multiple of {part_name}={part}; pick values that divide.",
    )


#: Field metadata of an architecture switch added after the first presets: `config_json` writes it only
#: when it differs from its default, so a preset built before the switch existed keeps its exact bytes.
SWITCH = {"omit_at_default": True}


def switch(default: Any) -> Any:
    """A config field that `config_json` leaves out while it holds `default` (see `SWITCH`)."""
    return dataclasses.field(default=default, metadata=SWITCH)


def _plain(obj: Any) -> Any:
    """dataclasses.asdict, without the switches that hold their defaults."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if not (f.metadata.get("omit_at_default") and getattr(obj, f.name) == f.default)
        }
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def config_json(cfg: object) -> str:
    """The config as canonical JSON (sorted keys), stored in the model's metadata.

    A composite config (multimodal: ``text``, ``vision``...) also gets the
    run settings ``batch``/``seq_len`` at the top, where readers look first.
    Switches at their defaults are left out (`SWITCH`).
    """
    data = _plain(cfg)
    text = data.get("text")
    if isinstance(text, dict):
        data.setdefault("batch", text["batch"])
        data.setdefault("seq_len", text["seq_len"])
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def finish(b: GraphBuilder, family: str, preset: str, cfg: object, total: int, active: int) -> ModelProto:
    """Seal the graph with hyperplan's metadata keys; cross-check the analytic count."""
    if b.param_numel != total:  # internal invariant: the formula and the graph must agree
        raise AssertionError(f"{family}: graph holds {b.param_numel} parameters, formula says {total}")
    meta = {
        "hyperplan.family": family,
        "hyperplan.preset": preset,
        "hyperplan.config": config_json(cfg),
        "hyperplan.params": str(total),
        "hyperplan.active_params": str(active),
        "hyperplan.weights": "weightless: initializers are external data at '#weightless'; "
        "load with onnx.load(path, load_external_data=False)",
    }
    return b.finish(meta, doc=f"hyperplan zoo: {preset or family} ({family}), weightless")


def with_overrides(cfg: Any, overrides: dict[str, Any], what: str) -> Any:
    """dataclasses.replace with a one-sentence error for a field the config does not have or a value of the
    wrong kind (`typed`)."""
    fields = {f.name for f in dataclasses.fields(cfg)}
    for key in sorted(overrides):
        require(key in fields, f"{what} has no setting {key!r}; valid settings: {', '.join(sorted(fields))}.")
    return dataclasses.replace(cfg, **{k: typed(k, getattr(cfg, k), v) for k, v in overrides.items()})


def typed(key: str, current: Any, value: Any) -> Any:
    """`value` for a field now holding `current`, of the same kind: a switch takes true/false, a count an integer,
    a number an integer or a float (stored as a float), a name a string, a list of layers a list or tuple."""
    if isinstance(current, bool):
        require(isinstance(value, bool), f"{key} must be true or false, got {value!r}.")
    elif isinstance(current, int):
        require(isinstance(value, int) and not isinstance(value, bool), f"{key} must be an integer, got {value!r}.")
    elif isinstance(current, float):
        require(isinstance(value, (int, float)) and not isinstance(value, bool), f"{key} must be a number, got "
                f"{value!r}.")
        return float(value)
    elif isinstance(current, str):
        require(isinstance(value, str), f"{key} must be a name, got {value!r}.")
    elif isinstance(current, tuple):
        require(isinstance(value, (list, tuple)), f"{key} must be a list, got {value!r}.")
        return tuple(value)
    return value
