"""What an estimate rests on, in one sentence each: unfitted hardware, assumed kernels and overlaps, ops no
rule costs, and a job whose scale suggests it was mistyped. Every estimate and plan carries them."""

from __future__ import annotations

import re

from typing import Any

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


def attention_assumed(basis: str, kernel: str) -> str:
    """What a preset's attention basis assumes for `kernel`: the whole basis when it opens with "ASSUMPTION", the
    "ASSUMPTION (kernel, ...): ..." clause naming it, or "" (measured)."""
    if basis.startswith("ASSUMPTION"):
        return basis.removeprefix("ASSUMPTION").lstrip(": ")
    for m in re.finditer(r"ASSUMPTION \(([^)]*)\):?\s*([^;]*)", basis):
        if kernel in {k.strip() for k in m.group(1).split(",")}:
            return m.group(2).strip()
    return ""


def assumptions(hw: Any, workload: Any) -> list[str]:
    """What the figures rest on that no measurement of this hardware and stack has checked."""
    out = []
    if not hw.fitted:
        out.append(f"{hw.name}: {hw.calibration or 'efficiency not fitted to any measured run'}")
    else:
        unused = "matmul_plateau" if workload.dtype == "fp8" else "fp8_matmul_plateau"
        kept = [k for k in hw.not_fitted if k != unused]
        if kept:
            why = hw.calibration.split("ASSUMPTION:", 1)[1].strip() if "ASSUMPTION:" in hw.calibration else ""
            out.append(f"{hw.name}: {', '.join(kept)} not fitted on this hardware's runs (kept from its file"
                       + (f"; {why})" if why else ")"))
    ex = workload.execution
    if ex.attention == "flash" and hw.attention_plateaus:
        used = hw.attention_plateau(ex.attention_kernel)[2]  # the kernel whose figures are used (maybe a fallback)
        if workload.mode == "train" and used != ex.attention_kernel:
            out.append(f"{hw.name} lists no {ex.attention_kernel} attention efficiency; {used}'s is used")
        said = attention_assumed(hw.attention_basis, used)
        if said:
            out.append(f"{hw.name}'s flash attention efficiency ({used}): {said}")
    if workload.mode == "train" and ex.overlap_ep_comm:
        out.append("the 1F1B all-to-all overlap pairs two micro-batches' MoE layers as Megatron-Core's schedule does, "
                   "taking them as alike, each backward as half data and half weight gradient, and the host's waits "
                   "as none (DeepSeek-V3 on 1,024 H100s comes out 20 % fast with it)")
    if ex.allocator_reserve == 0.0:
        out.append(f"the {ex.name} stack keeps no caching-allocator reserve: its tensors may fill HBM (no measured "
                   "peak memory of it has fitted one; `hyperplan calibrate` reports the reserve runs with one give)")
    if workload.mode == "train" and ex.moe_routing == "learned":
        out.append(f"a learned router's expert loads spread with coefficient of variation {ex.moe_expert_load_cv:g} "
                   "(fitted on Qwen3-235B's dropless runs on 256 H100s; for another model or router, an assumption)")
    return out


__all__ = ["LONG_STEP_S", "assumptions", "check_costed", "scale_warnings", "uncosted_note"]
