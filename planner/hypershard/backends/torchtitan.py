"""Exporter to a torchtitan job file: the TOML its ConfigManager reads (`--job.config_file`), torchtitan 0.2.

Field names are torchtitan 0.2.2's JobConfig (torchtitan/config/job_config.py,
pytorch/torchtitan@73a0e69; torchtitan 0.3 reads no TOML: it takes the same
names as --section.field overrides of a Python config). What the file says:

- [parallelism]: data parallelism as FSDP2 over data_parallel_shard_degree
  for ZeRO 1-3 (fsdp_reshard_after_forward "never" for ZeRO-1/2, whose
  weights stay gathered from forward to backward; "default" for ZeRO-3), or
  data_parallel_replicate_degree (DDP) for ZeRO-0; tensor, context, expert
  and expert-tensor degrees (expert_parallel_comm_backend "deepep" where the
  stack's dispatcher is the flex one and the experts have no tensor split,
  which torchtitan's DeepEP path refuses); the pipeline degree, schedule (1F1B,
  Interleaved1F1B, GPipe: names of torch.distributed.pipelining), micro-batch
  and module_fqns_per_model_part: each chunk's modules by torchtitan's names
  (tok_embeddings, layers.N, norm, output, as its Llama 3, Llama 4,
  DeepSeek-V3, Qwen3 and gpt-oss models name them), chunk c on stage c mod
  pp as its looped schedules place it, so unequal chunks are written exactly;
- [activation_checkpoint]: mode none, full, or selective with
  selective_ac_option "op" (torchtitan's op-level policy: every other matmul
  recomputed, the torchtitan stack's selective);
- [training]: local_batch_size (the micro-batch; with a pipeline, a
  replica's batch, or one of its `flushes` schedules' share: torchtitan runs
  global_batch_size / (local_batch_size x dp) schedules per step as
  gradient-accumulation steps; split into pipeline_parallel_microbatch_size),
  global_batch_size, seq_len, mixed_precision_param, enable_cpu_offload (FSDP2
  offload of parameters, gradients and optimizer states together);
- [model] converters and [quantize.linear.float8] for FP8 (tensorwise), and
  [compile] for the fused elementwise kernels the stack assumes.

torchtitan cannot run: stages of different tensor widths, TP without SP,
DDP beside TP/PP/CP, full recompute of only some layers of each chunk,
another stack's selective set, partial or one-class offload, fp16.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from planner.hypershard.backends import launch

SUFFIX = ".toml"
SOURCE = "pytorch/torchtitan v0.2.2 (73a0e69) torchtitan/config/job_config.py"
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
#: The stack's FP8 recipe -> [quantize.linear.float8] recipe_name (torchao's per-tensor scaling is "tensorwise").
FP8_RECIPES = {"tensorwise": "tensorwise", "current": "tensorwise", "rowwise": "rowwise"}
_PRECISION = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


def _problems(t: launch.Training, doc: Mapping[str, Any]) -> list[launch.Problem]:
    s, ex = t.s, t.execution
    out = launch.common_problems(t, "1F1B, Interleaved1F1B and GPipe")
    if s.tp > 1 and not s.sp:
        out.append(("tensor parallelism without sequence parallelism (torchtitan's TP plans split norms by "
                    "sequence)", "declare layouts.sequence_parallel: true"))
    if s.zero == 0 and s.dp > 1 and s.tp * s.pp * s.cp > 1:
        out.append(("unsharded data parallelism beside TP, PP or CP (torchtitan's DDP is one-dimensional)",
                    "plan with --zero 1, 2 or 3"))
    if s.full_recompute_layers and s.recompute != "full":
        out.append((f"full recompute of the first {s.full_recompute_layers} layers of each chunk (torchtitan "
                    "checkpoints every layer or every n-th)", "plan with --recompute full, selective or none"))
    if s.recompute == "selective" and ex.selective != "every_other_matmul":
        out.append((f"selective recompute as the {ex.name} stack defines it ({ex.selective}; torchtitan's op "
                    "policy recomputes every other matmul)", "plan with --stack torchtitan"))
    if t.dtype == "fp16":
        out.append(("fp16 training (torchtitan trains in bf16 or fp32)", "plan with --dtype bf16"))
    if t.dtype == "fp8" and ex.fp8_recipe not in FP8_RECIPES:
        out.append((f"FP8 recipe {ex.fp8_recipe!r}", "plan with --stack torchtitan (float8 tensorwise)"))
    together = s.zero and all(t.offload(c) == 1.0 for c in ("params", "grads", "optimizer"))
    out += launch.offload_problems(t, dict.fromkeys(("params", "grads", "optimizer"), "whole") if together else {}, (
        ("params", "grads", "optimizer"), "--offload params=1 --offload grads=1 --offload optimizer=1 (FSDP2 "
                                          "offloads the three together)"))
    return out + launch.ends_problem(t, doc)


def _fqns(t: launch.Training) -> list[list[str]]:
    """Each pipeline chunk's modules, torchtitan's names: layers.N by decoder order, the embedding first, the final
    norm and output layer last."""
    out, first = [], 0
    for n in t.chunks:
        out.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "output"]
    return out


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The job file's sections as data (InvalidInput, one sentence, for what torchtitan cannot run)."""
    t = launch.training(doc, "torchtitan", base_dir)
    launch.refuse("torchtitan", _problems(t, doc))
    s, ex, notes = t.s, t.execution, launch.layout_notes(t, "torchtitan")
    par: dict[str, Any] = {"data_parallel_replicate_degree": s.dp if s.zero == 0 else 1,
                           "data_parallel_shard_degree": 1 if s.zero == 0 else s.dp}
    if s.zero:
        par["fsdp_reshard_after_forward"] = "default" if s.zero == 3 else "never"
        if s.zero == 1 and s.dp * s.cp > 1:
            notes.append("ZeRO-1 runs as ZeRO-2 here: FSDP2 shards the gradients too (less memory than planned)")
    elif s.cp > 1:
        notes.append("torchtitan shards weights over the context-parallel ranks with FSDP2 (less memory than "
                     "the ZeRO-0 plan)")
    par.update(tensor_parallel_degree=s.tp, context_parallel_degree=s.cp, pipeline_parallel_degree=s.pp)
    if s.pp > 1:
        schedule = "interleaved" if s.vpp > 1 else s.schedule
        if schedule == "1f1b" and t.micro_batches // s.flushes < s.pp:  # micro-batches of one schedule
            # 1F1B with fewer micro-batches than stages runs every forward first (its warm-up is min(stages - stage
            # - 1, micro-batches)): GPipe's order, which torch's Schedule1F1B refuses to run (ValueError)
            schedule = "gpipe"
        par.update(pipeline_parallel_schedule=SCHEDULES[schedule],
                   pipeline_parallel_microbatch_size=s.micro_batch, module_fqns_per_model_part=_fqns(t))
    if t.moe:
        par.update(expert_parallel_degree=s.ep, expert_tensor_parallel_degree=s.expert_tp)
    if launch.flex_exchange(t):
        why = launch.deepep_refused(t) or ("" if s.expert_tp == 1 else "torchtitan 0.2.2 raises NotImplementedError "
                                                                       "for DeepEP beside expert tensor parallelism")
        if why:
            notes.append(launch.alltoall_note("torchtitan", why))
        else:
            par["expert_parallel_comm_backend"] = "deepep"  # its DeepEP dispatch and combine (ep > 1, etp 1)
    ac = {"mode": "full" if s.recompute == "full" else "selective" if s.recompute == "selective" else "none"}
    if ac["mode"] == "selective":
        ac["selective_ac_option"] = "op"
    # with a pipeline, local_batch_size is one schedule's batch; torchtitan runs global / (local x dp) of them per
    # step as gradient-accumulation steps (train.py: gradient_accumulation_steps), `Strategy.flushes`
    training = {"local_batch_size": t.global_batch // (s.dp * s.flushes) if s.pp > 1 else s.micro_batch,
                "global_batch_size": t.global_batch, "seq_len": t.seq_len,
                "mixed_precision_param": _PRECISION[t.dtype]}
    if t.offload("params"):
        training["enable_cpu_offload"] = True
    sections: dict[str, Any] = {"parallelism": par, "activation_checkpoint": ac, "training": training}
    if t.dtype == "fp8":
        gather = bool(ex.fp8_all_gather and s.zero)
        sections["model"] = {"converters": ["quantize.linear.float8"]}
        sections["quantize"] = {"linear": {"float8": {"recipe_name": FP8_RECIPES[ex.fp8_recipe],
                                                      "enable_fsdp_float8_all_gather": gather,
                                                      "precompute_float8_dynamic_scale_for_fsdp": gather}}}
    sections["compile"] = {"enable": bool(ex.fuse_elementwise), "components": ["model", "loss"]}
    return launch.Written(config=sections, notes=tuple(notes))


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v)  # ints, floats, and strings: JSON's escapes are TOML's basic-string escapes


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    """The TOML: a header, then the sections (merge them into a job file of your model, data and optimizer)."""
    w = written(doc, base_dir)
    t = launch.training(doc, "torchtitan", base_dir)
    lines = [f"# {line}" for line in launch.header(t, "torchtitan job sections")]
    lines.append(f"# Fields of {SOURCE}: add [model] name/flavor, [optimizer], [training] dataset/steps of your own, "
                 "then run with --job.config_file.")
    lines += [f"# Note: {n}." for n in w.notes]
    for name, fields in w.config.items():
        lines += _table(name, fields)
    return "\n".join(lines) + "\n"


def _table(name: str, fields: Mapping[str, Any]) -> list[str]:
    """A TOML table and, after its own keys, its sub-tables under dotted names ([quantize.linear.float8])."""
    own = [f"{k} = {_value(v)}" for k, v in fields.items() if not isinstance(v, Mapping)]
    out = ["", f"[{name}]", *own] if own else []
    for k, v in fields.items():
        if isinstance(v, Mapping):
            out += _table(f"{name}.{k}", v)
    return out
