"""Exporter to a MindFormers YAML: the parallel, recompute, swap, batch and MindSpore-context sections of a run config.

Keys are those MindFormers' config template checks (mindformers/tools/register/template.py
at mindspore-ai/mindformers@167a50d, pinned in tests/data/mindformers_config.json) and
the model_config keys its Megatron-Core-style models map
(parallel_core/transformer_config_utils.py); the `parallel` section is passed to
MindSpore's set_auto_parallel_context (its parallel_optimizer_config and
pipeline_config keys are MindSpore 2.10's):

- parallel_config: data_parallel, model_parallel, context_parallel,
  expert_parallel, pipeline_stage, micro_batch_num (with a pipeline),
  use_seq_parallel, vocab_emb_dp (True only when the declaration keeps the
  embedding whole over tp; else MindFormers splits it by vocabulary);
- model.model_config: seq_length, compute_dtype, and for a pipeline of unequal
  chunks `offset` (MindFormers' LayerSetting gives chunk (i, j) num_layers //
  (pp x vpp) + offset[i][j] layers: written per chunk, interleave-major as
  chunk c = i x pp + j), pp_interleave_num for interleaved stages;
- moe_config.expert_model_parallel: the expert tensor degree (MindFormers maps
  it to expert_tensor_parallel_size);
- recompute_config.recompute: True, or per stage (and chunk) the number of
  layers recomputed fully; swap_config for all activations offloaded (layer swap);
- runner_config.batch_size (the micro-batch) and gradient_accumulation_steps
  (without a pipeline; with one, micro_batch_num makes the batch: MindFormers'
  global batch = batch_size x data_parallel x micro_batch_num);
- parallel: enable_parallel_optimizer with optimizer_level level1/2/3 for
  ZeRO-1/2/3 (MindSpore's optimizer parallel), pipeline_config.

MindFormers cannot take: stages of different tensor widths, selective
recompute as a stack defines it (its select_recompute names MindSpore ops by
pattern), FP8, fp16 with other dtypes, offload of parameters, gradients,
optimizer states or a fraction of activations.
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from planner.hypershard.backends import launch

SUFFIX = ".yaml"
SOURCE = "mindspore-ai/mindformers@167a50d mindformers/tools/register/template.py"
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _problems(t: launch.Training, doc: Mapping[str, Any]) -> list[launch.Problem]:
    s = t.s
    out = launch.common_problems(t, "1F1B and GPipe")
    if s.recompute == "selective":
        ex = t.execution
        what = ", ".join(ex.recompute_modules) if ex.selective == "modules" else ex.selective.replace("_", " ")
        out.append((f"selective recompute (the {ex.name} stack's: {what}; MindFormers' select_recompute names "
                    "MindSpore ops by pattern)", "plan with --recompute full or none"))
    if t.dtype == "fp8":
        out.append(("FP8 GEMMs", "plan with --dtype bf16"))
    if s.pp > 1 and min(t.chunks) < 1:
        out.append(("pipeline chunk of no decoder layer (the embedding or the loss alone), which MindFormers' "
                    "per-stage offsets are not written for here",
                    "plan with --backend mindformers, which keeps a layer in every chunk"))
    out += launch.offload_problems(t, {"activations": "whole"}, (("activations",), "--offload activations=1 "
                                                                   "(MindFormers swaps whole layers' activations)"))
    return out + launch.ends_problem(t, doc)


def _offset(t: launch.Training) -> list[int] | list[list[int]]:
    """Per chunk, its layers less num_layers // (pp x vpp): a list per stage, or one per interleave round."""
    base = t.layers // (t.s.pp * t.s.vpp)
    rows = [[n - base for n in t.chunks[i * t.s.pp:(i + 1) * t.s.pp]] for i in range(t.s.vpp)]
    return rows[0] if t.s.vpp == 1 else rows


def _recompute(t: launch.Training) -> Any:
    s = t.s
    if s.recompute == "full":
        return True
    if s.full_recompute_layers:
        rows = [[min(s.full_recompute_layers, n) for n in t.chunks[i * s.pp:(i + 1) * s.pp]] for i in range(s.vpp)]
        return rows[0] if s.vpp == 1 else rows
    return False


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The YAML's sections as data (InvalidInput, one sentence, for what MindFormers cannot run)."""
    t = launch.training(doc, "mindformers", base_dir)
    launch.refuse("mindformers", _problems(t, doc))
    s, notes = t.s, launch.layout_notes(t, "MindFormers")
    pc: dict[str, Any] = {"data_parallel": s.dp, "model_parallel": s.tp, "context_parallel": s.cp,
                          "pipeline_stage": s.pp, "micro_batch_num": t.micro_batches if s.pp > 1 else 1,
                          "use_seq_parallel": s.sp, "vocab_emb_dp": t.embedding == "whole"}
    if t.moe:
        pc["expert_parallel"] = s.ep
    if s.cp > 1:
        pc["context_parallel_algo"] = "colossalai_cp"  # ring attention over load-balanced chunks
    mc: dict[str, Any] = {"seq_length": t.seq_len, "compute_dtype": _DTYPES[t.dtype]}
    if s.pp > 1 and (not t.equal_chunks or t.layers % (s.pp * s.vpp)):
        mc["offset"] = _offset(t)
    if s.vpp > 1:
        mc["pp_interleave_num"] = s.vpp
    cfg: dict[str, Any] = {"parallel_config": pc, "micro_batch_interleave_num": 1,
                           "model": {"model_config": mc}}
    if t.moe:
        cfg["moe_config"] = {"expert_model_parallel": s.expert_tp}
    cfg["recompute_config"] = {"recompute": _recompute(t), "select_recompute": False}
    if t.offload("activations"):
        cfg["swap_config"] = {"swap": True, "layer_swap": [{"backward_prefetch": 1, "layers": True}]}
    cfg["runner_config"] = {"batch_size": s.micro_batch,
                            "gradient_accumulation_steps": 1 if s.pp > 1 else t.micro_batches}
    par: dict[str, Any] = {"enable_parallel_optimizer": bool(s.zero)}
    if s.zero:
        par["parallel_optimizer_config"] = {"optimizer_level": f"level{s.zero}"}
    if s.pp > 1:
        par["pipeline_config"] = {"pipeline_interleave": s.vpp > 1 or s.schedule == "gpipe",
                                  "pipeline_scheduler": "gpipe" if s.schedule == "gpipe" else "1f1b"}
    if t.moe and s.ep > 1:
        par["enable_alltoall"] = True
    cfg["parallel"] = par
    return launch.Written(config=cfg, notes=tuple(notes))


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    """The YAML, after a header: merge its sections into your MindFormers run config (model, data, optimizer)."""
    w = written(doc, base_dir)
    t = launch.training(doc, "mindformers", base_dir)
    lines = [f"# {line}" for line in launch.header(t, "MindFormers run-config sections")]
    lines.append(f"# Keys of {SOURCE}: merge into your run config (model shape, data, optimizer are yours).")
    lines += [f"# Note: {n}." for n in w.notes]
    body = yaml.safe_dump(w.config, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(lines) + "\n" + body
