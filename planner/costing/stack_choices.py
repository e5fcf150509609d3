"""The values a stack file's fields may take (`planner.costing.execution`), each with where it comes from.

A stack file names one of these where a field is a choice: the attention kernel family (`attention`), what
selective recompute means (`selective`: Megatron's --recompute-modules, or torchtitan's op policy, which keeps
every other matmul's output), the modules Megatron recomputes (`recompute_modules`), the expert dispatcher
(`moe_dispatcher`: NCCL's all-to-all, or "deepep": the flex dispatcher, DeepEP or HybridEP, a token sent once to
each node and rank its experts are on), how tokens are routed (`moe_routing`), the CUDA graph scopes
(`cuda_graphs`), the FP8 recipe's cast bytes, and what the stack's framework can recompute (`recompute_policies`,
`full_layers_beside`), which bounds the plans `plan` makes for it.
"""

from __future__ import annotations

from typing import Literal

Attention = Literal["flash", "materialized"]
Selective = Literal["modules", "every_other_matmul"]
Dispatcher = Literal["alltoall", "deepep"]
Routing = Literal["uniform", "contiguous", "learned"]
ATTENTION: tuple[str, ...] = ("flash", "materialized")
SELECTIVE: tuple[str, ...] = ("modules", "every_other_matmul")
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj",
                                      "shared_experts")
DISPATCHERS: tuple[str, ...] = ("alltoall", "deepep")
ROUTINGS: tuple[str, ...] = ("uniform", "contiguous", "learned")
#: What a stack may capture in CUDA graphs (Megatron-Core's cuda_graph_impl = "full_iteration", or its per-layer
#: cuda_graph_modules, megatron/core/transformer/transformer_config.py): the whole forward-backward path, or a
#: layer's attention, dense MLP, MoE block, or the MoE block up to its router and the dispatcher's preprocessing.
CUDA_GRAPH_SCOPES: tuple[str, ...] = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess")
#: What a recipe's quantisation moves per element on hardware whose FP8 GEMMs take only TN, and the transposed
#: copy's part of it (Transformer Engine, transformer_engine/pytorch/csrc/quantizer.cpp): per-tensor current
#: scaling reads the operand for its amax, reads it again and writes the FP8 copy and its transpose; delayed
#: scaling takes its amax from history (no first read); MXFP8 and blockwise scaling read once and write a rowwise
#: and a columnwise copy with their own scales, so nothing to save where FP8 GEMMs take any layout. A stack that
#: names a recipe without stating its cast bytes takes these.
RECIPE_CAST_BYTES: dict[str, tuple[float, float]] = {"current": (6.0, 1.0), "delayed": (4.0, 1.0),
                                                     "mxfp8": (4.0, 0.0), "blockwise": (4.0, 0.0)}
#: FP8 recipes under which Transformer Engine runs attention in FP8, and the format it runs it in
#: (transformer_engine/pytorch/attention/dot_product_attention/utils.py, v2.15: per-tensor scales under delayed and
#: current scaling, MXFP8 under mxfp8 on sm100 with cuDNN 9.21 or later; no fused FP8 attention for blockwise).
FP8_ATTENTION_RECIPES: dict[str, str] = {"delayed": "fp8", "current": "fp8", "mxfp8": "mxfp8"}
#: The largest caching-allocator reserve a stack may give (a share of the reserved memory holding no tensor).
MAX_ALLOCATOR_RESERVE = 0.5
#: Recompute settings a training step may take: none, selective (what the stack's `selective` means) or full.
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")
#: What the layers of a chunk past its first k run when only those k are recomputed fully: no recompute
#: (Megatron-LM's one --recompute-granularity: full with --recompute-method block), the stack's selective
#: recompute, or "off" where the stack cannot recompute only some layers fully.
FULL_LAYERS_BESIDE: tuple[str, ...] = ("none", "selective", "off")

__all__ = ["ATTENTION", "CUDA_GRAPH_SCOPES", "DISPATCHERS", "FP8_ATTENTION_RECIPES", "FULL_LAYERS_BESIDE",
           "MAX_ALLOCATOR_RESERVE", "RECIPE_CAST_BYTES", "RECOMPUTE_MODULES", "RECOMPUTE_POLICIES", "ROUTINGS",
           "SELECTIVE", "Attention", "Dispatcher", "Routing", "Selective"]
