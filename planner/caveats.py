"""What an estimate rests on, in one sentence each: unfitted hardware, assumed kernels and overlaps, ops no
rule costs, and a job whose scale suggests it was mistyped. Every estimate and plan carries them."""

from __future__ import annotations

import re
from collections.abc import Iterable

from typing import Any

from cost_models import load_cluster
from cost_models.accuracy import WORDS, unchecked
from cost_models.loader import carries_preset_fit
from cost_models.compute import MEASURED_HEAD_DIM

from planner.costing.execution import attention_fp8_format
from planner.errors import InvalidModel
from planner.graph.ir import Graph


def check_costed(graph: Graph, strict: bool) -> None:
    """With `strict`, refuse a graph that has ops without a FLOP rule (see `uncosted_note`)."""
    if strict and graph.uncosted()["ops"]:
        raise InvalidModel(uncosted_note(graph) + "; drop --strict-ops to plan with them costed that way")


def uncosted_note(graph: Graph) -> str:
    """One sentence on the ops no rule costs: how many, their share of the bytes moved, how they are costed."""
    u = graph.uncosted()
    kinds = ", ".join(f"{op} x{n}" for op, n in list(u["op_types"].items())[:4]) + (
        ", ..." if len(u["op_types"]) > 4 else "")
    return (f"{u['ops']} of {len(graph.nodes)} ops ({100 * u['op_share']:.1f}%; {100 * u['byte_share']:.1f}% of the "
            f"bytes moved) have no FLOP rule ({kinds}): they are costed by the bytes they move, as memory-bound ops")


#: A training step longer than this is outside anything published (the longest shipped run, Qwen3-235B at 128K
#: tokens, takes 248 s): the figures hold, but the job is most likely not the one meant.
LONG_STEP_S = 3600.0


def scale_warnings(step_time_s: float, microbatches: int, mode: str) -> list[str]:
    """What in an estimate's scale suggests the job was mistyped (a step of hours), in one sentence each."""
    from planner.units import seconds

    if mode != "train" or step_time_s <= LONG_STEP_S:
        return []
    return [f"one step takes {seconds(step_time_s)} ({microbatches:,} micro-batches per replica), far beyond the "
            "seconds to minutes of published training steps: --global-batch counts sequences per step"]


def stack_warnings(strategy, workload) -> list[str]:
    """Where a given training strategy runs otherwise than its stack's framework can (`Execution.recompute_policies`,
    `full_layers_beside`, `sequence_parallel`), in one sentence each: the estimate is of a step it cannot launch."""
    ex, s = workload.execution, strategy
    if workload.mode != "train":
        return []
    out = []
    partial = s.full_recompute_layers and s.recompute != "full"
    if partial and s.recompute != ex.full_layers_beside:
        how = {"off": "cannot recompute only some layers fully",
               "none": "recomputes some layers fully only where it recomputes nothing of the others",
               "selective": "recomputes some layers fully only beside selective recompute of the others"}
        out.append(f"the {ex.name} stack {how[ex.full_layers_beside]}: this estimate (the first "
                   f"{s.full_recompute_layers} layers of each chunk fully, {s.recompute} for the rest) is of a step "
                   "its framework cannot launch")
    elif s.recompute not in ex.recompute_policies:
        out.append(f"the {ex.name} stack runs {' or '.join(ex.recompute_policies)} recompute, not {s.recompute}: "
                   "this estimate is of a step its framework cannot launch")
    if s.sp and not ex.sequence_parallel:
        out.append(f"the {ex.name} stack runs tensor parallelism without sequence parallelism: this estimate (with "
                   "it) is of a step its framework cannot launch")
    return out


