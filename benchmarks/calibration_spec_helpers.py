"""What the calibration specs (`calibration_specs.py`) share: the stacks' names, the notes that say where a
value comes from, and a builder per source's table layout (Narayanan et al., NeMo, Megatron-LM's scaling runs,
Megatron-Bridge, torchtitan, MindSpeed-LLM), each filling in what that source's runs have in common.
"""

from __future__ import annotations

from planner.costing.pipeline_cut import accounted_split, layout_chunks

MC = "megatron-core"
MC24 = "megatron-core-2024"
NEMO_FP8 = "FP8: Transformer Engine delayed scaling, NeMo 24.07's default recipe"
NOT_STATED = "recompute not stated: none, as NeMo's dense performance recipes set (NeMo recipes, helpers.py)"
DIST_OPT = "distributed optimizer (ZeRO-1), NeMo's default"
CS: dict = {}
CS_NOTE = "FP8 by per-tensor current scaling (the stack's recipe)"
MX = {"fp8_recipe": "mxfp8"}  # its cast bytes the recipe's (planner/costing/execution.py RECIPE_CAST_BYTES)
#: Megatron-Bridge's GB200 MXFP8 MoE recipes (the layouts of the 26.06 rows): HybridEP dispatch and the expert
#: all-to-all overlapped with the other micro-batch's compute
HYBRIDEP_OVERLAP = {"moe_dispatcher": "deepep", "overlap_ep_comm": True}
#: The CuTe DSL fused grouped MLP a 26.06-on preset sets (cutedsl_fused_grouped_mlp): one grouped kernel a projection,
#: gpt-oss's clamps and output bias inside it (Transformer Engine's op fuser: ScaledClampedQGeGLU's limit, the bias
#: scaled by the routing probability in GroupedLinear's scale_bias; megatron/core/transformer/moe/experts.py on main
#: of 2026-08-22, TE v2.15 on); the activation itself is costed unfused (not costed: its fusion into the GEMMs)
CUTEDSL_MLP = {"glu_clamp_bytes": 0.0, "glu_clamp_grad_bytes": 0.0, "expert_bias_bytes": 0.0,
               "expert_bias_grad_bytes": 0.0, "expert_gemm_streams": 0}
#: A preset's fp8_dot_product_attention: the flash kernel in the recipe's FP8 format (Execution.fp8_attention)
FP8_ATTENTION = {"fp8_attention": True}
#: What a 26.06 preset sets beside its layout (%s: its file and name under Megatron-Bridge v0.5.0
#: scripts/performance/configs)
MLP_NOTE = ("the CuTe DSL fused grouped MLP, as the 26.06 release's preset sets (cutedsl_fused_grouped_mlp; Megatron-"
            "Bridge v0.5.0 scripts/performance/configs/%s): one grouped kernel a projection, its activation costed "
            "unfused")
MLP_ATTENTION_NOTE = MLP_NOTE + (", and attention in MXFP8 as it sets fp8_dot_product_attention, at the hardware's "
                                 "measured MXFP8 attention figures")
HYBRIDEP_NOTE = ("HybridEP dispatch with the expert all-to-all overlapped (overlap_moe_expert_parallel_comm), as "
                 "the recipe's full-iteration MXFP8 settings set")
