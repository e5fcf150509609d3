"""Our reading of each published row (tests/data): model, hardware, stack, strategy, and what we had to assume.

One entry per published row (its id), read by `calibration_readings.py`. `variants` turn one row into several runs
when it measures several settings (compile on/off, FP8, async TP, a schedule); `row` names the published row when
the entry's own id differs. Every strategy degree is the row's own (tests/test_calibration_readings.py checks them);
a note says where a value is not in the row. The notes several rows share and one builder per source's table live in
`calibration_spec_helpers.py`; the order of the entries is the order the fit's alternate split reads, so a new row
goes after its hardware's last.
"""

from __future__ import annotations

from benchmarks.calibration_spec_recipes import MODELZOO_GB300, RECIPE_SPECS
from benchmarks.calibration_spec_helpers import (
    A2A_NOTE, ACCOUNTED_NOTE, ASYNC, AUTOMODEL_MOE, AUTOMODEL_MOE_GRADS, AUTOMODEL_NOTE, DIST_OPT, CUTEDSL_MLP, DSV3_GROUPS,
    DSV3_HYBRIDEP, DSV3_OPT, DSV3_OPT_NOTE, DSV3_ROUTING, FAKE_GATE, FP8_AG, FP8_ATTENTION, GPT3_20B, GT, HYBRIDEP_NOTE,
    HYBRIDEP_OVERLAP, LLAMA2_13B, MC, MLP_ATTENTION_NOTE, MLP_NOTE, MOE_BAL, MOE_BAL_ASSUMED, MX, MZ_GRADS,
    MZ_GRADS_NOTE, MZ_H100, MZ_H100_NOTE, TT, TT_COMPILED_LOSS, TT_COMPILED_LOSS_NOTE, TT_EAGER, TT_EAGER_LOSS,
    TT_EAGER_LOSS_NOTE, TT_NOTE, a100, as_run_split, ascend, asynctp_variants, bridge, mz_long_context, nemo, table,
    titan, ws, PUBLISHER_ISSUES, nemo_long_sequence,
)

SPECS: dict[str, dict] = table([
    # -- A100, Megatron-LM 2021-22 ---------------------------------------------------------------------
    a100("narayanan21-t1-1.7b", 2304, 24, 24, 32, 512, 1, 1, 32, "full"),
    a100("narayanan21-t1-3.6b", 3072, 30, 32, 64, 512, 2, 1, 32, "full"),
    a100("narayanan21-t1-7.5b", 4096, 36, 32, 128, 512, 4, 1, 32, "full"),
    a100("narayanan21-t1-18.4b", 6144, 40, 48, 256, 1024, 8, 1, 32, "full"),
    a100("narayanan21-t1-76.1b", 10240, 60, 80, 1024, 1792, 8, 4, 32, "full"),
    a100("narayanan21-t1-310.1b", 16384, 96, 128, 1920, 2160, 8, 16, 15, "full"),
    a100("narayanan21-t1-1008b", 25600, 128, 160, 3072, 3072, 8, 64, 6, "full"),
    a100("korthikanti22-22b-full", 6144, 48, 64, 8, 4, 8, 1, 1, "full", mb=4),
    a100("korthikanti22-22b-sel", 6144, 48, 64, 8, 4, 8, 1, 1, "selective", mb=4, sp=True),
    a100("korthikanti22-530b-full", 20480, 105, 128, 280, 280, 8, 35, 1, "full", vpp=3, mb=1),
    a100("korthikanti22-530b-sel", 20480, 105, 128, 280, 280, 8, 35, 1, "selective", vpp=3, mb=1, sp=True),
])

SPECS |= table([
    # -- DGX H100, NeMo 24.07 (FP8) ----------------------------------------------------------------------
    nemo("nemo2407-gpt3-175b-128-h100-fp8", "gpt3-175b", 128, 2048, 256, 4, 8, 1, 6, 4, 1),
    nemo("nemo2407-gpt3-175b-512-h100-fp8", "gpt3-175b", 512, 2048, 2048, 4, 8, 1, 6, 16, 2),
    nemo("nemo2407-llama3-8b-8-h100-fp8", "llama3-8b", 8, 8192, 128, 1, 1, 2, 1, 4, 1, fused_ce=True),
    nemo("nemo2407-llama3-70b-64-h100-fp8", "llama3-70b", 64, 8192, 128, 4, 4, 2, 5, 2, 1, fused_ce=True),
    nemo("nemo2407-llama2-70b-64-h100-fp8", "llama2-70b", 64, 4096, 128, 4, 4, 1, 20, 4, 1),
    nemo("nemo2407-nemotron4-340b-128-h100-fp8", "nemotron4-340b", 128, 4096, 32, 8, 8, 1, 12, 2, 1),
    nemo("nemo2407-gpt3-20b-64-h100-fp8", "gpt", 64, 2048, 256, 2, 1, 1, 1, 32, 2, overrides=GPT3_20B,
         notes=["GPT-3 20B as NeMo's GPTConfig20B: hidden 6144, 44 layers, 48 heads (the zoo's gpt family)"]),
    nemo("nemo2407-llama2-7b-8-h100-fp8", "llama2-7b", 8, 4096, 128, 1, 1, 1, 1, 8, 1),
    nemo("nemo2407-llama2-13b-16-h100-fp8", "llama2-7b", 16, 4096, 128, 1, 4, 1, 10, 4, 1, overrides=LLAMA2_13B,
         notes=["Llama 2 13B as the llama2-7b preset with 13B's hidden 5120, 40 layers, 40 heads, ffn 13824"]),
])

