"""Our reading of Megatron-LM's MoE recipe index (branch dev, examples/moe_recipes): one spec per indexed recipe.

Each recipe is a self-contained YAML: its container, its environment and every training argument. The index
publishes a median model TFLOP/s per GPU for most of them; tests/data/more_runs.json derives each row's step time
from it with Megatron-LM's own FLOPs formula. Every setting a spec here passes is the YAML's:
- the layout (tensor, pipeline with its virtual stages, expert and data degrees; expert tensor parallelism 1);
- the dispatcher (flex with DeepEP or HybridEP, both costed as `deepep`) and the 1F1B expert all-to-all overlap;
- the CUDA graph scopes, the selective recompute modules, FP8 weights (fp8_param_gather);
- the gradient and optimizer widths: main gradients in fp32, bf16 Adam moments where it sets
  use_precision_aware_optimizer;
- the data-parallel overlaps, which some recipes leave at Megatron-LM's default (off). No recipe sets
  --tp-comm-overlap.

Left out: DeepSeek-V3 on GB200 (it offloads expert_fc1's activations module by module and chunks of its
optimizer state, neither of which the estimate expresses), the two DeepSeek-V3 H100 recipes (no figure
published) and DeepSeek-V4 (not in the zoo).

Read with them, and never fitted either: the MoE ModelZoo's one GB300 row (`MODELZOO_GB300`), shipped with the
GB300 runs.
"""

from __future__ import annotations

from benchmarks.calibration_spec_helpers import (ACCOUNTED_LAYERS, ACCOUNTED_NOTE, DSV3_GROUPS, DSV3_MTP, DSV3_OPT,
                                                 DSV3_ROUTING, MC, MOE_BAL, as_run_split, dsv3_as_run)

#: The run file these readings ship in (planner/calibration/runs/moe-recipes.json)
FILE = "moe-recipes"
#: Why no fit uses them (`Run.never_fitted`): scored as held out, outside the split that picks the fitted runs
NEVER_FITTED = ("read 2026-12-06, after every preset was fitted: a blind check of the fitted presets, never "
                "fitted on")
#: What every recipe sets for the optimizer and the gradients (main_grads_dtype fp32; Megatron-LM reduces BF16
#: gradients in fp32 unless --grad-reduce-in-bf16, which no recipe passes)
GRADS = {"grad_bytes": 4.0}
GRADS_NOTE = ("gradients accumulated and reduced in fp32 (main_grads_dtype fp32, or Megatron-LM's default without "
              "--grad-reduce-in-bf16)")
PRECISION_AWARE_NOTE = ("precision-aware optimizer: fp32 master weights, bf16 Adam moments (use_precision_aware_"
                        "optimizer, exp_avg_dtype bf16), 8 bytes of state per parameter")
NO_TP_OVERLAP = {"overlap_tp_comm": False}
NO_DP_OVERLAP = {"overlap_grad_reduce": False, "overlap_param_gather": False}
NO_DP_OVERLAP_NOTE = ("gradient reduction and parameter gathers not overlapped: the YAML leaves both at "
                      "Megatron-LM's default, off")
MXFP8 = {"fp8_recipe": "mxfp8"}
#: use_precision_aware_optimizer with bf16 Adam moments beside fp32 master weights: 8 bytes of state a parameter
PRECISION_AWARE = DSV3_OPT
MX_PA = MXFP8 | PRECISION_AWARE
NO_FP8_WEIGHTS = {"fp8_params": False, "fp8_all_gather": False}
OVERLAP = {"overlap_ep_comm": True}


def never_fitted_spec(rid: str, file: str, hardware: str, gpus: int, model: str, batch: int, strategy: dict,
                      execution: dict, notes: list[str], dtype: str = "fp8",
                      read: tuple[str, ...] = ()) -> tuple[str, dict]:
    """A Megatron-LM run read after every preset was fitted, as a spec in run file `file`: one micro-batch, the
    distributed optimizer, no recompute and expert tensor parallelism 1 unless `strategy` says otherwise; fp32 main
    gradients, TP communication not overlapped and the flex dispatcher (`deepep`) under `execution`; its step
    derived from the row's TFLOP/s. `read` names where its settings were read (notes after the common two);
    Qwen3-235B's layers are split counting the embedding and the loss (account_for_* flags), DeepSeek-V3's by its
    YAML's layout."""
    strategy = {"micro_batch": 1, "zero": 1, "recompute": "none", "etp": 1} | strategy
    strategy.setdefault("sp", strategy.get("tp", 1) > 1)
    spec_notes = [MOE_BAL, GRADS_NOTE, *read]
    if model in ACCOUNTED_LAYERS and strategy.get("pp", 1) > 1:  # the YAMLs' account_for_* flags, as Bridge's
        strategy = as_run_split(strategy, model)
        spec_notes.append(ACCOUNTED_NOTE)
    spec = {"file": file, "hardware": hardware, "devices": gpus, "model": model, "seq_len": 4096,
            "global_batch": batch, "dtype": dtype, "stack": MC, "strategy": strategy,
            "execution": GRADS | NO_TP_OVERLAP | {"moe_dispatcher": "deepep"} | execution,
            "variants": ({"derived": "step_s"},), "notes": spec_notes, "never_fitted": NEVER_FITTED}
    if model == "deepseek-v3":
        spec["strategy"], layout_note = dsv3_as_run(strategy, "Et*4|(t*4|)*14tmL")
        spec["overrides"] = DSV3_MTP
        spec["execution"] |= DSV3_ROUTING
        spec_notes += [layout_note, DSV3_GROUPS]
    spec["notes"] = spec_notes + list(notes)
    return rid, spec