#: Rows whose publisher calls them a regression in its own tracker rather than in a footnote, by (release, hardware,
#: model, precision; None: every precision), with its words: neither fitted nor scored (`Run.known_regression`). Only
#: what an issue names: #1998, still open, names 25.11 (its 26.02 rows ran the same dropless path at the same pace, B200
#: 9,691 tokens/s against 9,299, and stay scored); #3387 and #3388, filed on the 26.04 tables with the 26.04.01 patch
#: as their label, name those tables' rows (B200 13,722 -> 13,045 tokens/s, GB200 4,357 -> 4,143 from 26.02.01: the 5 %
#: each issue states), not the patch's.
PUBLISHER_ISSUES = {
    ("25.11", "dgx-b200", "qwen3-30b-a3b", None):
        "NVIDIA-NeMo/Megatron-Bridge#1998, '[Regression] Low QWEN3 30B B200 and H100 performance with dropless' "
        "(2026-01-20): 'We have 2X slower performance in QWEN3 30B on H100 and B200 with the dropless schedule "
        "compared to the token-drop schedule. Basically, the perf in 25.11 is 2X slower than 25.09.'",
    ("26.04", "dgx-b200", "gpt-oss-120b", "BF16"):
        "NVIDIA-NeMo/Megatron-Bridge#3387, '[bug] [patch] GPT-OSS BF16 B200 regression' (2026-04-17): '5% regression "
        "compared to previous patch'; 2026-04-29: 'changing back to moe_token_dispatcher_type=\"alltoall\" recovers "
        "the regression.'",
    ("26.04", "gb200-nvl72", "llama3-70b", "FP8_CS"):
        "NVIDIA-NeMo/Megatron-Bridge#3388, '[bug] [patch] LM70B FP8 CS GB200 regression' (2026-04-17): '5% regression "
        "comparing to previous release'",
}


def publisher_issue(release: str, hardware: str, model: str, precision: str) -> str:
    """The publisher's tracker sentence saying a bug slowed this table row (`PUBLISHER_ISSUES`), or ""."""
    return PUBLISHER_ISSUES.get((release, hardware, model, precision),
                                PUBLISHER_ISSUES.get((release, hardware, model, None), ""))


TT_EAGER = {"fuse_elementwise": False}
AUTOMODEL_MOE = {"moe_routing": "contiguous", "grad_bytes": 4.0, "loss_kernel": "torch_16bit"}
AUTOMODEL_MOE_GRADS = ("gradients reduce-scattered in fp32: Automodel's MoE parallelizer defaults to "
                       "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32) (components/moe/parallelizer.py); "
                       "the loss MaskedCrossEntropy with fp32_upcast: false, as the MoE benchmark configs set "
                       "(examples/llm_benchmark/)")
AUTOMODEL_NOTE = "NeMo Automodel: PyTorch FSDP2 with Transformer Engine kernels (the torchtitan stack, cuDNN attention)"
FAKE_GATE = ("routing by Automodel's FakeBalancedGate (nemo_automodel/components/moe/layers.py): token i takes "
             "the k consecutive experts from i*k, so its experts sit on one or two ranks")
DSV3_HYBRIDEP = ("HybridEP (flex) dispatch: the DeepSeek-V3 perf recipes build on recipes/deepseek/h100/"
                 "deepseek_v3.py, which ends in apply_flex_dispatcher_backend(model, 'hybridep')")
#: Megatron-Bridge's DeepSeek-V3 recipes run the precision-aware optimizer with bf16 Adam moments beside fp32
#: master weights (recipes/deepseek/deepseek_v3.py: use_precision_aware_optimizer, exp_avg_dtype bf16): 4 + 2 + 2
DSV3_OPT = {"optimizer_bytes": 8.0}
DSV3_OPT_NOTE = ("precision-aware optimizer: fp32 master weights, bf16 Adam moments (Megatron-Bridge "
                 "recipes/deepseek/deepseek_v3.py), 8 bytes of state per parameter")
#: Megatron-Bridge's DeepSeek-V3 recipes train with one multi-token-prediction depth (recipes/deepseek/deepseek_v3.py:
#: cfg.model.mtp_num_layers = 1, every tag v0.2.0-v0.6.0; a table row headed "DeepSeekV3 (w/o MTP)" ran without it)
#: and lay the pipeline out by hand: the layout a preset names
#: (pp_layout; the 25.09 H100 and the GB300 presets), else the recipe's by (pp, vpp)
#: (set_deepseek_v3_pipeline_model_parallel_layout, the same map in every tag v0.3.0-v0.6.0): the embedding with the
#: first chunk's layers, the MTP depth and the loss with the last chunk's
DSV3_MTP = {"mtp_layers": 1}
DSV3_LAYOUTS = {(4, 1): "Et*16|t*16|t*16|t*13mL", (8, 1): "Et*8|(t*8|)*6t*5mL", (4, 2): "Et*8|(t*8|)*6t*5mL",
                (16, 1): "Et*4|(t*4|)*14tmL", (8, 2): "Et*4|(t*4|)*14tmL", (4, 4): "Et*4|(t*4|)*14tmL"}