SPECS |= table([
    # -- DGX H100, Megatron-LM r0.8 weak scaling (BF16) ---------------------------------------------
    ws("1.7b", 48, 192, 2048, 24, 16, 1, 1, 0.452),
    ws("7.1b", 96, 192, 4096, 30, 32, 2, 1, 0.8),
    ws("16b", 192, 192, 6144, 32, 48, 4, 1, 0.85),
    ws("32b", 384, 192, 7168, 48, 56, 8, 1, 0.892),
])

SPECS |= table([
    # -- DGX H100, Megatron-Bridge (NeMo 25.09-26.06) -------------------------------------------------
    bridge("mb2606-llama31-405b-1024xh100-fp8", "llama3-405b", "dgx-h100", 1024, 8192, 1536,
           {"tp": 8, "pp": 8, "cp": 2, "vpp": 8, "dp": 8}),
    bridge("mb2604-llama3-70b-64xh100-fp8", "llama3-70b", "dgx-h100", 64, 8192, 256,
           {"tp": 4, "pp": 8, "vpp": 5, "dp": 2},
           notes=["2 layers per virtual stage: v0.4.0's recipe sets no pipeline layout (recipes/llama/llama3.py)"]),
    bridge("mb2511-llama3-8b-8xh100-fp8cs-fsdp", "llama3-8b", "dgx-h100", 8, 8192, 128,
           {"dp": 8, "zero": 1, "full_recompute_layers": 5},
           corrects={"fsdp": "the table's FSDP column was carried over from 25.09"},
           notes=["distributed optimizer and full recompute of 5 layers, as the 25.11 release's config sets "
                  "(Megatron-Bridge v0.2.0 scripts/performance/configs/llama3/workload_base_configs.py "
                  "LLAMA3_8B_H100_FP8_CS_BASE_CONFIG: recompute_num_layers=5, no use_megatron_fsdp; the table's "
                  "FSDP column was carried over from 25.09)"]),
    bridge("mb2606-qwen3-30b-a3b-16xh100-fp8", "qwen3-30b-a3b", "dgx-h100", 16, 4096, 1024,
           {"dp": 16, "ep": 16, "etp": 1}, execution={"moe_dispatcher": "deepep"},
           notes=[MOE_BAL, "HybridEP (flex) dispatch without all-to-all overlap, as the recipe sets "
                  "(Megatron-Bridge perf_recipes/qwen/h100/qwen3_moe.py)"]),
    bridge("mb2604-qwen3-235b-a22b-256xh100-fp8", "qwen3-235b-a22b", "dgx-h100", 256, 4096, 8192,
           {"tp": 2, "pp": 8, "vpp": 4, "dp": 16, "ep": 32, "etp": 1},
           execution={"overlap_ep_comm": True, "overlap_tp_comm": False, "moe_dispatcher": "alltoall"},
           notes=[MOE_BAL, "expert all-to-all overlapped and TP communication not (overlap_moe_expert_parallel_comm "
                  "True, tp_comm_overlap False in the recipe: perf_recipes/qwen/h100/qwen3_moe.py)", A2A_NOTE]),
    bridge("mb2604-gpt-oss-120b-64xh100-bf16", "gpt-oss-120b", "dgx-h100", 64, 4096, 1280,
           {"pp": 4, "dp": 16, "ep": 8, "etp": 1, "recompute": "selective"}, dtype="bf16",
           execution={"recompute_modules": ["layernorm", "moe_act"], "moe_dispatcher": "alltoall"},
           notes=[MOE_BAL, "selective recompute of layernorm and the MoE activation, as the recipe sets", A2A_NOTE]),
    bridge("mb2509-deepseek-v3-1024xh100-fp8", "deepseek-v3", "dgx-h100", 1024, 4096, 8192,
           {"tp": 2, "pp": 8, "vpp": 4, "dp": 64, "ep": 64, "etp": 1, "recompute": "selective"},
           execution=DSV3_OPT | DSV3_ROUTING | {"overlap_grad_reduce": False, "moe_dispatcher": "deepep",
                                                "recompute_modules": ["mla_up_proj", "mlp"], "overlap_ep_comm": True,
                                                "overlap_tp_comm": False},
           notes=[MOE_BAL, DSV3_GROUPS, DSV3_OPT_NOTE,
                  "DeepEP dispatcher, no gradient-reduce overlap, the expert all-to-all overlapped (1F1B, on H100) and "
                  "TP communication not, selective recompute of MLA's up-projections and the MLP, as the 25.09 "
                  "release's scripts/performance/run_script.py sets (Megatron-Bridge r0.1.0: A2A_1F1B for h100, "
                  "no comm_overlap_config so the recipe's CommOverlapConfig(tp_comm_overlap=False))",
                  "FP8 inferred from the table's footnote (the release has no precision column)",
                  "the layout r0.1.0's scripts/performance/run_script.py passes for h100"],
           layout="Et|(tt|)*30mL"),
])