#: The clause of a preset's attention basis that says how heads narrower than 128 are costed ("ASSUMPTION (head dims
#: under 128): ...").
NARROW_HEADS = "head dims under 128"
WIDE_HEADS = "heads wider than 128"
#: What cuDNN measured of such heads on other devices (NVIDIA/cudnn-frontend sdpa_benchmark_training).
UNMEASURED = {NARROW_HEADS: "cuDNN runs head dim 64 at 0.75x of it forward on H200",
              WIDE_HEADS: "cuDNN runs MLA's 192/128 heads at 0.88x of it backward on H200, 0.90x on GB200"}


def attention_assumed(basis: str, kernel: str) -> str:
    """What a preset's attention basis assumes for `kernel` (or for `NARROW_HEADS`): the "ASSUMPTION (kernel, ...):
    ..." clause naming it, else, for a kernel, the basis up to its first such clause when it opens with
    "ASSUMPTION", else "" (measured)."""
    for m in re.finditer(r"ASSUMPTION \(([^)]*)\):?\s*([^;]*)", basis):
        if kernel in {k.strip() for k in m.group(1).split(",")}:
            return m.group(2).strip()
    if basis.startswith("ASSUMPTION") and kernel not in (NARROW_HEADS, WIDE_HEADS):
        return re.split(r";\s*ASSUMPTION \(", basis)[0].removeprefix("ASSUMPTION").lstrip(": ")
    return ""


#: Parameters a serving step does not use: it pays no host overhead (engines replay CUDA graphs) and charges its
#: communication without overlap credit (planner.inference.phase_cost).
TRAINING_ONLY = ("host_overhead_us", "overlap")


def hardware_assumptions(hw: Any, dtype: str, serving: bool = False) -> list[str]:
    """What this hardware's efficiency figures rest on that none of its own measured runs has checked (of a
    serving step's figures, with `serving`)."""
    if not hw.fitted:
        return [f"{hw.name}: {hw.calibration or 'efficiency not fitted to any measured run'}"]
    unused = ("matmul_plateau" if dtype == "fp8" else "fp8_matmul_plateau",) + (TRAINING_ONLY if serving else ())
    kept = [k for k in hw.not_fitted if k not in unused]
    if not kept:
        return []
    why = hw.calibration.split("ASSUMPTION:", 1)[1].strip() if "ASSUMPTION:" in hw.calibration else ""
    return [f"{hw.name}: {', '.join(kept)} not fitted on this hardware's runs (kept from its file"
            + (f"; {why})" if why else ")")]


def attention_assumptions(hw: Any, kernel: str, fallback: bool = True) -> list[str]:
    """What the flash-attention figures used for `kernel` assume: (with `fallback`) that another kernel's stand
    in, and the preset's own assumption clause for the kernel used."""
    used = hw.attention_plateau(kernel)[2]  # the kernel whose figures are used (maybe a fallback)
    out = [f"{hw.name} lists no {kernel} attention efficiency; {used}'s is used"] if fallback and used != kernel \
        else []
    said = attention_assumed(hw.attention_basis, used)
    if said:
        out.append(f"{hw.name}'s flash attention efficiency ({used}): {said}")
    return out


def head_dim_assumptions(hw: Any, head_dims: Iterable[float]) -> list[str]:
    """What the attention figures assume for heads narrower or wider than the head dim 128 they were measured at:
    that they run at its rate, on a device without the head-dim law or a measured wide-head rate
    (`cost_models.compute.head_dim_factor`), or what the preset's basis says of them."""
    dims = sorted({float(d) for d in head_dims if d > 0 and d != MEASURED_HEAD_DIM})
    narrow = [d for d in dims if d < MEASURED_HEAD_DIM]
    wide = [d for d in dims if d > MEASURED_HEAD_DIM]
    out = []
    for group, kind, law in ((NARROW_HEADS, narrow, any(hw.attention_half_dims)),
                             (WIDE_HEADS, wide, hw.attention_wide_heads != (1.0, 1.0))):
        if not kind:
            continue
        shown = ", ".join(f"{d:g}" for d in kind)
        if not law:
            side = "below" if group == NARROW_HEADS else "above"
            out.append(f"{hw.name} has no flash-attention figures {side} head dim 128: heads of {shown} are costed at "
                       f"head dim 128's rate ({UNMEASURED[group]}: likely fast)")
        elif said := attention_assumed(hw.attention_basis, group):
            out.append(f"{hw.name}'s flash attention at head dim {shown}: {said}")
    return out


