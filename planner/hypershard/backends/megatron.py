"""Exporter to Megatron-LM command-line arguments (NeMo and MindSpeed-LLM take the same): a torchrun line.

The flags are those of Megatron-LM's own parser at core_v0.16.1
(megatron/training/arguments.py, commit 55ac708; tests/data/megatron_arguments.json
pins each one with its type and choices), the release the megatron-core wheel on
PyPI matches:

- degrees: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --context-parallel-size, --expert-model-parallel-size and
  --expert-tensor-parallel-size (MoE folding: experts on etp x ep x edp over a
  stage's tp x cp x dp ranks, as the declaration folds them), --sequence-parallel;
- the pipeline: interleaved chunks by --num-layers-per-virtual-pipeline-stage
  when chunks are equal; unequal ones by --decoder-first/last-pipeline-num-layers
  when only the first and last stage differ (and hold a layer), else by
  --pipeline-model-parallel-layout ("Et*20|t*20|...L", chunk c = the c-th
  entry, on stage c mod pp, as Megatron flattens it; "E|t|...|t|L" for a
  first and last chunk of the embedding and the loss alone, the split
  Megatron-Bridge's account_for_embedding/loss_in_pipeline_split make);
- multi-token prediction (a zoo DeepSeek-V3 with mtp_layers): --mtp-num-layers,
  and with a pipeline the layout, whose last chunk holds them ('m');
- recompute: full = --recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1 (every layer), the first k layers of each chunk =
  method block with k (Megatron's block method counts per model chunk),
  selective = granularity selective with the stack's --recompute-modules;
- ZeRO-1 = --use-distributed-optimizer; ZeRO-2/3 = Megatron-FSDP
  (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads /
  optim_grads_params, which asks --ckpt-format fsdp_dtensor);
- the stack's overlaps (--overlap-grad-reduce, --overlap-param-gather,
  --tp-comm-overlap with SP, --overlap-moe-expert-parallel-comm), its MoE
  dispatcher, FP8 (--fp8-format, --fp8-recipe, --fp8-param-gather), bf16/fp16;
- optimizer offload: --optimizer-cpu-offload --optimizer-offload-fraction f
  (with --use-precision-aware-optimizer, which validate_args asks for, and
  the distributed optimizer it needs: ZeRO-1, or one data-parallel rank);
  activation offload: Transformer Engine's CPU offload of whole layers'
  activations, --cpu-offloading-num-layers n (the fewest layers that hold the
  plan's fraction), with one pipeline stage and no recomputation;
- the stack's CUDA graphs (`megatron_graphs`): --cuda-graph-impl local
  --cuda-graph-scope full_iteration, or transformer_engine with the layer
  modules it names; what megatron-core 0.16.1 refuses or cannot capture is
  refused.

Megatron-LM cannot run: stages of different tensor widths, a GPipe schedule,
offloaded parameters or gradients, activations offloaded beside a pipeline or
recomputation, selective
recompute beside full recompute of some layers, another stack's selective set.
Those are refused in one sentence before anything is written.
"""

from __future__ import annotations

import math
import shlex
from typing import Any, Mapping

from planner.costing.moe_pairing import delays_wgrad, unpaired_why
from planner.hypershard.backends import launch, megatron_graphs