def recipe(rid: str, yaml: str, hardware: str, gpus: int, model: str, batch: int, strategy: dict, execution: dict,
           notes: list[str], dtype: str = "fp8") -> tuple[str, dict]:
    """One indexed recipe (`yaml` under examples/moe_recipes) as a never-fitted spec in the recipes' run file."""
    return never_fitted_spec(rid, FILE, hardware, gpus, model, batch, strategy, execution, notes, dtype,
                             read=(f"as examples/moe_recipes/{yaml} sets",))


_PARTIAL = ["attn", "moe_router", "moe_preprocess"]
RECIPE_SPECS: dict[str, dict] = dict([
    recipe("mlm-recipe-qwen3-235b-256xh100-bf16", "qwen3_235b/h100/bf16_256GPU_TP2PP8EP32.yaml", "dgx-h100", 256,
           "qwen3-235b-a22b", 2048, {"tp": 2, "pp": 8, "vpp": 4, "dp": 16, "ep": 32, "recompute": "selective"},
           OVERLAP | NO_DP_OVERLAP | {"cuda_graphs": ["moe_router", "moe_preprocess"],
                                      "recompute_modules": ["moe_act", "layernorm"]},
           [NO_DP_OVERLAP_NOTE, "HybridEP with the 1F1B all-to-all overlap, the router and the dispatcher's "
            "preprocessing in Transformer Engine CUDA graphs, selective recompute of moe_act and layernorm"],
           dtype="bf16"),
    recipe("mlm-recipe-qwen3-235b-128xb200-mxfp8", "qwen3_235b/b200/mxfp8_128GPU_TP2PP4EP16.yaml", "dgx-b200", 128,
           "qwen3-235b-a22b", 3072, {"tp": 2, "pp": 4, "vpp": 12, "dp": 16, "ep": 16, "micro_batch": 3},
           OVERLAP | MX_PA, [PRECISION_AWARE_NOTE, "DeepEP with the 1F1B all-to-all overlap, no CUDA graphs"]),
    recipe("mlm-recipe-qwen3-235b-128xb300-mxfp8-partial-cg", "qwen3_235b/b300/mxfp8_128GPU_TP2PP1EP16_partial_cg.yaml",
           "dgx-b300", 128, "qwen3-235b-a22b", 9216, {"tp": 2, "dp": 64, "ep": 16, "micro_batch": 3},
           OVERLAP | MX_PA | {"cuda_graphs": ["attn", "moe_router"]},
           [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap, attention and the router in "
            "Transformer Engine CUDA graphs"]),
    recipe("mlm-recipe-qwen3-235b-128xgb200-mxfp8-full-cg",
           "qwen3_235b/gb200/mxfp8_128GPU_TP1PP1EP64_paged_stash_fullcg_overlap.yaml", "gb200-nvl72", 128,
           "qwen3-235b-a22b", 8192, {"dp": 128, "ep": 64}, OVERLAP | MX_PA | {"cuda_graphs": ["full_iteration"]},
           [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap, the whole step in one CUDA graph "
            "(cuda_graph_impl local, scope full_iteration, with moe_paged_stash and padded experts)"]),
    recipe("mlm-recipe-qwen3-235b-128xgb200-mxfp8-partial-cg",
           "qwen3_235b/gb200/mxfp8_128GPU_TP1PP1EP64_partial_cg_overlap.yaml", "gb200-nvl72", 128,
           "qwen3-235b-a22b", 8192, {"dp": 128, "ep": 64}, OVERLAP | MX_PA | {"cuda_graphs": _PARTIAL},
           [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap, attention, the router and the "
            "dispatcher's preprocessing in Transformer Engine CUDA graphs"]),
    recipe("mlm-recipe-qwen3-235b-128xgb300-mxfp8-full-cg",
           "qwen3_235b/gb300/mxfp8_128GPU_TP1PP1EP64_paged_stash_full_cg.yaml", "gb300-nvl72", 128,
           "qwen3-235b-a22b", 8192, {"dp": 128, "ep": 64}, OVERLAP | MX_PA | {"cuda_graphs": ["full_iteration"]},
           [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap, the whole step in one CUDA graph "
            "(cuda_graph_impl local, scope full_iteration, with moe_paged_stash and padded experts)"]),
    recipe("mlm-recipe-qwen3-30b-a3b-32xh100-fp8", "qwen3_30b/h100/fp8_32GPU_TP1PP1EP8.yaml", "dgx-h100", 32,
           "qwen3-30b-a3b", 256, {"dp": 32, "ep": 8},
           {"fp8_recipe": "blockwise", "cuda_graphs": _PARTIAL} | PRECISION_AWARE,
           [PRECISION_AWARE_NOTE, "FP8 with blockwise scaling, HybridEP, attention, the router and the dispatcher's "
            "preprocessing in Transformer Engine CUDA graphs"]),
    recipe("mlm-recipe-qwen3-30b-a3b-32xh100-bf16", "qwen3_30b/h100/bf16_32GPU_TP1PP1EP8.yaml", "dgx-h100", 32,
           "qwen3-30b-a3b", 256, {"dp": 32, "ep": 8}, {}, ["HybridEP, no CUDA graphs"], dtype="bf16"),
    recipe("mlm-recipe-qwen3-30b-a3b-16xgb200-bf16", "qwen3_30b/gb200/bf16_16GPU_TP1PP1EP16.yaml", "gb200-nvl72", 16,
           "qwen3-30b-a3b", 512, {"dp": 16, "ep": 16, "micro_batch": 4}, NO_DP_OVERLAP,
           [NO_DP_OVERLAP_NOTE, "HybridEP, no CUDA graphs"], dtype="bf16"),
    recipe("mlm-recipe-qwen3-30b-a3b-16xgb200-mxfp8-partial-cg",
           "qwen3_30b/gb200/mxfp8_16GPU_TP1PP1EP16_partial_cg.yaml", "gb200-nvl72", 16, "qwen3-30b-a3b", 512,
           {"dp": 16, "ep": 16, "micro_batch": 4},
           MXFP8 | {"cuda_graphs": _PARTIAL} | NO_FP8_WEIGHTS | NO_DP_OVERLAP,
           [NO_DP_OVERLAP_NOTE, "16-bit weights (no fp8_param_gather), HybridEP, attention, the router and the "
            "dispatcher's preprocessing in CUDA graphs (external_cuda_graph)"]),
    recipe("mlm-recipe-qwen3-30b-a3b-16xgb200-mxfp8-full-cg", "qwen3_30b/gb200/mxfp8_16GPU_TP1PP1EP16_paged_stash.yaml",
           "gb200-nvl72", 16, "qwen3-30b-a3b", 512, {"dp": 16, "ep": 16, "micro_batch": 4},
           MXFP8 | {"cuda_graphs": ["full_iteration"]} | NO_FP8_WEIGHTS | NO_DP_OVERLAP,
           [NO_DP_OVERLAP_NOTE, "16-bit weights (no fp8_param_gather), HybridEP, the whole step in one CUDA graph "
            "(cuda_graph_impl local, scope full_iteration, with moe_paged_stash and padded experts)"]),
    recipe("mlm-recipe-deepseek-v3-256xb200-mxfp8", "deepseek_v3/b200/mxfp8_256GPU_TP1PP8EP32.yaml", "dgx-b200", 256,
           "deepseek-v3", 2048, {"pp": 8, "vpp": 2, "dp": 32, "ep": 32, "recompute": "selective"},
           OVERLAP | MX_PA | {"recompute_modules": ["mla_up_proj", "mlp"]},
           [PRECISION_AWARE_NOTE, "DeepEP with the 1F1B all-to-all overlap, no CUDA graphs, selective recompute of "
            "MLA's up-projections and the dense layers' MLPs"]),
    recipe("mlm-recipe-deepseek-v3-256xgb300-mxfp8", "deepseek_v3/gb300/mxfp8_256GPU_TP1PP4EP64.yaml", "gb300-nvl72",
           256, "deepseek-v3", 8192, {"pp": 4, "vpp": 4, "dp": 64, "ep": 64},
           OVERLAP | MX_PA | {"cuda_graphs": _PARTIAL},
           [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap, attention, the router and the "
            "dispatcher's preprocessing in Transformer Engine CUDA graphs"]),
])

#: The MoE ModelZoo's GB300 row (best_practice/qwen3/readme.md; run_gb300_235b.sh's command through
#: sbatch_benchmarking.sh's mxfp8 and A2A_OVERLAP branches, and the model's YAML), read after every preset was fitted
MODELZOO_GB300 = dict([never_fitted_spec(
    "mz-qwen3-235b-64xgb300-mxfp8-ep64", "gb300", "gb300-nvl72", 64, "qwen3-235b-a22b", 8192, {"dp": 64, "ep": 64},
    OVERLAP | MX_PA | {"cuda_graphs": _PARTIAL},
    [PRECISION_AWARE_NOTE, "HybridEP with the 1F1B all-to-all overlap (A2A_OVERLAP=1: --overlap-moe-expert-parallel-"
     "comm --delay-wgrad-compute), FP8 weights gathered (--fp8-param-gather), attention, the router and the "
     "dispatcher's preprocessing in Transformer Engine CUDA graphs, as the command and sbatch_benchmarking.sh set "
     "(Megatron-MoE-ModelZoo e865051)"])])

__all__ = ["MODELZOO_GB300", "RECIPE_SPECS"]