def dsv3_as_run(strategy: dict, layout: str | None = None, mtp: bool = True) -> tuple[dict, str]:
    """`strategy` with DeepSeek-V3's pipeline laid out as its Megatron-Bridge recipe runs it (`layout`, else
    `DSV3_LAYOUTS` by pp and vpp; unchanged without a pipeline) and the note that says so. With `mtp`, costed with
    the zoo's MTP depth (`DSV3_MTP`), the model's last layer, which the layout's 'm' counts; without (a row its table
    heads "w/o MTP"), the recipe's map drops the 'm' (its last_layer is the loss alone when mtp_num_layers is 0)."""
    pp, vpp = strategy.get("pp", 1), strategy.get("vpp", 1)
    depth = ("one multi-token-prediction depth (the recipe's mtp_num_layers = 1)" if mtp else
             "no multi-token-prediction depth (its table: w/o MTP)")
    if pp == 1:
        return strategy, f"as run: {depth}"
    text = layout or DSV3_LAYOUTS.get((pp, vpp))
    if text is None:
        raise ValueError(f"DeepSeek-V3 on pp {pp} x vpp {vpp}: no layout given and none in the recipe's map")
    text = text if mtp else text.replace("m", "")
    split = layout_chunks(text)
    if len(split) != pp * vpp:
        raise ValueError(f"layout {text} has {len(split)} chunks, not pp x vpp = {pp * vpp}")
    return strategy | {"stage_layers": list(split)}, (
        f"as run: {depth} and the pipeline layout {text} "
        f"({'the preset' if layout else 'Megatron-Bridge recipes/deepseek/deepseek_v3.py'}'s) as stage_layers")


#: Models whose recipes split the pipeline counting the embedding and the loss as a layer each, with their layers:
#: Megatron-Bridge's (account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split in
#: recipes/llama/llama3.py llama31_405b_pretrain_config and recipes/qwen/qwen3_moe.py qwen3_235b_a22b_pretrain_config,
#: every tag v0.2.0-v0.5.1; the perf recipes build on them) and the ModelZoo's Qwen3-235B
#: (model_configs/benchmarking/Qwen3-235B-A22B.yaml passes both flags, since it was added in b06a6d8, 2025-05-26)
ACCOUNTED_LAYERS = {"llama3-405b": 126, "qwen3-235b-a22b": 94}
ACCOUNTED_NOTE = ("the recipe's pipeline split (stage_layers): the embedding and the loss count as a layer each "
                  "(account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split), one layer fewer in "
                  "the first and the last chunk")


def as_run_split(strategy: dict, model: str) -> dict:
    """`strategy` with the accounted split of `model`'s layers over its pp x vpp chunks (`ACCOUNTED_LAYERS`)."""
    split = accounted_split(ACCOUNTED_LAYERS[model], strategy.get("pp", 1) * strategy.get("vpp", 1))
    if split is None:
        raise ValueError(f"{model}: {ACCOUNTED_LAYERS[model]} layers + 2 do not divide over the chunks of {strategy}")
    return strategy | {"stage_layers": list(split)}


#: DeepSeek-V3's group-limited routing as the execution takes it (what DSV3_GROUPS says)
DSV3_ROUTING = {"moe_group_limit": 4, "moe_groups": 8}
DSV3_GROUPS = ("DeepSeek-V3's node-limited routing: experts in 8 groups, each token in at most 4 "
               "(its config's n_group and topk_group; Megatron's router applies them to forced-balance logits)")
