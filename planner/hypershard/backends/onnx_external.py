"""Annotated ONNX models whose weights live in external files: checked wherever the command runs, written where
ONNX can still read their weights.

An ONNX file names its external data by a path relative to its own folder,
and the checker (onnx >= 1.16) refuses locations outside that folder,
absolute ones and symbolic links (path-traversal guards). The annotated
model keeps the original references, so that gigabytes of weights are
never copied: the checker reads external data relative to the model file
it is given (not the current directory), so the annotated model is checked
as a short-lived hidden file in the model's folder, and it may only be
written into that folder.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from planner.errors import InvalidInput


def external_locations(model: Any) -> list[str]:
    """The external-data files `model` references (relative to its folder), sorted; a location starting with '#'
    names no file (a weightless model's, `models_zoo.graph_builder.WEIGHTLESS_LOCATION`: the checker reads nothing
    for it when checking the model in memory)."""
    from onnx.external_data_helper import _get_all_tensors

    out = set()
    for t in _get_all_tensors(model):
        out.update(e.value for e in t.external_data if e.key == "location" and not e.value.startswith("#"))
    return sorted(out)


def check(model: Any, model_dir: str | None) -> None:
    """onnx.checker on `model`, its external data read from `model_dir`; InvalidInput in one sentence if it fails."""
    import onnx

    try:
        locations = external_locations(model)
        if not locations or model_dir is None:
            onnx.checker.check_model(model)
            return
        fd, path = tempfile.mkstemp(dir=model_dir, prefix=".hyperplan-check-", suffix=".onnx")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(model.SerializeToString())
            onnx.checker.check_model(path)
        finally:
            os.unlink(path)
    except onnx.checker.ValidationError as exc:
        raise InvalidInput(f"the annotated model fails onnx.checker ({str(exc).splitlines()[0]}); re-plan, or "
                           "check the declaration's layouts against the model") from None


def check_target(model_path: str, out: str) -> None:
    """InvalidInput unless `out` is in the folder of `model_path` when that model keeps weights in external files."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    locations = external_locations(model)
    home = os.path.dirname(os.path.abspath(model_path))
    if locations and os.path.dirname(os.path.abspath(out)) != home:
        raise InvalidInput(f"-o {out}: {os.path.basename(model_path)} keeps its weights in {', '.join(locations)}, "
                           f"which ONNX reads only from the model's own folder; write the annotated model in {home}")
    missing = [x for x in locations if not os.path.isfile(os.path.join(home, x))]
    if missing:  # planning never reads the weights; the annotated model references them, and onnx.checker reads them
        raise InvalidInput(f"{os.path.basename(model_path)} keeps its weights in {missing[0]}, which is not in {home}; "
                           "copy it beside the model (the annotated model references it)")


__all__ = ["check", "check_target", "external_locations"]