SUFFIX = ".sh"
#: Where the flag names come from (tests/data/megatron_arguments.json pins them).
SOURCE = "NVIDIA/Megatron-LM core_v0.16.1 (55ac7082) megatron/training/arguments.py"
#: The stack's FP8 recipe -> Megatron-LM's --fp8-recipe (per-tensor current scaling is its "tensorwise").
FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise", "tensorwise": "tensorwise", "mxfp8": "mxfp8",
               "blockwise": "blockwise"}
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def _problems(t: launch.Training, doc: Mapping[str, Any]) -> list[launch.Problem]:
    s, ex = t.s, t.execution
    out = launch.common_problems(t, "1F1B and interleaved 1F1B", mtp=True, graphs=True)
    allowed = ({"optimizer": "fraction"} if s.zero == 1 or s.dp * s.cp == 1 else {}) | {"activations": "fraction"}
    out += launch.offload_problems(t, allowed, (
        ("params", "grads", "optimizer"), "--zero 1 --offload optimizer=F (Megatron-LM offloads a fraction of the "
                                          "distributed optimizer's states)"))
    if t.offload("activations") > 0 and (why := _activation_offload_refused(t)):
        out.append((f"activations offload ({t.offload('activations'):.0%}) {why}", "plan with --no-offload"))
    if s.recompute == "selective" and s.full_recompute_layers:
        out.append((f"full recompute of the first {s.full_recompute_layers} layers of each chunk beside selective "
                    "recompute of the rest (one --recompute-granularity)",
                    "plan with --recompute full, selective or none"))
    if s.recompute == "selective" and ex.selective != "modules":
        out.append((f"selective recompute as the {ex.name} stack defines it ({ex.selective})",
                    "plan with --stack megatron-core"))
    if t.dtype == "fp8" and ex.fp8_recipe not in FP8_RECIPES:
        out.append((f"FP8 recipe {ex.fp8_recipe!r}", f"use a stack whose fp8_recipe is one of {', '.join(FP8_RECIPES)}"))
    elif t.dtype == "fp8" and _fp8_params(t) and t.offload("optimizer") and FP8_RECIPES[ex.fp8_recipe] != "delayed":
        out.append((f"FP8 weights with optimizer offload under the {ex.fp8_recipe} recipe (Megatron-LM offloads them "
                    "only with --fp8-recipe delayed)", "plan with --no-offload or a stack with fp8_params = false"))
    out += megatron_graphs.problems(t)
    mtp = t.mtp  # Megatron-LM builds them beside the decoder layers (--mtp-num-layers), last
    if mtp and s.pp > 1 and t.chunks[-1] < mtp:
        out.append((f"{mtp} MTP layers over more than the last pipeline chunk (Megatron-Core keeps them all in the "
                    "last virtual stage of the last stage)", f"plan with stage_layers whose last entry is at least {mtp}"))
    return out + launch.ends_problem(t, doc)


def _fp8_params(t: launch.Training) -> bool:
    """FP8 weights (the stack's fp8_params): --fp8-param-gather, which needs sharded optimizer states."""
    return t.execution.fp8_params and t.s.zero > 0 and t.s.dp * t.s.cp > 1


def _pipeline(t: launch.Training) -> list[tuple[str, Any]]:
    s, chunks = t.s, t.chunks
    if s.pp == 1:
        return []
    if t.mtp:  # where the MTP layers go is said only by a layout ('m'); else Megatron-LM puts them last itself
        return [("--pipeline-model-parallel-layout", _layout(chunks, t.mtp))]
    if t.equal_chunks:
        return [("--num-layers-per-virtual-pipeline-stage", chunks[0])] if s.vpp > 1 else []
    middle = chunks[1:-1]
    if s.vpp == 1 and len(set(middle)) <= 1 and min(chunks) > 0:  # a chunk of no decoder layer: only a layout
        return [("--decoder-first-pipeline-num-layers", chunks[0]), ("--decoder-last-pipeline-num-layers", chunks[-1])]
    return [("--pipeline-model-parallel-layout", _layout(chunks, 0))]


def _layout(chunks: tuple[int, ...], mtp: int) -> str:
    """Megatron-LM's layout string: per chunk its decoder layers ('t', 't*n') and MTP layers ('m', the model's last
    `mtp` layers), 'E' before the first and 'L' (the loss) after the last, chunks joined by '|'."""
    if len(chunks) < 2:  # internal invariant: a layout is written for a pipeline only
        raise AssertionError("a pipeline layout needs at least two chunks")
    first_mtp, parts, at = sum(chunks) - mtp, [], 0
    for n in chunks:
        dec = max(0, min(n, first_mtp - at))
        parts.append(("t*%d" % dec if dec > 1 else "t" * dec) + "m" * (n - dec))
        at += n
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def offloaded_layers(t: launch.Training) -> int:
    """The decoder layers whose activations megatron-core's layer-level offload moves to the host for the plan's
    fraction of them: the fewest that hold it (the layers alike), so the plan's memory holds."""
    layers = t.layers - t.mtp
    return math.ceil(t.offload("activations") * layers - 1e-9)


def _activation_offload_refused(t: launch.Training) -> str:
    """Why megatron-core 0.16.1 cannot offload the plan's activations layer by layer (`--cpu-offloading-num-layers`,
    TransformerConfig.__post_init__: fewer layers than the model's, no pipeline, no recomputation, no CUDA graphs),
    or ""."""
    s = t.s
    if s.pp > 1:
        return "beside a pipeline (megatron-core offloads activations only with one stage)"
    if s.recompute != "none" or s.full_recompute_layers:
        return "beside recomputation (megatron-core offloads activations only without it)"
    if t.execution.cuda_graphs:
        return "beside CUDA graphs (megatron-core captures none with it)"
    if offloaded_layers(t) >= t.layers - t.mtp:
        return "of every layer (megatron-core keeps at least the last layer's on the device)"
    return ""