SPECS |= table([
    # -- DGX H100, Megatron MoE ModelZoo (BF16, DeepEP) ---------------------------------------------------
    ("mz-qwen3-235b-256xh100-bf16-ep32-pp8", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "qwen3-235b-a22b", "seq_len": 4096,
        "global_batch": 2048, "stack": MC, "execution": MZ_H100 | {"moe_dispatcher": "deepep", "overlap_ep_comm": True,
                                                                   "recompute_modules": ["moe_act", "layernorm"]},
        "strategy": as_run_split({"tp": 2, "pp": 8, "vpp": 4, "dp": 16, "ep": 32, "etp": 1, "micro_batch": 1,
                                  "sp": True, "zero": 1, "recompute": "selective"}, "qwen3-235b-a22b"),
        "variants": ({"what": "1F1B all-to-all overlap"},
                     {"suffix": "-no-a2a-overlap", "step_s": 19.7, "what": "without the 1F1B all-to-all overlap",
                      "execution": {"overlap_ep_comm": False}}),
        "notes": [MOE_BAL, "selective recompute of norms and the MoE activation, as the run script sets", DIST_OPT,
                  MZ_H100_NOTE, ACCOUNTED_NOTE]}),
    ("mz-qwen3-235b-256xh100-bf16-ep8-fsdp", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "qwen3-235b-a22b", "seq_len": 4096,
        "global_batch": 2048, "stack": MC, "execution": {"overlap_tp_comm": False, "moe_dispatcher": "deepep"},
        "strategy": {"tp": 2, "dp": 128, "ep": 8, "etp": 1, "micro_batch": 4, "sp": True, "zero": 3,
                     "recompute": "full"},
        "notes": [MOE_BAL_ASSUMED, "Megatron-FSDP as ZeRO-3",
                  "TP communication not overlapped: the table predates --tp-comm-overlap in the ModelZoo's "
                  "sbatch_benchmarking.sh (b09773a, 2025-12-16)",
                  "ASSUMPTION: gradients reduced in bf16, against Megatron-LM's fp32 default: Megatron-FSDP "
                  "reduce-scatters every micro-batch's gradients (optim_grads_params), and in fp32 the four "
                  "micro-batches' expert gathers and reduce-scatters over the 32 expert-data-parallel nodes would "
                  "move 909 GB per GPU, "
                  "18.2 s at the 50 GB/s link rate, more than the measured 17.6 s step",
                  "the table's TP 2, DP 128 and GA 4, which agree with each other; the ModelZoo's launch line for "
                  "this layout, added the same day (examples/qwen3/run_235b.sh, 31c5686, 2025-05-27, 'Intra-node EP "
                  "+ FSDP solution'), says TP=1, which would make it DP 256 with 2 micro-batches"]}),
    ("mz-qwen3-235b-256xh100-bf16-a2a-pp32", {
        "row": "mz-qwen3-235b-256xh100-bf16-ep8-fsdp", "file": "h100", "hardware": "dgx-h100", "devices": 256,
        "model": "qwen3-235b-a22b", "seq_len": 4096, "global_batch": 2048, "stack": MC,
        "execution": MZ_H100 | {"moe_dispatcher": "alltoall", "recompute_modules": ["moe_act", "layernorm"]},
        "strategy": {"tp": 2, "pp": 32, "vpp": 3, "dp": 4, "ep": 8, "etp": 1, "micro_batch": 1, "sp": True,
                     "zero": 1, "recompute": "selective", "stage_layers": [0] + [1] * 94 + [0]},
        "variants": ({"also": "same_table_A2A_TP2_EP8_PP32_VPP3_DP4_GA512",
                      "what": "the same table's A2A row: TP2 EP8 PP32 VPP3 DP4, GA 512"},),
        "notes": [MOE_BAL_ASSUMED, "Megatron's all-to-all dispatcher (the row's A2A), no 1F1B all-to-all overlap "
                  "(the row's notes are empty)", "selective recompute of norms and the MoE activation (the row's "
                  "'norm, act')", DIST_OPT,
                  "the embedding alone in the first of the 96 chunks and the loss alone in the last, 94 layers one "
                  "per chunk between: the ModelZoo's model_configs/benchmarking/Qwen3-235B-A22B.yaml sets "
                  "--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split",
                  MZ_H100_NOTE]}),
    ("mz-qwen3-235b-256xh100-bf16-tp4-ep8-pp8", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "qwen3-235b-a22b", "seq_len": 4096,
        "global_batch": 2048, "stack": MC, "execution": MZ_H100 | {"moe_dispatcher": "deepep"},
        "strategy": as_run_split({"tp": 4, "pp": 8, "vpp": 4, "dp": 8, "ep": 8, "etp": 1, "micro_batch": 1,
                                  "sp": True, "zero": 1, "recompute": "none"}, "qwen3-235b-a22b"),
        "notes": [MOE_BAL_ASSUMED, "no recompute (the row's recompute column is empty)", DIST_OPT, MZ_H100_NOTE,
                  ACCOUNTED_NOTE]}),
    mz_long_context(131072, 389),
    # -- DGX H100, NeMo Automodel (PyTorch FSDP2 + Transformer Engine) ------------------------------------
    ("automodel-llama3-70b-64xh100-bf16-fsdp-cp2", {
        "file": "h100", "hardware": "dgx-h100", "devices": 64, "model": "llama3-70b", "seq_len": 8192,
        "global_batch": 128, "stack": "automodel",
        "execution": {"optimizer_bytes": 8.0, "attention_kernel": "flash2"},
        "strategy": {"cp": 2, "dp": 32, "micro_batch": 1, "zero": 3, "recompute": "full"},
        "notes": [AUTOMODEL_NOTE,
                  "Transformer Engine's FusedAdam with its defaults on bf16 parameters: fp32 moments, no master "
                  "weights (TE optimizers/fused_adam.py), 8 bytes of state per parameter (its benchmark config "
                  "examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml)",
                  "attention by torch SDPA, which under context parallelism Automodel limits to the flash and "
                  "memory-efficient backends (cp_utils.py): FlashAttention-2"]}),
    ("automodel-deepseek-v3-256xh100-bf16", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "deepseek-v3", "seq_len": 4096,
        "global_batch": 512, "stack": "automodel", "execution": AUTOMODEL_MOE,
        "strategy": {"pp": 4, "vpp": 8, "dp": 64, "ep": 64, "micro_batch": 1, "zero": 3, "recompute": "full"},
        "notes": [AUTOMODEL_NOTE, MOE_BAL, FAKE_GATE, "local batch 8 per rank as 8 micro-batches of 1",
                  AUTOMODEL_MOE_GRADS]}),
    ("automodel-kimi-k2-256xh100-bf16", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "kimi-k2", "seq_len": 4096,
        "global_batch": 512, "stack": "automodel", "execution": AUTOMODEL_MOE,
        "strategy": {"pp": 8, "vpp": 4, "dp": 32, "ep": 32, "micro_batch": 1, "zero": 3, "recompute": "full",
                     "flushes": 2},
        "notes": [AUTOMODEL_NOTE, MOE_BAL, FAKE_GATE, AUTOMODEL_MOE_GRADS,
                  "two pipeline schedules of 8 micro-batches per step, as the table's GA 2 and local batch 8 say "
                  "(recipes/llm/benchmark.py: gradient-accumulation steps, each a full pipeline schedule)"]}),
    ("automodel-qwen3-moe-30b-8xh100-bf16", {
        "file": "h100", "hardware": "dgx-h100", "devices": 8, "model": "qwen3-30b-a3b", "seq_len": 4096,
        "global_batch": 512, "stack": "automodel", "execution": AUTOMODEL_MOE,
        "strategy": {"dp": 8, "ep": 8, "micro_batch": 4, "zero": 3, "recompute": "full"},
        "notes": [AUTOMODEL_NOTE, MOE_BAL, FAKE_GATE, AUTOMODEL_MOE_GRADS]}),
    # the long-context table's other lengths, shipped after the 128K row (at the end, so earlier rows keep their split)
    mz_long_context(16384, 295), mz_long_context(32768, 335), mz_long_context(65536, 368),
    *nemo_long_sequence(),  # NeMo 24.03.01's Llama 2 7B at 4K-1M: one published row, fitted or held out whole
])

