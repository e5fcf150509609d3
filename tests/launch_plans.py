"""Training declarations the launch-config tests export: small models, every feature a launch config carries.

Each is `declare`d (scored, not searched), so building them takes seconds. Shapes come from the zoo presets
with TINY/MOE overrides; `shape` gives the model arguments a framework needs beside the exported ones.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from planner.hypershard import declare

TINY = dict(layers=8, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
MOE = dict(layers=4, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=64, experts=8, top_k=2)
COMMON = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=32)
#: stack files of Megatron-Core with CUDA graphs: the whole step, or a layer's attention, router and preprocessing
GRAPHS = {k: str(Path(__file__).parent / "data" / "stacks" / f"graphs_{k}.toml") for k in ("full_iteration",
                                                                                          "layer_modules")}

#: name -> (model, overrides, strategy and, optionally, stack, dtype, devices)
PLANS = {
    "3d": ("llama3-8b", TINY, dict(tp=2, pp=2, dp=2, sp=True, recompute="full", zero=1)),
    "interleaved": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, recompute="selective")),
    "fsdp": ("llama3-8b", TINY, dict(tp=2, dp=4, sp=True, zero=3, full_recompute_layers=2)),
    "zero2": ("llama3-8b", TINY, dict(dp=8, zero=2)),
    "first_last": ("llama3-8b", TINY, dict(pp=4, dp=2, stage_layers=(1, 3, 3, 1))),
    "layout": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, stage_layers=(1, 3, 3, 1))),
    # the embedding and the loss alone in the first and last chunk (Megatron-Bridge's accounted pipeline split)
    "ends_alone": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, zero=1, stage_layers=(0, 4, 4, 0))),
    "cp": ("llama3-8b", TINY, dict(tp=2, cp=2, dp=2, sp=True)),
    "moe": ("mixtral-8x7b", MOE, dict(tp=2, ep=4, zero=1, sp=True)),
    "moe_etp1": ("mixtral-8x7b", MOE, dict(tp=2, ep=8, etp=1, zero=1, sp=True)),
    # one NVLink domain over several nodes (18 trays of 4 GPUs): the flex dispatcher's HybridEP backend
    "moe_nvl72": ("mixtral-8x7b", MOE, dict(tp=2, ep=4, zero=1, sp=True, cluster="gb200-nvl72")),
    "offload": ("llama3-8b", TINY, dict(dp=8, zero=1, offload=(("optimizer", 0.5),))),
    # one data-parallel rank: Megatron-LM's distributed optimizer over that rank alone carries the offload
    "offload_dp1": ("llama3-8b", TINY, dict(tp=4, sp=True, devices=4, offload=(("optimizer", 1.0),))),
    "fp8": ("llama3-8b", TINY, dict(tp=2, dp=4, sp=True, zero=1, dtype="fp8")),
    # planned for the torchtitan stack (its selective recompute, FSDP2)
    "tt_3d": ("llama3-8b", TINY, dict(tp=2, pp=2, dp=2, sp=True, recompute="full", zero=1, stack="torchtitan")),
    "tt_interleaved": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, zero=3, recompute="selective", stack="torchtitan")),
    "tt_layout": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, zero=2, stage_layers=(1, 3, 3, 1), stack="torchtitan")),
    "tt_ends_alone": ("llama3-8b", TINY, dict(pp=2, vpp=2, dp=4, zero=2, stage_layers=(0, 4, 4, 0),
                                              stack="torchtitan")),
    "tt_gpipe": ("llama3-8b", TINY, dict(pp=2, dp=4, zero=1, schedule="gpipe", stack="torchtitan")),
    "tt_cp": ("llama3-8b", TINY, dict(tp=2, cp=2, dp=2, sp=True, zero=1, stack="torchtitan")),
    "tt_moe": ("mixtral-8x7b", MOE, dict(tp=2, ep=4, zero=1, sp=True, stack="torchtitan")),
    "tt_fp8": ("llama3-8b", TINY, dict(tp=2, dp=4, sp=True, zero=3, dtype="fp8", stack="torchtitan")),
    "tt_offload": ("llama3-8b", TINY, dict(dp=8, zero=3, offload=(("grads", 1.0), ("optimizer", 1.0), ("params", 1.0)),
                                          stack="torchtitan")),
    "tt_flushes": ("llama3-8b", TINY, dict(pp=2, dp=4, zero=1, flushes=2, stack="torchtitan")),
    # one micro-batch of 8 for two stages: 1F1B's order is GPipe's, and torch's Schedule1F1B refuses to run it
    "tt_few": ("llama3-8b", TINY, dict(tp=2, pp=2, dp=2, sp=True, zero=1, micro_batch=8, stack="torchtitan")),
    # for DeepSpeed: ZeRO-Offload, ZeRO-Infinity-style fractions, AutoTP, AutoEP
    "ds_offload3": ("llama3-8b", TINY, dict(dp=8, zero=3, recompute="full",
                                            offload=(("optimizer", 0.5), ("params", 1.0), ("activations", 1.0)))),
    "ds_offload1": ("llama3-8b", TINY, dict(dp=8, zero=1, offload=(("grads", 1.0), ("optimizer", 1.0)))),
    "ds_tp": ("llama3-8b", TINY, dict(tp=2, dp=4, zero=1)),
    "ds_moe": ("mixtral-8x7b", MOE, dict(dp=8, ep=8, zero=2)),
    "ds_moe_nvl72": ("mixtral-8x7b", MOE, dict(dp=8, ep=8, zero=2, cluster="gb200-nvl72")),
    # CUDA graphs (Megatron-LM captures them; the others launch eagerly)
    "graphs_full": ("llama3-8b", TINY, dict(tp=2, dp=4, sp=True, zero=1, stack=GRAPHS["full_iteration"])),
    "graphs_moe_full": ("mixtral-8x7b", MOE, dict(ep=8, zero=1, stack=GRAPHS["full_iteration"])),
    "graphs_layer": ("mixtral-8x7b", MOE, dict(tp=2, ep=4, zero=1, sp=True, stack=GRAPHS["layer_modules"])),
    # what some formats cannot say
    "widths": ("llama3-8b", TINY, dict(tp=2, pp=2, dp=2, stage_tp=(1, 2), devices=6)),
    "gpipe": ("llama3-8b", TINY, dict(pp=2, dp=4, schedule="gpipe")),
    "activations": ("llama3-8b", TINY, dict(dp=8, offload=(("activations", 0.4),))),
    "activations_pp": ("llama3-8b", TINY, dict(pp=2, dp=4, offload=(("activations", 0.4),))),
}
#: the plans each launch backend writes
WRITES = {
    "megatron": ["3d", "interleaved", "fsdp", "zero2", "first_last", "layout", "ends_alone", "cp", "moe", "moe_etp1",
                 "moe_nvl72", "offload", "offload_dp1", "activations", "fp8", "tt_3d", "tt_layout", "tt_ends_alone",
                 "tt_cp", "tt_moe", "tt_fp8", "graphs_full",
                 "graphs_layer"],
    "mindformers": ["3d", "fsdp", "zero2", "first_last", "layout", "cp", "moe", "moe_etp1", "tt_gpipe", "tt_layout",
                    "ds_tp", "ds_moe"],
    "deepspeed": ["zero2", "ds_offload3", "ds_offload1", "ds_tp", "ds_moe", "ds_moe_nvl72", "tt_offload"],
    "torchtitan": ["tt_few", "tt_3d", "tt_interleaved", "tt_layout", "tt_ends_alone", "tt_gpipe", "tt_cp", "tt_moe", "tt_fp8",
                   "tt_offload",
                   "tt_flushes", "3d", "zero2", "moe", "moe_etp1", "fp8"],
}
#: backend -> plan -> words of the one sentence it refuses the plan by
REFUSES = {
    "mindformers": {"interleaved": "selective recompute (the megatron-core stack's: core_attn",
                    "tt_interleaved": "selective recompute (the torchtitan stack's: every other matmul",
                    "fp8": "FP8 GEMMs", "offload": "optimizer offload (50%)", "activations": "activations offload (40%)",
                    "widths": "pipeline stages of different tensor widths",
                    "graphs_full": "CUDA graphs of full_iteration",
                    "ends_alone": "pipeline chunk of no decoder layer"},
    "deepspeed": {"3d": "2 pipeline stages", "cp": "context parallelism 2", "moe": "sequence parallelism beside tensor",
                  "fsdp": "selective or per-layer recompute", "fp8": "FP8 GEMMs", "offload": "optimizer offload (50%)",
                  "activations": "activations offload (40%)"},
    "megatron": {"widths": "pipeline stages of different tensor widths (TP 1+2)", "gpipe": "GPipe schedule",
                 "activations_pp": "activations offload (40%) beside a pipeline",
                 "tt_interleaved": "selective recompute as the torchtitan",
                 "graphs_moe_full": "a full-iteration CUDA graph of a MoE model",
                 "tt_offload": "params offload (100%)", "tt_gpipe": "GPipe schedule"},
    "torchtitan": {"widths": "pipeline stages of different tensor widths", "interleaved": "unsharded data parallelism",
                   "first_last": "unsharded data parallelism beside TP, PP or CP",
                   "fsdp": "full recompute of the first 2 layers", "offload": "optimizer offload (50%)",
                   "activations": "activations offload (40%)",
                   "graphs_layer": "CUDA graphs of attn, moe_router, moe_preprocess"},
}


@functools.lru_cache(maxsize=None)
def plan(name: str) -> dict:
    """The declaration of one of PLANS (made once per test process)."""
    model, overrides, strategy = PLANS[name]
    strategy = dict(strategy)
    common = dict(COMMON, devices=strategy.pop("devices", COMMON["devices"]),
                  cluster=strategy.pop("cluster", COMMON["cluster"]))
    return declare(model, overrides=overrides, **common, **strategy)


def shape(name: str) -> dict:
    """The model's shape as Megatron-Core's TransformerConfig names it (what MODEL_ARGS would give)."""
    model, overrides, _ = PLANS[name]
    out = dict(num_layers=overrides["layers"], hidden_size=overrides["hidden"],
               num_attention_heads=overrides["heads"], num_query_groups=overrides["kv_heads"],
               ffn_hidden_size=overrides["ffn"], add_bias_linear=False, gated_linear_unit=True)  # Llama: SwiGLU, no biases
    if "experts" in overrides:
        out.update(num_moe_experts=overrides["experts"], moe_router_topk=overrides["top_k"])
    return out


#: The value types pinned parsers give; "<lambda>" is Megatron-LM's --cuda-graph-scope, CudaGraphScope[name] for each
#: name, read here as the name (megatron-core's TransformerConfig makes each a CudaGraphScope, refusing an unknown one).
_TYPES = {"int": int, "float": float, "str": str, "<lambda>": str}


def parse_pinned(words: list[str], pinned: dict[str, Any]) -> tuple[argparse.Namespace, set[str]]:
    """`words` (flags and values) parsed by a parser of the pinned flags they use, each declared with the type,
    nargs and choices the framework's own parser gives it (pinned["flags"]); also the dests they set. A flag the
    pinned file does not hold fails the test."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag in dict.fromkeys(w for w in words if w.startswith("--")):
        assert flag in pinned["flags"], f"{flag} is not a flag of {pinned['source']}"
        spec = pinned["flags"][flag]
        dest = spec.get("dest", flag[2:].replace("-", "_"))
        if not spec["value"]:  # a switch; "--no-X" writing X (Megatron-LM's store_false) sets it False
            off = flag.startswith("--no-") and dest == flag[5:].replace("-", "_")
            parser.add_argument(flag, dest=dest, action="store_false" if off else "store_true", default=None)
            continue
        kw: dict[str, Any] = {"dest": dest, "type": _TYPES[spec["type"]] if "type" in spec else None}
        for key in ("nargs", "choices"):
            if key in spec:
                kw[key] = spec[key]
        parser.add_argument(flag, **kw)
    ns = parser.parse_args(words)
    return ns, {k for k, v in vars(ns).items() if v is not None}


