"""Reading Megatron-Bridge's preset functions (v0.6.0 on) without running them (benchmarks/bridge_perf_recipes.py)."""

from __future__ import annotations

import json

from benchmarks.bench_bridge_sweep import DATA
from benchmarks.bridge_perf_recipes import code_of, preset_fields, preset_settings, recipe_functions

ROWS = json.loads(DATA.read_text(encoding="utf-8"))["rows"]

# Two modules in v0.6.0's shape (perf_recipes/<family>/common.py and perf_recipes/<family>/<gpu>/<model>.py),
# written here to pin the reading rules on a small case
COMMON = '''
from megatron.bridge.recipes.toy.toy import toy_pretrain_config
from megatron.bridge.training.comm_overlap import CommOverlapConfig


def _apply_graphs(cfg, *, fp8_dot_product_attention: bool = False, scope=("attn",)):
    cfg.model.cuda_graph_impl = "transformer_engine"
    cfg.model.cuda_graph_scope = list(scope) if scope else []
    cfg.model.cuda_graph_scope = ["attn", "moe_router"]
    cfg.mixed_precision.fp8_dot_product_attention = fp8_dot_product_attention
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    if cfg.model.cuda_graph_impl == "none":
        cfg.model.cuda_graph_scope = ["never"]


def _set_ep(model_cfg, ep):
    model_cfg.expert_model_parallel_size = ep
'''
RECIPE = '''
from megatron.bridge.perf_recipes.toy.common import _apply_graphs, _set_ep, toy_pretrain_config
from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import set_deepseek_v3_pipeline_model_parallel_layout


def toy_pretrain_16gpu_gb200_fp8mx_config():
    cfg = toy_pretrain_config()
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_modules = ["layernorm", "moe_act"]
    cfg.model.tensor_model_parallel_size = 2
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.train.global_batch_size = 256
    cfg.train.micro_batch_size = 4
    _set_ep(cfg.model, 8)
    _apply_graphs(cfg, fp8_dot_product_attention=True)
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model, "Et|(tt|)*2mL")
    cfg.model.recompute_modules = []
    cfg.dataset.seq_length = cfg.model.seq_length
    cfg.env_vars = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": 1, "CUDA_DEVICE_MAX_CONNECTIONS": 32}
    return cfg


def toy_pretrain_16gpu_gb200_fp8mx_large_scale_config():
    return toy_pretrain_16gpu_gb200_fp8mx_config()


def toy_pretrain_16gpu_gb200_bf16_config():
    cfg = toy_pretrain_config()
    cfg.model.pipeline_model_parallel_layout = "Et|tL"
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model)
    return cfg
'''
FILES = {"src/megatron/bridge/perf_recipes/toy/common.py": COMMON,
         "src/megatron/bridge/perf_recipes/toy/gb200/toy.py": RECIPE}


def test_a_preset_function_reads_as_the_fields_it_sets_last():
    s = preset_settings(FILES.__getitem__, "src/megatron/bridge/perf_recipes/toy/gb200/toy.py",
                        "toy_pretrain_16gpu_gb200_fp8mx_config")
    assert s["model.recompute_modules"] == []  # set again after the helper: the last assignment wins
    assert s["model.expert_model_parallel_size"] == 8  # through a helper's parameter bound to cfg.model
    assert s["mixed_precision.fp8_dot_product_attention"] is True  # a keyword argument over its default
    assert s["model.cuda_graph_scope"] == ["attn", "moe_router"]  # an `if` block is not run
    assert s["comm_overlap.tp_comm_overlap"] is False and s["comm_overlap.overlap_moe_expert_parallel_comm"] is True
    assert "dataset.seq_length" not in s  # not a literal: the library recipe's value, not read
    assert s["model.pipeline_model_parallel_layout"] == "Et|(tt|)*2mL"  # a library setter given its value
    plain = preset_settings(FILES.__getitem__, "src/megatron/bridge/perf_recipes/toy/gb200/toy.py",
                            "toy_pretrain_16gpu_gb200_bf16_config")
    assert "model.pipeline_model_parallel_layout" not in plain  # the setter's own map replaces the earlier one
    fields = preset_fields(s, 16, "toy.py")
    assert fields == {"num_gpus": 16, "tensor_model_parallel_size": 2, "expert_model_parallel_size": 8,
                      "global_batch_size": 256, "micro_batch_size": 4, "cuda_graph_impl": "transformer_engine",
                      "cuda_graph_scope": ["attn", "moe_router"], "moe_a2a_overlap": True,
                      "fp8_dot_product_attention": True, "recompute_modules": [], "cutedsl_fused_grouped_mlp": True,
                      "pp_layout": "Et|(tt|)*2mL", "_file": "toy.py"}
    assert code_of(s, "toy.py", "f") == {"_function": "toy.py:f", "moe_token_dispatcher_type": "flex",
                                         "tp_comm_overlap": False}


def test_preset_functions_are_found_by_model_gpu_and_precision():
    found = recipe_functions(FILES.__getitem__, list(FILES), "toy", "gb200", "fp8mx")
    file = "src/megatron/bridge/perf_recipes/toy/gb200/toy.py"
    assert found == {"toy_pretrain_16gpu_gb200_fp8mx_config": (file, 16, ""),
                     "toy_pretrain_16gpu_gb200_fp8mx_large_scale_config": (file, 16, "large_scale")}


def test_the_2608_rows_carry_what_their_v060_functions_set():
    """Read from Megatron-Bridge v0.6.0 (src/megatron/bridge/perf_recipes): GPT-OSS 120B on 64 GB200s sets
    recompute ["layernorm", "moe_act"], then `_apply_gpt_oss_120b_full_iter_fp8mx_configs` and `recompute_modules =
    []` after it; DeepSeek-V3 asks `_enable_deepseek_full_iteration_mxfp8` for FP8 attention on GB300
    (fp8_dot_product_attention=True) and not on GB200 (the keyword's default, False)."""
    later = {(r["model"], r["hardware"]): r for r in ROWS if r["release"] == "26.08"}
    assert len(later) == 8 and all("preset" in r for r in later.values())
    oss = later[("gpt-oss-120b", "gb200-nvl72")]
    assert oss["preset"] == "gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config"
    assert oss["preset_fields"]["recompute_modules"] == []
    assert oss["preset_fields"]["cuda_graph_impl"] == "full_iteration"
    assert oss["code"]["moe_token_dispatcher_type"] == "flex"
    assert later[("deepseek-v3", "gb300-nvl72")]["preset_fields"].get("fp8_dot_product_attention") is True
    assert "fp8_dot_product_attention" not in later[("deepseek-v3", "gb200-nvl72")]["preset_fields"]
    # the GB300 function names its layout (PP2 x VPP8 is not in the recipe's map); GB200's takes the map's
    assert later[("deepseek-v3", "gb300-nvl72")]["preset_fields"]["pp_layout"] == "Et*4|(t*4|)*14tmL"
    assert "pp_layout" not in later[("deepseek-v3", "gb200-nvl72")]["preset_fields"]
    assert later[("deepseek-v3", "gb200-nvl72")]["preset_fields"]["recompute_modules"] == ["mla_up_proj"]