#: NeMo 24.07's launcher configs train with Apex's distributed_fused_adam, which NeMo sets to keep the 16 bits an
#: fp32 master weight adds to the bf16 one (store_param_remainders) rather than the fp32 copy: 2 + 4 + 4 bytes
APEX_ADAM = {"optimizer_bytes": 10.0}
APEX_ADAM_NOTE = ("optimizer distributed_fused_adam (NeMo-Framework-Launcher conf/training): Apex keeps the fp32 "
                  "master weight's low 16 bits beside the bf16 weight (NeMo megatron_base_model.py: "
                  "store_param_remainders for bf16 weights and an fp32 optimizer), 10 bytes of state per parameter")
LLAMA2_13B = {"hidden": 5120, "layers": 40, "heads": 40, "kv_heads": 40, "ffn": 13824}
GPT3_20B = {"hidden": 6144, "layers": 44, "heads": 48}
MOE_BAL = "routing forced balanced and dropless, as the source states: the balanced case this model costs"
A2A_NOTE = ("NCCL's all-to-all dispatcher: the release's preset for the row sets no flex backend "
            "(moe_flex_dispatcher_backend None, tests/data/bridge_sweep.json)")
MOE_BAL_ASSUMED = ("routing taken as forced balanced and dropless, as the table's other rows run it (this row does"
                   " not say): the balanced case this model costs")
#: The Megatron MoE ModelZoo runs Megatron-LM's own training script: BF16 gradients are accumulated and reduced in
#: fp32 unless --grad-reduce-in-bf16, which its scripts never pass (megatron/training/arguments.py)
MZ_GRADS = {"grad_bytes": 4.0}
MZ_GRADS_NOTE = ("gradients reduced in fp32, Megatron-LM's default for BF16 (arguments.py: "
                 "accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16, which the ModelZoo's scripts do "
                 "not pass)")
#: ... and its H100 tables predate --tp-comm-overlap in sbatch_benchmarking.sh (added 2025-12-16, b09773a; the
#: 4k rows are of 2025-05-27, 8017e11, the 128k rows of 2025-11-04, b0b92ff)
MZ_H100 = MZ_GRADS | {"overlap_tp_comm": False}
MZ_H100_NOTE = MZ_GRADS_NOTE + ("; TP communication not overlapped: the table predates --tp-comm-overlap in the "
                                "ModelZoo's sbatch_benchmarking.sh (b09773a, 2025-12-16)")
TT = "torchtitan"
GT = "h100-grand-teton"
TT_NOTE = "torchtitan on Meta's Grand Teton H100s (96 GB HBM2e, 500 W)"
ASYNC = {"overlap_tp_comm": True}
#: FSDP2's FP8 weight all-gather, set where the row's config sets it (llama3_405b.toml: enable_fsdp_float8_all_gather
#: and precompute_float8_dynamic_scale_for_fsdp; off by default, and off in the 8B and 70B configs)
FP8_AG = {"fp8_all_gather": True}
#: torchtitan compiles its loss with the model from 2025-04 (components/loss.py build_cross_entropy_loss, at
#: bbb1b616e): rows run after that with compile on
TT_COMPILED_LOSS = {"loss_kernel": "torch_compiled"}
#: ... and before that its loss ran eager (train.py at ba24697, 2024-12: torch.compile of loss_fn commented out)
TT_EAGER_LOSS = {"loss_kernel": "torch"}
TT_EAGER_LOSS_NOTE = ("the loss eager, as torchtitan's train.py of 2024 ran it (its torch.compile of the loss "
                      "commented out)")
TT_COMPILED_LOSS_NOTE = ("the loss compiled with the model, as torchtitan did from 2025-04 with compile on "
                         "(components/loss.py build_cross_entropy_loss)")
MS = "mindspeed"
MS_NOTE = "MindSpeed-LLM's example script at the same commit: flash attention, fused RMSNorm/SwiGLU/RoPE"