SPECS |= table([
    # -- Grand Teton H100 (96 GB, 500 W), torchtitan ---------------------------------------------------------
    titan("torchtitan-405b-128xh100-bf16-fsdp16tp8", "llama3-405b", 128, 32,
          {"tp": 8, "dp": 16, "micro_batch": 2, "sp": True, "recompute": "full"},
          ({"execution": TT_EAGER, "what": "eager"},),
          notes=["the table lists this row's optimizations as 'None' beside the Float8 rows' own: TP not overlapped",
                 "ASSUMPTION: eager; the table does not say, and the 405B train config of that commit (3faaa1a0d) "
                 "sets compile = true. Costed compiled, the Grand Teton fit moves its overlap 0.48 -> 0.47 and its "
                 "held-out rows by at most 1.1 points"]),
    titan("torchtitan-405b-128xh100-fp8-fsdp16tp8", "llama3-405b", 128, 32,
          {"tp": 8, "dp": 16, "micro_batch": 2, "sp": True, "recompute": "full"},
          ({"dtype": "fp8", "execution": FP8_AG},
           {"suffix": "-asynctp", "dtype": "fp8", "tokens_per_s": 185, "what": "Float8 + async TP",
            "execution": ASYNC | FP8_AG}),
          notes=["Float8 linears, tensorwise scaling, with FP8 all-gather and compiled (torchtitan's float8 recipe "
                 "then, docs/float8.md)"]),
    titan("torchtitan-8b-8xh100-fsdp8-bf16", "llama3-8b", 8, 16,
          {"dp": 8, "micro_batch": 2, "recompute": "selective"},
          ({"suffix": "-eager", "memory_gib": 82.4, "execution": TT_EAGER, "what": "eager"},
           {"suffix": "-compile", "tokens_per_s": 6667, "memory_gib": 77.0, "what": "FSDP + torch.compile"},
           {"suffix": "-compile-fp8", "tokens_per_s": 8532, "memory_gib": 76.8, "dtype": "fp8",
            "what": "FSDP + compile + Float8"})),
    titan("torchtitan-8b-128xh100-fsdp128-bf16", "llama3-8b", 128, 256,
          {"dp": 128, "micro_batch": 2, "recompute": "selective"},
          ({"suffix": "-eager", "memory_gib": 67.0, "execution": TT_EAGER, "what": "eager"},
           {"suffix": "-compile", "tokens_per_s": 6514, "memory_gib": 62.0, "what": "FSDP + torch.compile"},
           {"suffix": "-compile-fp8", "tokens_per_s": 8380, "memory_gib": 61.8, "dtype": "fp8",
            "what": "FSDP + compile + Float8"})),
    titan("torchtitan-70b-256xh100-fsdp32tp8-fp8", "llama3-70b", 256, 512,
          {"tp": 8, "dp": 32, "micro_batch": 16, "sp": True, "recompute": "full"},
          ({"dtype": "fp8", "memory_gib": 71.9},
           {"suffix": "-asynctp", "dtype": "fp8", "tokens_per_s": 876, "memory_gib": 67.6, "what": "2D + async TP",
            "execution": ASYNC})),
    titan("torchtitan-405b-512xh100-fsdp8tp8pp8-fp8", "llama3-405b", 512, 256,
          {"tp": 8, "pp": 8, "dp": 8, "micro_batch": 4, "sp": True, "recompute": "full"},
          ({"suffix": "-1f1b", "tokens_per_s": 100, "dtype": "fp8", "memory_gib": 82.5, "what": "1F1B",
            "execution": ASYNC | FP8_AG},),
          notes=["micro-batches not stated: as many as stages (8, torchtitan's default then), so 4 sequences each",
                 "async TP, as the row states"]),
    ("torchtitan-405b-512xh100-fsdp8tp8pp8-fp8-interleaved", {
        "row": "torchtitan-405b-512xh100-fsdp8tp8pp8-fp8", "file": "h100-96gb", "hardware": GT, "devices": 512,
        "model": "llama3-405b", "seq_len": 8192, "global_batch": 256, "stack": TT, "dtype": "fp8",
        "execution": ASYNC | FP8_AG | TT_EAGER_LOSS,
        "strategy": {"tp": 8, "pp": 8, "vpp": 2, "dp": 8, "micro_batch": 4, "sp": True, "zero": 3, "recompute": "full"},
        "variants": ({"tokens_per_s": 128, "memory_gib": 72.7, "what": "Interleaved 1F1B"},),
        "notes": [TT_NOTE, "virtual stages not stated: 2 per rank",
                  "micro-batches not stated: as many as stages (8, torchtitan's default then), so 4 sequences each",
                  TT_EAGER_LOSS_NOTE]}),
    titan("torchtitan-asynctp-70b-256xh100-bf16", "llama3-70b", 256, 512,
          {"tp": 8, "dp": 32, "micro_batch": 16, "sp": True, "recompute": "full"},
          asynctp_variants(597.3, 652.4, 809.8, 942.4),
          notes=["FP8 rowwise columns left out: that nightly's rowwise kernels ran at BF16 speed"]),
    titan("torchtitan-asynctp-8b-64xh100-bf16", "llama3-8b", 64, 96,
          {"tp": 8, "dp": 8, "micro_batch": 12, "sp": True, "recompute": "selective"},
          asynctp_variants(4378, 4809.4, 5078.1, 5570.1)),
    # -- H200 (WhiteFiber), torchtitan via Trainy --------------------------------------------------------------
    titan("torchtitan-trainy-8b-h200-32", "llama3-8b", 32, 64, {"dp": 32, "micro_batch": 2, "recompute": "selective"},
          ({"tokens_per_s": 10938, "memory_gib": 47.96, "dtype": "fp8", "what": "4 nodes",
            "execution": FP8_AG | TT_COMPILED_LOSS},),
          hardware="dgx-h200", file="h200", row="torchtitan-trainy-8b-h200-fsdp-fp8",
          notes=["Float8 linears with FP8 all-gather, compiled", TT_COMPILED_LOSS_NOTE]),
    titan("torchtitan-trainy-8b-h200-64", "llama3-8b", 64, 128, {"dp": 64, "micro_batch": 2, "recompute": "selective"},
          ({"tokens_per_s": 10753, "memory_gib": 46.97, "dtype": "fp8", "what": "8 nodes",
            "execution": FP8_AG | TT_COMPILED_LOSS},),
          hardware="dgx-h200", file="h200", row="torchtitan-trainy-8b-h200-fsdp-fp8",
          notes=["Float8 linears with FP8 all-gather, compiled", TT_COMPILED_LOSS_NOTE]),
])

