"""A Hugging Face ``config.json`` as a zoo model: the same architecture, weightless, built by the zoo's builders.

    >>> family, cfg = models_zoo.hf_config.read_config("path/to/Meta-Llama-3-8B")   # a folder or its config.json
    >>> models_zoo.build_hf("path/to/config.json", layers=2)                       # overrides as for presets

``model_type`` picks the mapper (`hf_text`, `hf_multimodal`); each reads
the fields with transformers' defaults (`hf_fields`) and sets the zoo
config's switches, so the parameter count is transformers' own for that
config (the tests build transformers' model on the meta device and compare).

Sequence length: a ``config.json`` states the context limit
(``max_position_embeddings``), not a training length, so the graph is built
at `DEFAULT_SEQ_LEN` (capped at that limit) unless ``seq_len`` is given, as
every planner command does from ``--seq-len``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from models_zoo.common import require
from models_zoo.hf_fields import Fields
from models_zoo.hf_multimodal import MULTIMODAL
from models_zoo.hf_text import TEXT

CONFIG_FILE = "config.json"
#: Tokens per sequence when none is given: the pre-training length of most of these families (Llama 2, Qwen3
#: stages 1-2, DeepSeek-V3, Nemotron-4).
DEFAULT_SEQ_LEN = 4096
MAPPERS = TEXT | MULTIMODAL


def supported() -> list[str]:
    """The model_type values the zoo reads, sorted."""
    return sorted(MAPPERS)


def locate(path: str | os.PathLike) -> str | None:
    """The config.json `path` names: a ``.json`` file, or a folder holding ``config.json``; else None."""
    text = os.fspath(path)
    if os.path.isdir(text):
        inner = os.path.join(text, CONFIG_FILE)
        return inner if os.path.isfile(inner) else None
    return text if os.path.isfile(text) and text.lower().endswith(".json") else None


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed config object of `path` (see `locate`); ValueError with one sentence for anything else."""
    found = locate(path)
    require(found is not None, f"'{os.fspath(path)}' is neither a .json file nor a folder holding {CONFIG_FILE}.")
    try:
        with open(found, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read '{found}': {exc.strerror}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"'{found}' is not valid JSON ({exc}).") from None
    require(isinstance(data, dict), f"'{found}' holds a JSON {type(data).__name__}, not a config object.")
    return data


def read_config(source: str | os.PathLike | dict[str, Any], seq_len: int | None = None) -> tuple[str, Any]:
    """(family, zoo config) of a config.json path or an already parsed config dict."""
    data = source if isinstance(source, dict) else load(source)
    where = "config" if isinstance(source, dict) else f"'{os.fspath(source)}'"
    kind = data.get("model_type")
    require(isinstance(kind, str) and kind in MAPPERS, _unknown(where, kind))
    fields = Fields(data, kind, f"{where} ({kind})")
    limit = data.get("max_position_embeddings")
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, limit) if isinstance(limit, int) and limit > 0 else DEFAULT_SEQ_LEN
    return MAPPERS[kind](fields, seq_len)


def _unknown(where: str, kind: Any) -> str:
    what = f"model_type {kind!r}" if kind is not None else "no model_type"
    return (f"{where} has {what}; the zoo builds {', '.join(supported())} from a config.json; "
            "export any other model to ONNX and pass the .onnx file.")
