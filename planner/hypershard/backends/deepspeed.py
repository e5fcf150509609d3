"""Exporter to a DeepSpeed config (ds_config.json), as DeepSpeed 0.19's DeepSpeedConfig reads it.

Keys are DeepSpeed's own (deepspeed/runtime/config.py, zero/config.py,
zero/offload_config.py, tensor_parallel/config.py, module_inject/auto_ep_config.py
of deepspeed 0.19.8 from PyPI; the tests build its config models from the file):

- the batch: train_batch_size = train_micro_batch_size_per_gpu x
  gradient_accumulation_steps x the data-parallel ranks;
- zero_optimization: the ZeRO stage, overlap_comm as the stack overlaps the
  gradient reduction, offload_optimizer to cpu (a fraction of it, `ratio`,
  with ZeRO-3 only) and offload_param to cpu (ZeRO-3, all of them);
- bf16 or fp16; activation_checkpointing (with cpu_checkpointing when the
  plan offloads all activations of its fully recomputed layers): DeepSpeed's
  checkpointing configures how the model's own checkpointed calls run;
- tensor_parallel.autotp_size for TP without SP (AutoTP), and
  expert_parallel (AutoEP) for EP over the data-parallel ranks, through its
  DeepEP transport (comm_backend "deepep", comm_max_tokens_per_rank a rank's
  micro-batch of tokens) where the stack's dispatcher is the flex one
  (deepspeed 0.19.8 module_inject/auto_ep_comm.py, auto_ep_config.py).

DeepSpeed's JSON cannot make pipeline stages (a PipelineModule is the
model's code), ring-attention context parallelism, sequence parallelism
beside AutoTP, selective or partial recompute, FP8 GEMMs, or offload of a
fraction of parameters, gradients or activations; those are refused.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from planner.hypershard.backends import launch

SUFFIX = ".json"
SOURCE = "deepspeed 0.19.8 (PyPI): deepspeed/runtime/config.py, runtime/zero/config.py, runtime/zero/offload_config.py"


def _problems(t: launch.Training) -> list[launch.Problem]:
    s, out = t.s, launch.common_problems(t, "")
    if s.pp > 1:
        out.append((f"{s.pp} pipeline stages (DeepSpeed pipelines a PipelineModule the model's code builds)",
                    "plan with --pp 1"))
    if s.cp > 1:
        out.append((f"context parallelism {s.cp} (DeepSpeed's sequence parallelism is Ulysses, not ring attention)",
                    "plan with --cp 1"))
    if s.tp > 1 and s.sp:
        out.append(("sequence parallelism beside tensor parallelism (AutoTP splits linears only)", "plan with --tp 1"))
    if s.ep > 1 and s.tp > 1:
        out.append(("expert parallelism beside tensor parallelism (AutoEP folds experts over data parallelism)",
                    "plan with --tp 1"))
    if s.recompute == "selective" or (s.full_recompute_layers and s.recompute != "full"):
        out.append(("selective or per-layer recompute (DeepSpeed checkpoints the calls the model makes)",
                    "plan with --recompute full or none"))
    if t.dtype == "fp8":
        out.append(("FP8 GEMMs (no ds_config key makes them)", "plan with --dtype bf16"))
    opt = t.offload("optimizer")
    allowed = {"optimizer": "fraction" if s.zero == 3 else "whole"} if s.zero else {}
    if s.zero == 3:
        allowed["params"] = "whole"
    if opt == 1.0:  # ZeRO-Offload keeps the gradient partitions beside the optimizer states on the host
        allowed["grads"] = "whole"
    if s.recompute == "full":
        allowed["activations"] = "whole"  # cpu_checkpointing: the checkpoints on the host
    out += launch.offload_problems(t, allowed, (("params", "grads", "optimizer"), "--zero 3 with --offload "
                                                "optimizer=F (a fraction) or params=1 (all of them)"))
    return out


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The ds_config of a training declaration (InvalidInput, one sentence, for what DeepSpeed cannot run)."""
    t = launch.training(doc, "deepspeed", base_dir)
    launch.refuse("deepspeed", _problems(t))
    s, ex, notes = t.s, t.execution, launch.layout_notes(t, "DeepSpeed AutoTP")
    cfg: dict[str, Any] = {"train_batch_size": t.global_batch, "train_micro_batch_size_per_gpu": s.micro_batch,
                           "gradient_accumulation_steps": t.micro_batches}
    if t.dtype in ("bf16", "fp16"):
        cfg[t.dtype] = {"enabled": True}
    zero: dict[str, Any] = {"stage": s.zero}
    if s.zero:
        zero.update(overlap_comm=bool(ex.overlap_grad_reduce), contiguous_gradients=True)
    opt = t.offload("optimizer")
    if opt:
        zero["offload_optimizer"] = {"device": "cpu", **({"ratio": opt} if opt < 1 else {})}
        if t.offload("grads") < 1 and s.zero < 3:
            notes.append("ZeRO-Offload keeps the gradients on the host with the optimizer states (the plan keeps "
                         "them in HBM)")
    if t.offload("params"):
        zero["offload_param"] = {"device": "cpu"}
    cfg["zero_optimization"] = zero
    if s.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": t.offload("activations") == 1.0,
                                           "number_checkpoints": t.layers}
        notes.append("DeepSpeed's activation_checkpointing configures the checkpointed calls; the model makes one "
                     "per layer (gradient_checkpointing_enable() for a Hugging Face model)")
    if s.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
    if s.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": s.ep, "expert_tensor_parallel_size": s.expert_tp}
        if launch.flex_exchange(t):
            if why := launch.deepep_refused(t):
                notes.append(launch.alltoall_note("DeepSpeed", why))
            else:  # AutoEP's DeepEP transport, its buffers sized for a rank's micro-batch
                cfg["expert_parallel"].update(comm_backend="deepep",
                                              comm_max_tokens_per_rank=s.micro_batch * t.seq_len)
    return launch.Written(config=cfg, notes=tuple(notes))


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    """The JSON file (JSON has no comments: `export --json` adds the notes)."""
    return json.dumps(written(doc, base_dir).config, indent=2) + "\n"