def mz_long_context(seq: int, tflops: int) -> tuple[str, dict]:
    """A row of the ModelZoo's Qwen3-235B long-context table on 256 H100s: TP4, PP8 (VPP 4), EP8, the context-parallel
    degree following the length (16K tokens a rank), GBS 256; its step the one the row derives from the table's
    forced-balance TFLOP/s with Megatron's causal FLOP formula (`derived.step_s_forced_balance`)."""
    cp = seq // 16384
    return (f"mz-qwen3-235b-256xh100-bf16-{seq // 1024}k-cp{cp}", {
        "file": "h100", "hardware": "dgx-h100", "devices": 256, "model": "qwen3-235b-a22b", "seq_len": seq,
        "global_batch": 256, "stack": MC, "execution": MZ_H100 | {"moe_dispatcher": "deepep",
                                                                  "recompute_modules": ["layernorm", "moe"]},
        "strategy": as_run_split({"tp": 4, "cp": cp, "pp": 8, "vpp": 4, "dp": 8 // cp, "ep": 8, "etp": 1,
                                  "micro_batch": 1, "sp": True, "zero": 1, "recompute": "selective"},
                                 "qwen3-235b-a22b"),
        "variants": ({"derived": "step_s_forced_balance", "what": "forced balance"},),
        "notes": [MOE_BAL, f"step time derived by the row from {tflops} TFLOP/s with Megatron's causal FLOP formula",
                  "selective recompute of layernorm and the MoE block, as the command line sets",
                  "expert tensor parallelism 1, as the ModelZoo's model_configs/benchmarking/Qwen3-235B-A22B.yaml "
                  "sets (--expert-tensor-parallel-size 1; Megatron's default would be the tensor degree, 4)",
                  MZ_H100_NOTE, ACCOUNTED_NOTE]})


def a100(rid, h, layers, heads, gpus, batch, tp, pp, dp, recompute, vpp=1, mb=None, sp=False, notes=()):
    strategy = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb if mb else (1 if pp > 1 else "largest fitting"),
                "recompute": recompute, "sp": sp, "zero": 0}
    if vpp > 1:
        strategy["vpp"] = vpp
    extra = [] if mb else ["micro-batch not stated: 1 with a pipeline, else the largest of 8, 4, 2, 1 that fits"]
    return rid, {"file": "a100", "hardware": "dgx-a100", "devices": gpus, "model": "gpt",
                 "overrides": {"hidden": h, "layers": layers, "heads": heads, "vocab": 51200}, "seq_len": 2048,
                 "global_batch": batch, "stack": "megatron-2021", "strategy": strategy, "notes": extra + list(notes)}


def table(rows):
    return dict(rows)


NEMO_FUSED_CE = {"loss_kernel": "megatron_fused"}
NEMO_FUSED_CE_NOTE = ("cross_entropy_loss_fusion: true, as its NeMo-Framework-Launcher 24.07 config sets "
                      "(launcher_scripts/conf/training/llama/)")


#: NeMo's 2024 launcher ran Transformer Engine with cuDNN's fused attention off, so TE took its FlashAttention-2
#: backend: NeMo-Framework-Launcher's launcher_scripts/conf/config.yaml set NVTE_FUSED_ATTN: 0 ("Disable cudnn FA until
#: we've tested it more") from 562dcb45 (2024-02-13) to 04b8d098 (2024-08-29), but for GPT-3 175B, whose script set
#: NVTE_FUSED_ATTN=1 from 95c77b59 (2024-07-17, "Enable cuDNN FlashAtt only for 175B")
NEMO_FA2 = {"attention_kernel": "flash2"}
NEMO_FA2_NOTE = ("attention by FlashAttention-2: NeMo-Framework-Launcher's conf/config.yaml set NVTE_FUSED_ATTN: 0 for "
                 "the NeMo 24.03 and 24.07 runs (562dcb45 to 04b8d098), so Transformer Engine skipped cuDNN's kernel")
NEMO_CUDNN_NOTE = ("attention by cuDNN: the 175B's launch script set NVTE_FUSED_ATTN=1 (NeMo-Framework-Launcher "
                   "95c77b59, 'Enable cuDNN FlashAtt only for 175B')")