#: serving declarations: name -> declare_serving_phases keywords (tiny models on 8 H100s)
SERVING = {
    "moe_disagg": dict(model="mixtral-8x7b", overrides=dict(TINY, experts=4, top_k=2),
                       prefill=dict(tp=2, dp=2, batch=1), decode=dict(dp=4, batch=2)),
    "moe_uneven": dict(model="mixtral-8x7b", overrides=dict(TINY, experts=4, top_k=2),
                       prefill=dict(dp=3, batch=1), decode=dict(dp=5, batch=2)),
    "dense_colocated": dict(model="llama3-8b", overrides=TINY, mode="co-located",
                            prefill=dict(tp=2, dp=4, batch=2), decode=dict(tp=2, dp=4, batch=8)),
    "dense_pp": dict(model="llama3-8b", overrides=TINY, prefill=dict(tp=2, pp=2, batch=1),
                     decode=dict(tp=2, dp=2, batch=4), kv_dtype="fp8"),
    "kv_offload": dict(model="llama3-8b", overrides=TINY, prefill=dict(tp=2, batch=1),
                       decode=dict(tp=2, dp=3, batch=4, kv_offload=0.5)),
    "kv_int8": dict(model="llama3-8b", overrides=TINY, prefill=dict(tp=2, batch=1), decode=dict(tp=2, batch=4),
                    kv_dtype="int8"),
}


@functools.lru_cache(maxsize=None)
def serving(name: str) -> dict:
    from planner.hypershard import declare_serving_phases

    kw = dict(SERVING[name])
    return declare_serving_phases(kw.pop("model"), cluster="dgx-h100", prompt_len=16, gen_len=8, **kw)