SPECS |= table([
    # -- DGX B200, Megatron-Bridge ----------------------------------------------------------------------------
    bridge("mb2604-deepseek-v3-256xb200-mxfp8", "deepseek-v3", "dgx-b200", 256, 4096, 4096,
           {"pp": 16, "dp": 16, "ep": 8, "etp": 1, "recompute": "selective"},
           execution=MX | DSV3_OPT | DSV3_ROUTING | {"moe_dispatcher": "deepep", "recompute_modules": ["mla_up_proj"]},
           file="b200", notes=[MOE_BAL, DSV3_GROUPS, "MXFP8 (block scales computed in the cast: 3 bytes per element)",
                               DSV3_OPT_NOTE, "HybridEP without all-to-all overlap and selective recompute of MLA's "
                               "up-projections, as the 26.04 release sets (Megatron-Bridge v0.4.0 scripts/performance/"
                               "configs/deepseek/deepseek_workload_base_configs.py B200_V1/V2, deepseek_llm_pretrain.py)"]),
    bridge("mb2511-llama31-405b-128xb200-fp8cs", "llama3-405b", "dgx-b200", 128, 8192, 64,
           {"tp": 4, "pp": 8, "cp": 2, "vpp": 8, "dp": 2}, file="b200"),
    bridge("mb2511-llama3-8b-8xb200-fp8cs", "llama3-8b", "dgx-b200", 8, 8192, 128,
           {"dp": 8, "micro_batch": 2}, file="b200"),
    bridge("mb2604-gpt-oss-120b-64xb200-bf16", "gpt-oss-120b", "dgx-b200", 64, 4096, 1280,
           {"dp": 64, "ep": 8, "etp": 1, "micro_batch": 4, "recompute": "selective"}, dtype="bf16", file="b200",
           execution={"recompute_modules": ["layernorm", "moe_act"], "moe_dispatcher": "deepep"},
           notes=[MOE_BAL, "selective recompute of layernorm and the MoE activation, as the recipe sets "
                  "(Megatron-Bridge perf_recipes/gpt_oss/b200/gpt_oss.py)",
                  "HybridEP (flex) dispatch without all-to-all overlap: the 26.04 table ran Megatron-Bridge v0.4.0, "
                  "whose scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py gives the B200 BF16 V2 "
                  "config moe_flex_dispatcher_backend='hybridep' (all-to-all only from 14b537eac, 2026-05-05)"],
           regression=PUBLISHER_ISSUES["26.04", "dgx-b200", "gpt-oss-120b", "BF16"]),
    # -- GB200 NVL72, Megatron-Bridge and the MoE ModelZoo -----------------------------------------------------
    bridge("mb2606-llama31-405b-256xgb200-fp8", "llama3-405b", "gb200-nvl72", 256, 8192, 1536,
           {"tp": 4, "pp": 16, "vpp": 4, "dp": 4}, file="gb200"),
    bridge("mb2604-llama3-70b-64xgb200-fp8-fsdp", "llama3-70b", "gb200-nvl72", 64, 8192, 256,
           {"dp": 64, "micro_batch": 2, "zero": 3, "offload": {"activations": 0.5}}, file="gb200",
           regression=PUBLISHER_ISSUES["26.04", "gb200-nvl72", "llama3-70b", "FP8_CS"], notes=[
               "Megatron-FSDP as ZeRO-3", "the recipe's CPU activation offload of 40 of 80 layers as half of the "
               "activations in Grace memory"]),
    bridge("mb2604-llama3-70b-64xgb200-mxfp8", "llama3-70b", "gb200-nvl72", 64, 8192, 256,
           {"tp": 2, "pp": 4, "vpp": 5, "dp": 8}, execution=MX, file="gb200",
           notes=["MXFP8 (the recipe's fp8_mx precision)", "TP communication overlapped by userbuffers, no recompute, "
                  "as the recipe sets (perf_recipes/llama/gb200/llama3.py llama3_70b_pretrain_64gpu_gb200_fp8mx_config)"]),
    bridge("mb2606-deepseek-v3-256xgb200-mxfp8", "deepseek-v3", "gb200-nvl72", 256, 4096, 4096,
           {"pp": 4, "vpp": 4, "dp": 64, "ep": 64, "etp": 1, "recompute": "selective"},
           execution=MX | HYBRIDEP_OVERLAP | DSV3_OPT | CUTEDSL_MLP | DSV3_ROUTING
           | {"recompute_modules": ["mla_up_proj"]},
           file="gb200", notes=[MOE_BAL, DSV3_GROUPS, "selective recompute of MLA's up-projections, as the recipe "
                                "sets", HYBRIDEP_NOTE + " (perf_recipes/deepseek/common.py)", DSV3_OPT_NOTE,
                                MLP_NOTE % "deepseek/deepseek_workload_base_configs.py "
                                "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V1"]),
    bridge("mb2511-deepseek-v3-256xgb200-bf16", "deepseek-v3", "gb200-nvl72", 256, 4096, 4096,
           {"pp": 4, "vpp": 4, "dp": 64, "ep": 64, "etp": 1, "recompute": "selective"}, dtype="bf16",
           execution=DSV3_OPT | DSV3_ROUTING | {"recompute_modules": ["mla_up_proj"], "moe_dispatcher": "deepep"},
           file="gb200", notes=[MOE_BAL, DSV3_GROUPS, "selective recompute of MLA's up-projections, as the recipe "
                                "sets (Megatron-Bridge perf_recipes/deepseek/gb200/deepseek_v3.py)", DSV3_HYBRIDEP,
                                DSV3_OPT_NOTE],
           mtp=False),
    bridge("mb2606-qwen3-235b-a22b-256xgb200-mxfp8", "qwen3-235b-a22b", "gb200-nvl72", 256, 4096, 8192,
           {"pp": 8, "vpp": 3, "dp": 32, "ep": 32}, execution=MX | HYBRIDEP_OVERLAP | CUTEDSL_MLP | FP8_ATTENTION,
           file="gb200", notes=[MOE_BAL, HYBRIDEP_NOTE + " (perf_recipes/qwen/common.py)",
                                MLP_ATTENTION_NOTE % "qwen/qwen3_workload_base_configs.py "
                                "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2"]),
    bridge("mb2606-qwen3-30b-a3b-8xgb200-mxfp8", "qwen3-30b-a3b", "gb200-nvl72", 8, 4096, 512,
           {"dp": 8, "ep": 8, "micro_batch": 4}, execution=MX | HYBRIDEP_OVERLAP | CUTEDSL_MLP | FP8_ATTENTION,
           file="gb200", notes=[MOE_BAL, HYBRIDEP_NOTE + " (perf_recipes/qwen/common.py)",
                                MLP_ATTENTION_NOTE % "qwen/qwen3_workload_base_configs.py "
                                "QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1"]),
    ("mz-qwen3-235b-256xgb200-bf16-pp8-ep8", {
        "file": "gb200", "hardware": "gb200-nvl72", "devices": 256, "model": "qwen3-235b-a22b", "seq_len": 4096,
        "global_batch": 8192, "stack": MC, "execution": MZ_GRADS | {"moe_dispatcher": "deepep"},
        "strategy": as_run_split({"pp": 8, "dp": 32, "ep": 8, "micro_batch": 1, "zero": 1, "recompute": "none"},
                                 "qwen3-235b-a22b"),
        "variants": ({"step_s": 25.83},),
        "notes": [MOE_BAL, "HybridEP dispatch (DISPATCHER=hybridep in the command) without all-to-all overlap",
                  "step time derived by the row from 750 TFLOP/s with the FLOPs per token of the H100 rows",
                  MZ_GRADS_NOTE, ACCOUNTED_NOTE]}),
    bridge("mb2604-gpt-oss-120b-64xgb200-bf16", "gpt-oss-120b", "gb200-nvl72", 64, 4096, 1280,
           {"dp": 64, "ep": 64, "etp": 1, "micro_batch": 4, "recompute": "selective"}, dtype="bf16", file="gb200",
           execution={"recompute_modules": ["layernorm", "moe_act"], "moe_dispatcher": "deepep",
                      "overlap_ep_comm": True},
           notes=[MOE_BAL, "selective recompute of layernorm and the MoE activation, HybridEP (flex) dispatch with "
                  "the expert all-to-all overlapped, no CUDA graphs, as the 26.04 table's Megatron-Bridge v0.4.0 "
                  "sets (scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py "
                  "GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2: moe_flex_dispatcher_backend='hybridep', "
                  "moe_a2a_overlap=True)"]),
])

