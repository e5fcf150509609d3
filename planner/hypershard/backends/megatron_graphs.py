"""A stack's CUDA graphs (`Execution.cuda_graphs`) as Megatron-LM core_v0.16.1 takes them, and what it cannot run.

The flags are --cuda-graph-impl and --cuda-graph-scope (megatron/training/arguments.py: the full iteration by
the "local" implementation, a layer's modules by "transformer_engine"). What megatron-core 0.16.1 refuses or cannot
capture is refused before anything is written, each rule from its source:

- a full-iteration graph of a MoE model: the token dispatcher copies its split sizes to the host and waits on them
  every step (moe/token_dispatcher.py, `_maybe_dtoh_and_synchronize`), which a graph cannot capture (Megatron-Bridge
  runs such recipes only with padded experts and paged stashing, a later Megatron-Core's);
- per-layer graphs beside full recompute ("full recompute is only supported with full iteration CUDA graph",
  TransformerConfig.__post_init__), the whole MoE block of a dropless MoE ("moe cuda graph is only supported with
  drop-padding MoE"), dense-MLP graphs where every layer is MoE (this export writes no --moe-layer-freq), the router's
  graph beside selective recompute of the MoE block, and MoE modules on a model without MoE layers.

Graphed recompute takes no dropout (same __post_init__): a note says which dropout MODEL_ARGS must set to 0.
"""

from __future__ import annotations

from typing import Any

from planner.hypershard.backends import launch


def flags(t: launch.Training) -> list[tuple[str, Any]]:
    """--cuda-graph-impl and --cuda-graph-scope, and what validate_args asks beside a full-iteration graph (no NaN
    check of the loss)."""
    scopes = t.execution.cuda_graphs
    if not scopes:
        return []
    if "full_iteration" in scopes:
        return [("--cuda-graph-impl", "local"), ("--cuda-graph-scope", ["full_iteration"]),
                ("--no-check-for-nan-in-loss-and-grad", None)]
    return [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", list(scopes))]


def env(t: launch.Training) -> dict[str, str]:
    """Transformer Engine's graphs with PyTorch's expandable segments need NCCL's graph registration off
    (validate_args asserts it): set, whatever allocator the user's environment picks."""
    scopes = t.execution.cuda_graphs
    return {"NCCL_GRAPH_REGISTER": "0"} if scopes and "full_iteration" not in scopes else {}


def problems(t: launch.Training) -> list[launch.Problem]:
    """The graphs megatron-core 0.16.1 refuses or cannot capture for this plan (see the module docstring)."""
    scopes, s, ex = t.execution.cuda_graphs, t.s, t.execution
    if not scopes:
        return []
    fix = "plan with a stack whose cuda_graphs leaves them out"
    out: list[launch.Problem] = []
    if "full_iteration" in scopes and t.moe:
        out.append(("a full-iteration CUDA graph of a MoE model (megatron-core 0.16.1's token dispatcher syncs the "
                    "host every step)", "plan with per-layer cuda_graphs such as [\"attn\", \"moe_router\"]"))
    if "full_iteration" not in scopes and (s.recompute == "full" or s.full_recompute_layers):
        out.append(("per-layer CUDA graphs beside full recompute (megatron-core recomputes whole layers only under a "
                    "full-iteration graph)", "plan with --recompute selective or none"))
    moe_scopes = [m for m in scopes if m.startswith("moe")]
    if moe_scopes and not t.moe:
        out.append((f"CUDA graphs of MoE modules ({', '.join(moe_scopes)}) on a model without MoE layers", fix))
    if t.moe and "moe" in scopes:
        out.append(("CUDA graphs of a dropless MoE block (megatron-core captures it only with padded expert "
                    "capacity)", fix))
    if t.moe and "mlp" in scopes:
        out.append(("CUDA graphs of dense MLPs where every layer is MoE", fix))
    if "moe_router" in scopes and s.recompute == "selective" and "moe" in ex.recompute_modules:
        out.append(("CUDA graphs of the MoE router beside selective recompute of the MoE block",
                    "plan with a stack whose recompute_modules leaves out moe"))
    return out


def notes(t: launch.Training) -> list[str]:
    """Dropout the graphed recompute needs at 0, which MODEL_ARGS set (Megatron-LM's default is 0.1)."""
    scopes, s, ex = t.execution.cuda_graphs, t.s, t.execution
    if not scopes or s.recompute != "selective":
        return []
    whole = "full_iteration" in scopes
    out = []
    if "core_attn" in ex.recompute_modules and (whole or "attn" in scopes):
        out.append("graphed attention recompute takes no dropout: MODEL_ARGS must give --attention-dropout 0 "
                   "(megatron-core refuses the graphs otherwise)")
    if any(m in ex.recompute_modules for m in ("mlp", "moe")) and (whole or {"mlp", "moe"} & set(scopes)):
        out.append("graphed MLP recompute takes no dropout: MODEL_ARGS must give --hidden-dropout 0 "
                   "(megatron-core refuses the graphs otherwise)")
    return out


__all__ = ["env", "flags", "notes", "problems"]