def _recompute(t: launch.Training) -> list[tuple[str, Any]]:
    s = t.s
    if s.recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if s.full_recompute_layers:
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", s.full_recompute_layers)]
    if s.recompute == "selective":
        return [("--recompute-granularity", "selective"), ("--recompute-modules", list(t.execution.recompute_modules))]
    return []


def _optimizer(t: launch.Training) -> list[tuple[str, Any]]:
    s, ex, out = t.s, t.execution, []
    sharded, frac = s.zero and s.dp * s.cp > 1, t.offload("optimizer")
    if (sharded and s.zero == 1) or (frac > 0 and s.dp * s.cp == 1):  # offload needs it, over one rank too
        out.append(("--use-distributed-optimizer", None))
    elif sharded:
        out += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", _SHARDING[s.zero]),
                ("--ckpt-format", "fsdp_dtensor")]
    if ex.overlap_grad_reduce and s.dp * s.cp > 1:
        out.append(("--overlap-grad-reduce", None))
        if ex.overlap_param_gather and sharded:
            out.append(("--overlap-param-gather", None))
    if frac > 0:
        out += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", frac),
                ("--use-precision-aware-optimizer", None)]
    if t.offload("activations") > 0:  # Transformer Engine's CPU offload of whole layers' activations
        out.append(("--cpu-offloading-num-layers", offloaded_layers(t)))
    return out


def _precision(t: launch.Training) -> list[tuple[str, Any]]:
    s, ex = t.s, t.execution
    out: list[tuple[str, Any]] = [("--fp16", None)] if t.dtype == "fp16" else [("--bf16", None)] if t.dtype in (
        "bf16", "fp8") else []
    if t.dtype == "fp8":
        recipe = FP8_RECIPES[ex.fp8_recipe]
        out += [("--fp8-format", "e4m3" if recipe in ("mxfp8", "blockwise") else "hybrid"), ("--fp8-recipe", recipe)]
        if _fp8_params(t):
            out.append(("--fp8-param-gather", None))
    return out


#: The stack's fused loss kernel -> Megatron-LM's --cross-entropy-fusion-impl (`planner.costing.loss`; "megatron",
#: the unfused one, is Megatron-LM's default and needs no flag).
LOSS_IMPL = {"te": "te", "megatron_fused": "native"}


