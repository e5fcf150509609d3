"""Exporters from a HyperShard declaration to execution frameworks, one module per target.

Each module has `SUFFIX` (the output file's extension) and
`render(doc, base_dir=...)`, returning Python source (str) or an ONNX
model (bytes). Launch backends (`LAUNCH`: Megatron-LM arguments, torchtitan
TOML, DeepSpeed JSON, MindFormers YAML for training; vLLM and SGLang command
lines for serving) render text and also give `written(doc, base_dir=...)`:
what they write as data, with notes (what `export --json` prints). Modules are imported on use:
none of the frameworks is needed to export, only to run what is exported.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping

from planner.errors import ExportRefused, InvalidInput
from planner.hypershard.io import write_atomically
from planner.hypershard.programs import is_serving

#: Backend name (as `--backend` takes it) -> module under planner.hypershard.backends.
BACKENDS: dict[str, str] = {
    "hyper-parallel": "hyper_parallel",
    "mindspore": "mindspore",
    "torch": "torch",
    "jax": "jax",
    "onnx": "onnx",
    "megatron": "megatron",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "mindformers": "mindformers",
    "vllm": "vllm",
    "sglang": "sglang",
}
#: Backends that write a framework's own launch configuration (text: printed when no -o is given).
LAUNCH: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "mindformers", "vllm", "sglang")


#: The knobs `plan --backend NAME` fixes so that the search stays within what the backend runs (the keys of
#: `planner.search.constraints`); what they cannot say the exporter still refuses, in one sentence, before writing.
PLAN_LIMITS: dict[str, dict[str, Any]] = {
    # torch runs a MoE block on each tensor rank's tokens with its experts whole (etp 1), expert parallelism
    # over data-parallel ranks only (so at tp 1), and splits nn.Linear's [out, in] only (backends/torch_refusals.py)
    "torch": {"moe_etp": 1, "moe_cp": 1, "moe_ep_tp": 1, "inout_tp": 1},
    "jax": {"pp": 1, "offload": ()},  # no pipeline runtime on one mesh, no host offload (see backends/jax.py)
    # the launch formats take no fractions of memory classes off HBM but Megatron-LM's optimizer states (with its
    # distributed optimizer) and whole layers' activations (one stage, no recompute: backends/megatron.py); their
    # exporters list the rest they refuse. Each framework recomputes its own way: Megatron-LM's block method leaves
    # the layers past the first k unrecomputed, torchtitan and DeepSpeed count no layers, MindFormers'
    # select_recompute names MindSpore ops; Megatron-LM's selective recompute is its --recompute-modules,
    # torchtitan's its op policy (and every stage of one tensor width: `launch.common_problems`)
    "megatron": {"offload_when": (("activations", "whole_layers_one_stage"), ("optimizer", "distributed_optimizer")),
                 "full_layers_beside": "none", "stage_widths": False, "selective": "modules"},
    # FSDP2 offloads parameters, gradients and optimizer states together (backends/torchtitan.py)
    "torchtitan": {"offload_when": (("grads", "fsdp_together"), ("optimizer", "fsdp_together"),
                                    ("params", "fsdp_together")),
                   "full_layers_beside": "off", "stage_widths": False, "ddp_alone": True,
                   "selective": "every_other_matmul"},
    # its per-stage offsets give every stage a layer; swap_config moves whole layers' activations
    "mindformers": {"offload_when": (("activations", "whole"),), "ends_alone": False,
                    "recompute_policies": ("none", "full"), "full_layers_beside": "none", "stage_widths": False},
    # ZeRO configs have no pipeline or context parallelism; AutoTP splits linears only, and AutoEP folds experts over
    # data-parallel ranks only (no expert parallelism beside tensor parallelism). ZeRO-Offload moves the optimizer's
    # states (a fraction under ZeRO-3), the parameters under ZeRO-3, the gradients beside all the states, and
    # cpu_checkpointing the checkpoints of fully recomputed layers (backends/deepspeed.py)
    "deepspeed": {"pp": 1, "cp": 1, "recompute_policies": ("none", "full"), "full_layers_beside": "off",
                  "sequence_parallel": False, "stage_widths": False, "moe_ep_tp": 1,
                  "offload_when": (("activations", "full_recompute_whole"), ("grads", "with_whole_optimizer"),
                                   ("optimizer", "zero_offload"), ("params", "zero3_whole"))},
}


#: Backends whose format runs a step as several pipeline schedules (`programs[].pipeline_flushes` > 1): torchtitan's
#: gradient-accumulation steps, each a schedule over local_batch_size.
FLUSHING: tuple[str, ...] = ("torchtitan",)


def _flushes_problem(doc: Mapping[str, Any], backend: str) -> None:
    """InvalidInput, in one sentence, when a training program runs several pipeline schedules per step and the
    backend's format runs all of a step's micro-batches in one."""
    if is_serving(doc) or backend in FLUSHING:
        return
    for prog in doc["programs"]:
        k = prog.get("pipeline_flushes", 1)
        if k > 1:
            raise InvalidInput(f"program {prog['name']!r} runs {k} pipeline schedules per step (pipeline_flushes), "
                               f"and the {backend} backend runs all of a step's micro-batches in one; set "
                               f"pipeline_flushes to 1, or export with --backend {' or '.join(FLUSHING)}")


def plan_limits(backend: str) -> dict[str, Any]:
    """The constraints `plan --backend NAME` adds (InvalidInput for an unknown backend)."""
    _module(backend)
    return dict(PLAN_LIMITS.get(backend, {}))


def _module(backend: str) -> Any:
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"planner.hypershard.backends.{BACKENDS[backend]}")


def suffix(backend: str) -> str:
    return _module(backend).SUFFIX


def export(doc: Mapping[str, Any], backend: str, *, base_dir: str | None = None) -> str | bytes:
    """The exported artefact: Python source, or a serialized ONNX model (of a serving declaration: a mesh, the
    layouts and the experts per phase program, see `serving_py` and `serving_onnx`)."""
    module = _module(backend)
    _flushes_problem(doc, backend)
    if backend in LAUNCH:
        return module.render(doc, base_dir=base_dir)
    if is_serving(doc):
        if backend == "onnx":
            from planner.hypershard.backends import serving_onnx

            return serving_onnx.render(doc, base_dir=base_dir)
        from planner.hypershard.backends.serving_py import RENDER

        return RENDER[backend](doc)
    return module.render(doc, base_dir=base_dir)


def launch_config(doc: Mapping[str, Any], backend: str, *, base_dir: str | None = None) -> Any:
    """What a launch backend writes, as JSON-able data: {"config": ..., "notes": [...]} (InvalidInput for a
    backend that is not one)."""
    if backend not in LAUNCH:
        raise InvalidInput(f"the {backend} backend writes a file, not a launch config; give -o FILE (launch "
                           f"configs: {', '.join(LAUNCH)})")
    _flushes_problem(doc, backend)
    w = _module(backend).written(doc, base_dir=base_dir)
    return {"config": w.config, "notes": list(w.notes)}


#: The launch backends of a training plan (vllm and sglang launch serving).
TRAINING_LAUNCH: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "mindformers")


def mode_problem(backend: str, mode: str) -> str:
    """Why `backend` cannot run a plan of `mode` (train or infer), or "": the training launch configs start no
    serving, vllm and sglang no training."""
    if backend in TRAINING_LAUNCH and mode == "infer":
        return (f"--backend {backend} launches training, not serving; with --mode infer use vllm, sglang or a "
                "framework backend (torch, jax, ...)")
    if backend in LAUNCH and backend not in TRAINING_LAUNCH and mode == "train":
        return (f"--backend {backend} launches serving, not training; add --mode infer, or use "
                f"{', '.join(TRAINING_LAUNCH)} or a framework backend to plan training")
    return ""


def launch_configs(doc: Mapping[str, Any]) -> dict[str, str]:
    """Per training launch backend, what of the plan it cannot express ("" where it writes the plan)."""
    out = {}
    for b in TRAINING_LAUNCH:
        try:
            export(doc, b)
            out[b] = ""
        except ExportRefused as exc:
            out[b] = exc.what
        except InvalidInput as exc:  # a refusal of another kind: its sentence, without what to do
            out[b] = str(exc).split("; ", 1)[0]
    return out


def export_to_file(doc: Mapping[str, Any], backend: str, out: str, *, base_dir: str | None = None,
                   protect: tuple[str, ...] = ()) -> int:
    """Write the export to `out` atomically (never over an input); returns the bytes written."""
    want = suffix(backend)
    target = Path(out)
    if target.suffix.lower() != want:
        raise InvalidInput(f"-o {out}: the {backend} backend writes a {want} file; name it like plan{want}")
    checked = getattr(_module(backend), "check_target", None)
    if checked is not None:
        checked(doc, base_dir, out)
    return write_atomically(out, lambda: export(doc, backend, base_dir=base_dir), protect, "export")


__all__ = ["BACKENDS", "FLUSHING", "LAUNCH", "PLAN_LIMITS", "TRAINING_LAUNCH", "export", "export_to_file",
           "launch_config", "launch_configs", "mode_problem", "plan_limits",
           "suffix"]
