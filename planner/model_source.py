"""What a MODEL argument names: an ONNX file, a Hugging Face ``config.json`` (or its folder), or a zoo preset.

Every command takes the same MODEL, and this is the one place that tells the
three apart, so the importer, the declaration, the caches and the serving
profile agree. A config.json is built weightless by the zoo's builders, as a
preset is: it takes the same architecture overrides and is built at the run's
batch and sequence length. A folder is read as a Hugging Face checkpoint
folder (its ``config.json``), even when it also holds an exported .onnx:
pass the .onnx path to import the export.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping

from planner.errors import InvalidInput

Kind = Literal["onnx", "hf_config", "zoo", "unknown"]


def hf_config_file(model: str | os.PathLike) -> str | None:
    """The config.json `model` names (the file, or a folder's ``config.json``), or None."""
    import models_zoo

    return models_zoo.hf_config_file(os.fspath(model))


def kind_of(model: str | os.PathLike) -> Kind:
    text = os.fspath(model)
    if hf_config_file(text):
        return "hf_config"
    if os.path.isfile(text):
        return "onnx"
    return "zoo" if is_zoo_name(text) else "unknown"


def is_zoo_name(name: str) -> bool:
    import models_zoo

    return models_zoo.is_zoo_name(name)


def content_file(model: str | os.PathLike) -> str | None:
    """The file whose bytes are the model (an ONNX file, a config.json), for hashes and cache stamps; None for a
    zoo name."""
    text = os.fspath(model)
    return hf_config_file(text) or (text if os.path.isfile(text) else None)


def display_name(model: str | os.PathLike) -> str:
    """How reports name the model: a zoo name, a file's name, a config.json by its checkpoint folder."""
    text = os.fspath(model)
    found = hf_config_file(text)
    if found and os.path.basename(found) == "config.json":
        return os.path.basename(os.path.dirname(os.path.abspath(found))) or "config.json"
    return os.path.basename(os.path.normpath(text)) if (found or os.path.exists(text)) else text


def takes(model: str, key: str, value: Any) -> bool:
    """Whether the weightless model `model` has the setting `key` at all (a bad value still fails loudly later)."""
    import models_zoo

    try:
        if kind_of(model) == "hf_config":
            models_zoo.hf_model_config(model, **{key: value})
        else:
            models_zoo.config(model, **{key: value})
    except ValueError as exc:
        return f"no setting '{key}'" not in str(exc)
    return True


def build_weightless(model: str, settings: Mapping[str, Any]) -> Any:
    """The flat weightless ONNX graph of a zoo preset or a config.json, with `settings` (overrides, batch,
    seq_len); the zoo's one-sentence ValueError becomes InvalidInput naming the model."""
    import models_zoo

    hf = kind_of(model) == "hf_config"
    try:
        if hf:
            return models_zoo.build_hf(model, flat=True, **settings)
        return models_zoo.build(model, flat=True, **settings)  # in memory: no functions to inline
    except ValueError as exc:
        message = str(exc)
        if hf:
            raise InvalidInput(message if f"'{model}'" in message else f"'{model}': {message}") from None
        raise InvalidInput(message if message.startswith(f"zoo model '{model}'") else f"zoo model '{model}': {message}"
                           ) from None


def unknown_message(text: str, zoo_names: list[str]) -> str:
    """One sentence for a MODEL that names nothing: a missing path, a folder without config.json, or a name."""
    import difflib

    if os.path.isdir(text):
        return (f"folder '{text}' holds no config.json; give an .onnx file, a Hugging Face config.json or the "
                "folder holding it, or a zoo name")
    if os.path.exists(text):
        return (f"'{text}' is not a regular file; give the path of an .onnx file, a Hugging Face config.json or "
                "its folder, or a zoo name")
    if os.sep in text or text.lower().endswith((".onnx", ".pb", ".json")):
        return (f"model file '{text}' does not exist; check the path (`hyperplan zoo list` shows zoo models)")
    close = difflib.get_close_matches(text, zoo_names, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return (f"no file or zoo model named '{text}'; {hint}give the path of an .onnx file or of a Hugging Face "
            "config.json (or its folder), or a zoo name (`hyperplan zoo list` shows the names)")