#: What published A/B pairs measured of the overlap (tests/data/overlap_pairs.json; the estimate's savings beside
#: them: benchmarks/bench_overlap_pairs.py, tests/test_overlap_pairs.py).
OVERLAP_PAIRS = ("timed off and on by NVIDIA it saved 14.7 % of Qwen3-30B's step on 16 H100s with HybridEP and the "
                 "router in CUDA graphs (estimated alike), and eagerly 10.7 % of Qwen3-235B's on 256 H100s with DeepEP "
                 "(estimated 21 %) and 24 % of Qwen3-30B's with the alltoall dispatcher (estimated 36 %); on 64 "
                 "B200s it cost Qwen3-235B 7.5 %, 'due to CPU overhead' (estimated to save 7 %): README, The overlap "
                 "against its A/B pairs")

#: The shipped run that checks the 1F1B all-to-all overlap on the scale it was built for (held out).
OVERLAP_WITNESS = "mb2509-deepseek-v3-1024xh100-fp8"


def _witness() -> str:
    """What the overlap's witness run says of it today (`planner/calibration/published_errors.json`)."""
    from planner.calibration.published import error_of

    err = error_of(OVERLAP_WITNESS)
    if err is None:
        return ""
    return (f": DeepSeek-V3 on 1,024 H100s ({OVERLAP_WITNESS}, held out) comes out {abs(100 * err):.0f} % "
            f"{'fast' if err < 0 else 'slow'} with it")


#: FP8 recipes that scale blocks of a tensor (MXFP8's 1x32, DeepSeek's 128x128 / 1x128), costed as per-tensor FP8.
SCALED_BLOCKS = ("mxfp8", "blockwise")