#: NeMo 24.03.01's long-sequence table for Llama 2 7B on DGX H100 (tests/data/more_runs.json): the sequence (K tokens),
#: GPUs, global batch, TP, PP, DP and CP of each row
NEMO_LONG_SEQUENCE = ((4, 4, 1024, 1, 1, 4, 1), (8, 8, 512, 1, 2, 4, 1), (16, 16, 256, 2, 1, 8, 1),
                      (32, 32, 128, 2, 1, 8, 2), (64, 64, 64, 4, 1, 8, 2), (128, 128, 32, 4, 1, 8, 4),
                      (256, 256, 16, 4, 1, 8, 8), (512, 512, 8, 8, 1, 4, 16), (1024, 1024, 4, 8, 1, 4, 32))


def nemo_long_sequence() -> list[tuple[str, dict]]:
    """The long-sequence table's rows as runs, each its step time from the TFLOP/s the table gives (the row's
    `derived`: NeMo's model-FLOPs formula, attention counted whole); micro-batch 1, no recompute (not stated)."""
    out = []
    for k, gpus, batch, tp, pp, dp, cp in NEMO_LONG_SEQUENCE:
        rid, spec = nemo(f"nemo2403-longseq-llama2-7b-{k}k-h100-fp8", "llama2-7b", gpus, k * 1024, batch, tp, pp, cp,
                         1, dp, 1, notes=["micro-batch not stated: 1", "NeMo 24.03.01 (not 24.07): ASSUMPTION, its "
                                          "launcher's defaults as 24.07's, FP8 delayed scaling and Apex's Adam"])
        spec |= {"row": "nemo2403-longseq-llama2-7b-h100-fp8",
                 "variants": ({"derived": f"step_s_{k}k", "what": f"{k}K tokens"},)}
        out.append((rid, spec))
    return out


def nemo(rid, model, gpus, seq, batch, tp, pp, cp, vpp, dp, mb, tp_overlap=None, overrides=None, notes=(),
         fused_ce=False):
    strategy = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "micro_batch": mb, "sp": tp > 1, "zero": 1,
                "recompute": "none"}
    if vpp > 1:
        strategy["vpp"] = vpp
    spec = {"file": "h100", "hardware": "dgx-h100", "devices": gpus, "model": model, "seq_len": seq,
            "global_batch": batch, "dtype": "fp8", "stack": MC24, "strategy": strategy,
            "execution": dict(APEX_ADAM), "notes": [NEMO_FP8, NOT_STATED, DIST_OPT, APEX_ADAM_NOTE] + list(notes)}
    if overrides:
        spec["overrides"] = overrides
    if tp_overlap is not None:
        spec["execution"]["overlap_tp_comm"] = tp_overlap
    if fused_ce:
        spec["execution"] |= NEMO_FUSED_CE
        spec["notes"].append(NEMO_FUSED_CE_NOTE)
    if model == "gpt3-175b":
        spec["notes"].append(NEMO_CUDNN_NOTE)
    else:
        spec["execution"] |= NEMO_FA2
        spec["notes"].append(NEMO_FA2_NOTE)
    return rid, spec


def ws(size, gpus, batch, h, layers, heads, tp, pp, step):
    return f"megatron-ws-gpt-{size}-{gpus}xh100-bf16", {
        "file": "h100", "hardware": "dgx-h100", "devices": gpus, "model": "gpt",
        "overrides": {"hidden": h, "layers": layers, "heads": heads, "vocab": 131072}, "seq_len": 4096,
        "global_batch": batch, "stack": MC24, "execution": {"grad_bytes": 4.0},
        "strategy": {"tp": tp, "pp": pp, "dp": 48, "micro_batch": 1 if pp > 1 else "largest fitting",
                     "sp": tp > 1, "zero": 1, "recompute": "none"},
        "variants": ({"step_s": step},),
        "notes": ["Megatron-Core r0.8 with --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap and the "
                  "distributed optimizer, as the README's benchmark section says; fp32 gradient accumulation "
                  "(Megatron-LM's default)", "micro-batch, vpp and recompute not stated: 1 with a pipeline (else the "
                  "largest of 8, 4, 2, 1 that fits), no interleaving, no recompute",
                  "step time derived by the row from TFLOP/s with Megatron's FLOP formula and ffn = 4h"]}