def _loss(t: launch.Training) -> list[tuple[str, Any]]:
    impl = LOSS_IMPL.get(t.execution.loss_kernel)
    return [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", impl)] if impl else []


def flex_backend(t: launch.Training) -> str:
    """The flex dispatcher's backend: DeepEP (Megatron-Core's default) within 8-GPU NVLink nodes, HybridEP where
    one NVLink domain spans several nodes (GB200/GB300 NVL72): "only hybridep supports the MNNVL case"
    (TransformerConfig.moe_flex_dispatcher_backend), and Megatron-Bridge refuses DeepEP on those GPUs
    (training/flex_dispatcher_backend.py, validate_flex_dispatcher_backend, v0.6.0)."""
    return "hybridep" if t.scale_up > 8 else "deepep"


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The Megatron-LM arguments of a training declaration, as (flag, value) pairs (None: a switch), with the
    environment validate_args asks for and notes (InvalidInput, one sentence, for what it cannot express)."""
    t = launch.training(doc, "megatron", base_dir)
    launch.refuse("megatron", _problems(t, doc))
    s, ex, mtp = t.s, t.execution, t.mtp
    args: list[tuple[str, Any]] = [("--tensor-model-parallel-size", s.tp), ("--pipeline-model-parallel-size", s.pp)]
    args += _pipeline(t)
    if mtp:
        args.append(("--mtp-num-layers", mtp))
    if s.cp > 1:
        args.append(("--context-parallel-size", s.cp))
    if t.moe:
        args += [("--expert-model-parallel-size", s.ep), ("--expert-tensor-parallel-size", s.expert_tp)]
        if s.ep > 1:
            args.append(("--moe-token-dispatcher-type", "flex" if ex.moe_dispatcher == "deepep" else "alltoall"))
            if ex.moe_dispatcher == "deepep":
                args.append(("--moe-flex-dispatcher-backend", flex_backend(t)))
            if unpaired_why(s, ex, mtp) is None:  # weight gradients delayed, except under Megatron-FSDP (moe_pairing)
                args.append(("--overlap-moe-expert-parallel-comm", None))
                if delays_wgrad(s):
                    args.append(("--delay-wgrad-compute", None))
    if s.sp:
        args.append(("--sequence-parallel", None))
        if ex.overlap_tp_comm:
            args.append(("--tp-comm-overlap", None))
    args += _recompute(t)
    args += [("--micro-batch-size", s.micro_batch), ("--global-batch-size", t.global_batch),
             ("--seq-length", t.seq_len)]
    args += _optimizer(t) + _precision(t) + _loss(t) + megatron_graphs.flags(t)
    fsdp = s.zero >= 2 and s.dp * s.cp > 1
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (s.tp > 1 or s.cp > 1) and not fsdp else {}
    env |= megatron_graphs.env(t)
    notes = launch.layout_notes(t, "Megatron-LM") + megatron_graphs.notes(t)
    left_off = unpaired_why(s, ex, mtp) if t.moe and ex.overlap_ep_comm else None
    if left_off:
        notes.append(f"the stack's 1F1B expert all-to-all overlap is left off, as the estimate costs it: Megatron-Core "
                     f"runs it only where its config allows ({left_off})")
    if ex.loss_kernel not in LOSS_IMPL and ex.loss_kernel != "megatron":
        notes.append(f"the stack costs the loss as {ex.loss_kernel!r}; Megatron-LM runs its own vocab-parallel cross "
                     f"entropy (unfused here), which moves more bytes than that on a large vocabulary")
    if ex.fp8_params and t.dtype == "fp8" and not _fp8_params(t):
        notes.append("the stack keeps FP8 weights, which Megatron-LM's --fp8-param-gather does only with a "
                     "distributed optimizer or Megatron-FSDP (this plan has neither)")
    frac = t.offload("activations")
    if frac > 0 and (moved := offloaded_layers(t) / (t.layers - mtp)) > frac + 1e-9:
        notes.append(f"megatron-core offloads whole layers' activations: {offloaded_layers(t)} of {t.layers - mtp} "
                     f"layers ({moved:.0%}) where the plan offloads {frac:.0%}, so a step moves about "
                     f"{moved / frac:.2f}x the host traffic the estimate scored")
    return launch.Written(config={"env": env, "args": argv(args), "layers": t.layers - mtp}, notes=tuple(notes))


def argv(args: list[tuple[str, Any]]) -> list[str]:
    """(flag, value) pairs as command-line words: a switch alone, a list as several words."""
    out: list[str] = []
    for flag, value in args:
        out.append(flag)
        if isinstance(value, list):
            out += [str(v) for v in value]
        elif value is not None:
            out.append(str(value))
    return out


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    """A shell snippet: the header, the environment, and one torchrun command line with the arguments after the
    user's own (MODEL_ARGS, DATA_ARGS: model, tokenizer, data and optimizer arguments, as in Megatron-LM's
    examples/)."""
    w = written(doc, base_dir)
    t = launch.training(doc, "megatron", base_dir)
    node = launch.node_size(doc, base_dir)
    lines = [f"# {line}" for line in launch.header(t, "Megatron-LM / NeMo / MindSpeed-LLM arguments")]
    mtp = t.mtp
    lines.append(f"# Flags of {SOURCE}; for a model of {w.config['layers']} decoder layers"
                 + (f" and {mtp} MTP layer{'s' if mtp > 1 else ''}" if mtp else "") + ". MODEL_ARGS and DATA_ARGS "
                 "are yours (model shape, tokenizer, data, optimizer).")
    lines += [f"# Note: {n}." for n in w.notes]
    lines += [f"export {k}={shlex.quote(v)}  # validate_args asks for it with TP or CP (before Blackwell)"
              for k, v in w.config["env"].items()]
    if node and t.devices % node == 0:
        launcher = f"torchrun --nnodes {t.devices // node} --nproc-per-node {node}"
    else:
        lines.append(f"# {t.devices} devices in all: set --nnodes and --nproc-per-node to your nodes")
        launcher = "torchrun"
    words, body, i = w.config["args"], [], 0
    while i < len(words):
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        body.append("    " + " ".join(shlex.quote(x) for x in words[i:j]))
        i = j
    lines.append(f'{launcher} pretrain_gpt.py "${{MODEL_ARGS[@]}}" "${{DATA_ARGS[@]}}" \\')
    lines += [b + " \\" for b in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"