SPECS |= table([
    # -- Ascend 910B, MindSpeed-LLM ---------------------------------------------------------------------------
    ascend("mindspeed-llama2-7b-8npu", "llama2-7b", 8, 4096, 256, {"pp": 2, "dp": 4, "zero": 1},
           notes=["distributed optimizer and overlapped gradient reduction, as the row states",
                  "parameter all-gather overlapped too: the script of the commit that published the figure "
                  "(b2915bd2, examples/llama2/pretrain_llama2_7b_ptd.sh) passes --overlap-param-gather"]),
    ascend("mindspeed-llama3-8b-8npu", "llama3-8b", 8, 8192, 64, {"tp": 8, "micro_batch": 2, "sp": True}),
    ascend("mindspeed-llama2-70b-32x910b-bf16", "llama2-70b", 32, 4096, 1024,
           {"tp": 8, "pp": 4, "vpp": 4, "dp": 1, "sp": True},
           notes=["MC2 (fused matmul and collective) as overlapped TP communication"]),
    ascend("mindspeed-llama3-70b-64x910b-bf16", "llama3-70b", 64, 8192, 512, {"tp": 8, "pp": 8, "dp": 1, "sp": True}),
    ascend("mindspeed-qwen3-30b-a3b-16x910b-bf16", "qwen3-30b-a3b", 16, 4096, 256,
           {"pp": 2, "dp": 8, "ep": 8, "recompute": "full", "zero": 1},
           notes=["recompute 'full, uniform, 1 layer' recomputes every layer",
                  "distributed optimizer (--use-distributed-optimizer in examples/mcore/qwen3_moe/"
                  "pretrain_qwen3_30b_a3b_4K_ptd.sh)",
                  "real (auxiliary-loss) routing, not forced balance: costed as a learned router, the busiest "
                  "of the 8 expert-parallel ranks at the load spread fitted on Qwen3-235B's dropless H100 runs "
                  "(the same 128 experts, top-8; another model and hardware: an assumption)"]),
])