def assumptions(hw: Any, workload: Any, head_dims: Iterable[float] = (), moe: bool = False,
                expert_bias: bool = False, windowed: bool = False, eager_rope: bool = False,
                context_parallel: bool = True) -> list[str]:
    """What the figures rest on that no measurement of this hardware and stack has checked (`head_dims`: the
    model's attention head dims; `moe`: it routes tokens to experts; `expert_bias`: its experts carry an output
    bias the stack adds beside their GEMM; `windowed`: some of its attention is a sliding window; `eager_rope`: the
    stack runs its YaRN-scaled rotary embedding as eager ops; `context_parallel`: the layout may split the
    sequence, False when it is known not to)."""
    out = hardware_assumptions(hw, workload.dtype)
    ex = workload.execution
    if eager_rope:
        out.append(f"the {ex.name} stack runs the model's YaRN-scaled rotary embedding as eager ops (as Megatron-Core "
                   "does for a concentration factor but 1), costed as the graph's own ops, each a kernel, its tables "
                   "once a pass; Megatron's recomputation of them on every call is not charged")
    if workload.mode == "train" and expert_bias:
        out.append(f"the experts' output bias is costed at the {ex.name} stack's {ex.expert_bias_bytes:g} bytes an "
                   f"element of the routed rows forward, {ex.expert_bias_grad_bytes:g} backward (Megatron-Core adds it "
                   "expert by expert through fp32), the loop's per-expert launches not charged")
    if workload.mode == "train" and moe and not ex.whole_step_graph:
        from planner.calibration.bridge_sweep import eager_moe

        evidence = eager_moe()
        per_expert = (f"and, as the {ex.name} stack runs the experts' GEMMs one a local expert, per expert GEMM "
                      "(checked against Transformer Engine's grouped-linear benchmark, not fitted)"
                      if ex.expert_gemm_streams > 0 and "moe" not in ex.cuda_graphs else "as a dense layer's")
        out.append(f"an eager MoE layer's host issue is costed per graph op {per_expert}; the dispatcher's "
                   "preprocessing and its wait for the token counts are not counted (README: every Megatron-Bridge "
                   "row)" + (f"; {evidence}" if evidence else ""))
    if workload.mode == "train" and moe:
        how = ("the flex dispatcher's: a token sent once to each node and rank its experts are on (DeepEP, HybridEP)"
               if ex.moe_dispatcher == "deepep" else "NCCL's all-to-all: every copy of a token sent, a message a peer")
        out.append(f"the expert exchange between expert-parallel ranks is costed as the {ex.name} stack's dispatcher "
                   f"sends it, {how}, at the fabric's bus-efficiency curve, which no exchange measurement has fitted "
                   "(HybridEP's published NVLink rates come to 0.45-0.54 of the link where the curve gives about 0.8: "
                   "benchmarks/CALIBRATION.md, HybridEP's own rates)")
    if ex.attention == "flash" and hw.attention_plateaus:
        out += attention_assumptions(hw, ex.attention_kernel, fallback=workload.mode == "train")
        out += head_dim_assumptions(hw, head_dims)
        if fmt := attention_fp8_format(workload):
            said = attention_assumed(hw.attention_basis, fmt)
            out.append(f"{hw.name}'s flash attention in {fmt} (the stack's fp8_attention): "
                       + (said if said else "measured at head dims 128 and MLA's, causal; the other head dims "
                          "on the 16-bit head-dim law")
                       + ("; a sliding window's backward costed on every causal tile, as cuDNN 9.22's FP8 kernels "
                          "run it" if windowed else ""))
    if workload.mode == "train" and ex.overlap_ep_comm:
        sms = (f"the exchange's kernels as holding {100 * ex.ep_comm_sm_share:.0f} % of the SMs beside it (DeepEP's "
               "20 of an H100's 132; HybridEP's and NCCL's share taken as the same)" if ex.ep_comm_sm_share > 0 else
               "the dispatcher's SMs as free (DeepEP holds 20 of an H100's 132, which NVIDIA's Megatron-Core MoE "
               "report puts at about 20 % of GEMM efficiency on DeepSeek-V3)")
        out.append("the 1F1B all-to-all overlap pairs two micro-batches' MoE layers as Megatron-Core's schedule does, "
                   "taking them as alike, each backward as half data and half weight gradient, "
                   + ("" if ex.whole_step_graph else
                      "each transfer issued once the host has issued the compute before it (an eager step), ")
                   + f"the dispatcher's token-count syncs as free and {sms}" + _witness() + "; " + OVERLAP_PAIRS)
    if workload.dtype == "fp8" and ex.fp8_recipe in SCALED_BLOCKS:
        out.append(f"{ex.fp8_recipe} GEMMs are costed as per-tensor FP8 ones, at the fp8 plateau, their casts at the "
                   f"stack's {ex.fp8_cast_bytes:g} bytes an element: Megatron-Bridge's Llama 3.1 405B on 256 GB200s "
                   "runs 7 % slower in MXFP8 than in per-tensor FP8 on the same TP4·PP16 (benchmarks/CALIBRATION.md: "
                   "GB200's Llama 3 70B)")
    if workload.mode == "train" and ex.cuda_graphs:
        router = {"moe_router", "moe_preprocess"} & set(ex.cuda_graphs)
        out.append(f"the {ex.name} stack replays {', '.join(ex.cuda_graphs)} from CUDA graphs: those kernels are "
                   "costed without the host's issue" + (" (a MoE layer's whole part before its experts, router and "
                                                        "dispatcher preprocessing alike)" if router else ""))
    if workload.mode == "train" and ex.attention == "flash" and context_parallel:
        out.append(f"a layout with context parallelism pays the {ex.name} stack's ring merges beside its attention "
                   "kernels as Transformer Engine's p2p ring runs them (a kernel, an exchange and the merges a step; "
                   "benchmarks/CALIBRATION.md: context parallelism's ring merges)" if ex.cp_merge == "te_p2p" else
                   f"a layout with context parallelism is costed at its attention kernels alone: the {ex.name} "
                   "stack's ring merges beside them are not charged")
    if ex.allocator_reserve == 0.0:
        out.append(f"the {ex.name} stack keeps no caching-allocator reserve: its tensors may fill HBM (no measured "
                   "peak memory of it has fitted one; `hyperplan calibrate` reports the reserve runs with one give)")
    if workload.mode == "train" and ex.moe_routing == "learned":
        out.append(f"a learned router's expert loads spread with coefficient of variation {ex.moe_expert_load_cv:g} "
                   "(fitted on Qwen3-235B's dropless runs on 256 H100s; for another model or router, an assumption)")
    return out