def bridge(rid, model, hw, gpus, seq, batch, strategy, dtype="fp8", execution=None, notes=(), file="h100",
           corrects=None, layout=None, mtp=True, regression=""):
    strategy = {"micro_batch": 1, "zero": 1, "recompute": "none"} | strategy
    strategy.setdefault("sp", strategy.get("tp", 1) > 1)
    if model in ACCOUNTED_LAYERS and strategy.get("pp", 1) > 1:
        strategy, notes = as_run_split(strategy, model), [*notes, ACCOUNTED_NOTE]
    if model == "deepseek-v3":
        strategy, note = dsv3_as_run(strategy, layout, mtp)
        notes = [*notes, note]
    ex = (CS if dtype == "fp8" else {}) | (execution or {})
    base = [CS_NOTE] if dtype == "fp8" and "fp8_recipe" not in (execution or {}) else []
    base += [DIST_OPT + " (Megatron-Bridge recipes)"] if strategy["zero"] == 1 else []
    spec = {"file": file, "hardware": hw, "devices": gpus, "model": model, "seq_len": seq, "global_batch": batch,
            "dtype": dtype, "stack": MC, "strategy": strategy, "notes": base + list(notes)}
    if ex:
        spec["execution"] = ex
    if model == "deepseek-v3" and mtp:
        spec["overrides"] = DSV3_MTP
    if corrects:
        spec["corrects"] = corrects  # a table column the code that produced the figure contradicts (notes say why)
    if regression:
        spec["known_regression"] = regression  # the publisher's sentence that a bug slowed the row (`PUBLISHER_ISSUES`)
    return rid, spec


def titan(rid, model, gpus, batch, strategy, variants, notes=(), seq=8192, hardware=GT, file="h100-96gb",
          row=None):
    spec = {"file": file, "hardware": hardware, "devices": gpus, "model": model, "seq_len": seq,
            "global_batch": batch, "stack": TT, "strategy": {"zero": 3} | strategy, "variants": variants,
            "notes": [TT_NOTE if hardware == GT else "torchtitan"] + list(notes)}
    if hardware == GT:  # the benchmarks of 2024: the loss eager
        spec["execution"] = dict(TT_EAGER_LOSS)
        spec["notes"].append(TT_EAGER_LOSS_NOTE)
    if row:
        spec["row"] = row
    return rid, spec


def ascend(rid, model, npus, seq, batch, strategy, notes=(), row=None):
    spec = {"file": "ascend-910b", "hardware": "ascend-910b", "devices": npus, "model": model, "seq_len": seq,
            "global_batch": batch, "stack": MS, "strategy": {"micro_batch": 1, "recompute": "none"} | strategy,
            "notes": [MS_NOTE] + list(notes)}
    if row:
        spec["row"] = row
    return rid, spec


def asynctp_variants(bf16, bf16_async, fp8, fp8_async):
    """The four runs of one layout in torchtitan's asyncTP benchmark (tokens/s per GPU): BF16 and FP8 tensorwise,
    each with vanilla and async TP."""
    return ({"suffix": "-vanilla", "tokens_per_s": bf16, "what": "BF16, vanilla TP"},
            {"suffix": "-async", "tokens_per_s": bf16_async, "what": "BF16, async TP", "execution": ASYNC},
            {"suffix": "-fp8-vanilla", "tokens_per_s": fp8, "dtype": "fp8", "what": "FP8 tensorwise, vanilla TP"},
            {"suffix": "-fp8-async", "tokens_per_s": fp8_async, "dtype": "fp8", "what": "FP8 tensorwise, async TP",
             "execution": ASYNC})