SPECS["mindspeed-llama2-70b-32x910b-bf16"]["execution"] = {"overlap_tp_comm": True}
SPECS["mindspeed-llama2-7b-8npu"]["execution"] = {"overlap_grad_reduce": True, "overlap_param_gather": True}
SPECS["mindspeed-qwen3-30b-a3b-16x910b-bf16"]["execution"] = {"moe_routing": "learned"}
SPECS |= RECIPE_SPECS | MODELZOO_GB300  # read after every preset was fitted, after every hardware's rows above

#: CUDA graphs, as the configurations that produced the tables set them (Execution.cuda_graphs); every other NVIDIA
#: row ran none (its release's config sets cuda_graph_impl "none" or leaves Megatron-Core's default, "none")
def _whole_step(release: str, config: str) -> tuple[list[str], str]:
    """A run that replays its whole forward-backward path from one CUDA graph, as `release`'s `config` sets."""
    return ["full_iteration"], (f"the whole forward-backward path replayed from one CUDA graph, as the {release} "
                                f"release sets (Megatron-Bridge {config})")


GRAPHS = {
    "mb2511-llama3-8b-8xb200-fp8cs": _whole_step("25.11", "v0.2.0 scripts/performance/configs/llama3/"
                                     "workload_base_configs.py LLAMA3_8B_B200_FP8_CS_BASE_CONFIG: cuda_graph_impl="
                                     "'local', cuda_graph_scope='full_iteration'"),
    "mb2606-deepseek-v3-256xgb200-mxfp8": _whole_step("26.06", "v0.5.0 scripts/performance/configs/deepseek/"
                                          "deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V1:"
                                          " cuda_graph_impl='full_iteration'"),
    "mb2606-qwen3-235b-a22b-256xgb200-mxfp8": _whole_step("26.06", "v0.5.0 scripts/performance/configs/qwen/"
                                              "qwen3_workload_base_configs.py GB200_FP8_MX_V2: "
                                              "cuda_graph_impl='full_iteration'"),
    "mb2606-qwen3-30b-a3b-8xgb200-mxfp8": _whole_step("26.06", "v0.5.0 scripts/performance/configs/qwen/"
                                          "qwen3_workload_base_configs.py QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1:"
                                          " cuda_graph_impl='full_iteration'"),
    "mz-qwen3-235b-256xgb200-bf16-pp8-ep8": (["attn", "moe_router", "moe_preprocess"], "Transformer Engine CUDA graphs "
        "of each layer's attention, router and dispatcher preprocessing, as the run's command sets "
        "(Megatron-MoE-ModelZoo 020b8136 best_practice/qwen3/run_gb200_235b.sh: --cuda-graph-impl transformer_engine "
        "--cuda-graph-scope attn moe_router moe_preprocess)"),
    "mb2511-deepseek-v3-256xgb200-bf16": (["moe_router", "moe_preprocess"], "Transformer Engine CUDA graphs of each MoE "
        "layer's router and dispatcher preprocessing, as the 25.11 release's config sets (Megatron-Bridge v0.2.0 "
        "scripts/performance/configs/deepseek/workload_base_configs.py DEEPSEEK_V3_GB200_BASE_CONFIG); ASSUMPTION: "
        "kept by the run, whose global batch (4096) is not the config's (2048), so it overrode some settings"),
}
for _rid, (_scopes, _note) in GRAPHS.items():
    SPECS[_rid]["execution"] = {**SPECS[_rid].get("execution", {}), "cuda_graphs": _scopes}
    SPECS[_rid]["notes"] = [*SPECS[_rid]["notes"], _note]