def checked_sentence(hw: Any, category: str) -> tuple[str, str]:
    """What checks `hw`'s estimates of a kind of job: its held-out runs of `category`, or that none does, and then,
    where its figures are another preset's fit (`transferred_from`), what that fit's held-out runs say; with the
    preset it cited ("" if none)."""
    h = hw.checked(category)
    if h is not None:
        return h.sentence(hw.name, carries_preset_fit(hw)), ""  # a user's fit of a preset: its runs are not ours
    from planner.calibration.bridge_sweep import never_fitted

    said = unchecked(hw.name, category)
    source = load_cluster(hw.transferred_from).checked(category) if hw.transferred_from else None
    if source is None:
        swept = never_fitted(hw.name, category) if carries_preset_fit(hw) else ""
        return (f"no held-out {WORDS.get(category, category)} run on {hw.name} among the shipped ones; {swept}"
                if swept else said), ""
    return (f"{said} (its efficiency is {hw.transferred_from}'s fit, with "
            f"{source.sentence(hw.transferred_from, shipped=True)})"), hw.transferred_from


def accuracy(hw: Any, workload: Any, moe: bool, model: str | None = None) -> dict[str, Any] | None:
    """How far off a training estimate on `hw` may be: its held-out runs of the same kind of job (MoE training when
    `moe`, else dense), as its file records them (`cost_models.accuracy`), or that none checks it; and, for a zoo
    `model` as shipped (None: not one, or changed by overrides), its own published runs on `hw`
    (`planner.calibration.published`). None for a serving step (what checks it is the published serving
    deployments: `planner.inference.deployments`)."""
    from planner.calibration import bridge_sweep
    from planner.calibration.published import cited, runs_of

    if workload.mode != "train":
        return None
    category = "moe_training" if moe else "dense_training"
    h = hw.checked(category)
    out: dict[str, Any] = ({"category": category, "runs": 0} if h is None
                           else {"category": category, "runs": h.runs, "mean_abs_error": h.mean,
                                 "max_abs_error": h.max})
    out["sentence"], source = checked_sentence(hw, category)
    if source:
        out["transferred_from"] = source
    model = model if model and carries_preset_fit(hw) else None  # its runs' errors are of the preset's fit
    published = runs_of(model, hw.name) if model else []
    if published:
        out["published"] = [{k: r[k] for k in ("id", "devices", "group", "error")} for r in published]
        out["published_sentence"] = cited(model, hw.name, published)
    swept = bridge_sweep.rows_of(model, hw.name) if model else []
    if swept:
        out["bridge_sweep"] = [{k: r[k] for k in ("id", "micro_batch", "cuda_graphs", "error")} for r in swept]
        out["bridge_sweep_sentence"] = bridge_sweep.cited(model, hw.name, swept)
    return out


__all__ = ["LONG_STEP_S", "accuracy", "assumptions", "attention_assumptions", "check_costed", "checked_sentence",
           "hardware_assumptions",
           "head_dim_assumptions",
           "scale_warnings", "uncosted_note"]
