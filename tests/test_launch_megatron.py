"""The megatron export: every flag is one of Megatron-LM's own (pinned from its parser at core_v0.16.1), every value
parses as that parser types it, and megatron-core's real config classes built from the arguments the way
Megatron-LM builds them construct (their __post_init__ validates) with the plan's degrees."""

from __future__ import annotations

import argparse
import math
import copy
import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from launch_plans import REFUSES, WRITES, parse_pinned, plan, shape
from planner.errors import InvalidInput
from planner.hypershard import strategy_of
from planner.hypershard.backends import export, launch, launch_config

PINNED = json.loads((Path(__file__).parent / "data" / "megatron_arguments.json").read_text())


def parse(words: list[str]) -> tuple[argparse.Namespace, set[str]]:
    return parse_pinned(words, PINNED)


def core_args(ns: argparse.Namespace, given: set[str], num_layers: int) -> dict:
    """The parsed arguments under their config field names (the pinned renames), with the virtual pipeline size
    validate_args derives from the layout or the layers per virtual stage."""
    args = {PINNED["renames"].get(k, k): getattr(ns, k) for k in given}
    pp = args.get("pipeline_model_parallel_size", 1)
    vpp = None
    if "pipeline_model_parallel_layout" in args:
        vpp = args["pipeline_model_parallel_layout"].count("|") // pp + 1 or None
    elif "num_layers_per_virtual_pipeline_stage" in args:
        vpp = num_layers // pp // args.pop("num_layers_per_virtual_pipeline_stage")
    args["virtual_pipeline_model_parallel_size"] = vpp if vpp and vpp > 1 else None
    if args.get("cpu_offloading_num_layers", 0) > 0:  # validate_args turns the layer-level offload on
        args["cpu_offloading"] = True
    return args


def core_configs(ns: argparse.Namespace, given: set[str], name: str, monkeypatch):
    """megatron-core's TransformerConfig, DistributedDataParallelConfig and OptimizerConfig from parsed
    arguments as Megatron-LM makes them: every arg whose name is a field is copied (core_transformer_config_from_args,
    get_model, config_from_args), under the renames the pinned file records; validate_args' derivations that the
    configs read are redone here (the virtual pipeline size, pipeline_dtype = params_dtype)."""
    torch = pytest.importorskip("torch")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = shape(name)
    args = core_args(ns, given, model["num_layers"])
    dtype = torch.float16 if args.get("fp16") else torch.bfloat16 if args.get("bf16") else torch.float32
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    tc = TransformerConfig(**model, params_dtype=dtype, pipeline_dtype=dtype,
                           **{k: v for k, v in args.items() if k in fields})
    ddp = DistributedDataParallelConfig(**{k: v for k, v in args.items()
                                           if k in {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}})
    # --use-precision-aware-optimizer asks Transformer Engine's version (a CUDA package, not installed here); that
    # one answer is given (TE 2.1), every check of the config still runs
    monkeypatch.setattr("megatron.core.optimizer.optimizer_config.is_te_min_version", lambda *a, **k: True)
    opt = OptimizerConfig(**{k: v for k, v in args.items() if k in {f.name for f in dataclasses.fields(OptimizerConfig)}})
    return tc, ddp, opt, args


@pytest.mark.launch
@pytest.mark.parametrize("name", WRITES["megatron"])
def test_megatron_core_configs_take_the_plans_degrees(name, monkeypatch):
    pytest.importorskip("megatron.core")
    doc = plan(name)
    words = launch_config(doc, "megatron")["config"]["args"]
    ns, given = parse(words)
    tc, ddp, opt, args = core_configs(ns, given, name, monkeypatch)
    s = strategy_of(doc)
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size, tc.context_parallel_size) == (s.tp, s.pp, s.cp)
    assert (tc.virtual_pipeline_model_parallel_size or 1) == s.vpp
    assert tc.sequence_parallel == s.sp
    if "moe" in name:
        assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (s.ep, s.expert_tp)
    world = doc["cluster"]["devices"]
    dp = world // (s.tp * s.pp * s.cp)  # Megatron-LM's data-parallel size (initialize_model_parallel)
    assert dp == s.dp and args["global_batch_size"] % (args["micro_batch_size"] * dp) == 0
    assert args["global_batch_size"] // (args["micro_batch_size"] * dp) == doc["programs"][0]["micro_batches"]
    sharded = ddp.use_distributed_optimizer or ddp.use_megatron_fsdp
    # with one data-parallel rank the distributed optimizer (which offload needs) shards over that rank alone
    assert bool(sharded) == (s.zero > 0 or (dp == 1 and s.offload_fraction("optimizer") > 0))
    if ddp.use_megatron_fsdp:
        assert ddp.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}[s.zero]
    if s.recompute == "full" or s.full_recompute_layers:
        assert tc.recompute_granularity == "full"
        assert (tc.recompute_method, tc.recompute_num_layers) == (
            ("uniform", 1) if s.recompute == "full" else ("block", s.full_recompute_layers))
    elif s.recompute == "selective":  # the megatron-core stack's modules
        assert tc.recompute_granularity == "selective" and tc.recompute_modules == ["core_attn"]
    assert opt.optimizer_offload_fraction == (s.offload_fraction("optimizer") or opt.optimizer_offload_fraction)
    if s.offload_fraction("activations"):  # the fewest whole layers that hold the plan's fraction: 4 of 8 for 40 %
        assert tc.cpu_offloading and tc.cpu_offloading_activations and not tc.cpu_offloading_weights
        assert tc.cpu_offloading_num_layers == math.ceil(s.offload_fraction("activations") * tc.num_layers)
    else:
        assert not tc.cpu_offloading
    chunks = [len(c["layers"]) for st in doc["programs"][0]["stages"] for c in st["chunks"]]
    if name in ("layout", "ends_alone", "tt_ends_alone"):  # the layout's chunks, as Megatron-Core reads them, are
        layout = tc.pipeline_model_parallel_layout.layout  # the plan's; chunk c on rank c mod pp, round c // pp
        parts = [[x.name for x in layout[c % s.pp][c // s.pp]] for c in range(s.pp * s.vpp)]
        assert [p.count("decoder") for p in parts] == list(s.stage_layers)
        if name != "layout":  # the embedding and the loss alone in their chunks, as Megatron-Bridge accounts them
            assert parts[0] == ["embedding"] and parts[-1] == ["loss"]
    if name == "first_last":
        assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (1, 1)


@pytest.mark.parametrize("name", WRITES["megatron"])
def test_every_flag_is_one_of_megatron_lms_and_the_line_holds_them(name):
    doc = plan(name)
    cfg = launch_config(doc, "megatron")["config"]
    parse(cfg["args"])  # every flag pinned, every value of its type and choices
    text = export(doc, "megatron")
    command = text[text.index("torchrun"):].replace("\\\n", " ")
    words = shlex.split(command)
    assert words[words.index("pretrain_gpt.py") + 3:] == cfg["args"]  # after the user's MODEL_ARGS, DATA_ARGS
    assert all(line.startswith(("#", "export ", "torchrun", "    ")) for line in text.splitlines())


@pytest.mark.parametrize("name, words", list(REFUSES["megatron"].items()))
def test_what_megatron_cannot_run_is_refused_in_one_sentence(name, words):
    with pytest.raises(InvalidInput, match="the megatron backend cannot express this plan's") as err:
        export(plan(name), "megatron")
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.launch
def test_the_all_to_all_overlap_goes_out_where_megatron_runs_it_as_it_is_costed(tmp_path, monkeypatch):
    pytest.importorskip("megatron.core")
    from launch_plans import COMMON, MOE
    from planner.hypershard import declare

    stack = tmp_path / "a2a.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[overlap]\noverlap_ep_comm = true\n', encoding="utf-8")
    doc = declare("mixtral-8x7b", overrides=MOE, **COMMON, ep=8, zero=1, stack=str(stack))
    words = launch_config(doc, "megatron")["config"]["args"]
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" in words
    ns, given = parse(words)
    tc, *_ = core_configs(ns, given, "moe", monkeypatch)  # megatron-core's own checks of the pair pass
    assert tc.overlap_moe_expert_parallel_comm and tc.delay_wgrad_compute
    # Megatron-FSDP refuses delayed weight gradients: the overlap goes without them
    words = launch_config(declare("mixtral-8x7b", overrides=MOE, **COMMON, ep=8, zero=3, stack=str(stack)),
                          "megatron")["config"]["args"]
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" not in words
    # a pipeline without interleaving: megatron-core refuses the overlap; it is left off, and the notes say why
    out = launch_config(declare("mixtral-8x7b", overrides=MOE, **COMMON, ep=4, pp=2, zero=1, stack=str(stack)),
                        "megatron")
    assert "--overlap-moe-expert-parallel-comm" not in out["config"]["args"]
    assert any("needs the interleaved schedule" in n for n in out["notes"])


@pytest.mark.launch
def test_the_flex_dispatcher_goes_out_as_the_backend_its_nvlink_domain_runs(monkeypatch):
    """8-GPU NVLink nodes (DGX H100): DeepEP, megatron-core's default; one NVLink domain over several nodes (GB200
    NVL72): HybridEP, the only backend megatron-core runs there and the only one Megatron-Bridge lets on those GPUs.
    Both parse with the pinned parser and build megatron-core's own TransformerConfig with that backend."""
    pytest.importorskip("megatron.core")
    for name, backend in (("moe", "deepep"), ("moe_nvl72", "hybridep")):
        words = launch_config(plan(name), "megatron")["config"]["args"]
        assert words[words.index("--moe-flex-dispatcher-backend") + 1] == backend
        ns, given = parse(words)
        tc, *_ = core_configs(ns, given, name, monkeypatch)
        assert (tc.moe_token_dispatcher_type, tc.moe_flex_dispatcher_backend) == ("flex", backend)


def test_offloaded_activations_go_out_as_whole_layers_where_megatron_core_offloads_them():
    """40 % of 8 layers' activations: Transformer Engine's offload of 4 whole layers, which the notes say moves
    1.25x the host traffic scored; beside recomputation, megatron-core refuses it, and so does the export."""
    from launch_plans import COMMON, TINY
    from planner.hypershard import declare

    out = launch_config(plan("activations"), "megatron")
    words = out["config"]["args"]
    assert words[words.index("--cpu-offloading-num-layers") + 1] == "4"
    assert any("4 of 8 layers (50%) where the plan offloads 40%" in n and "1.25x" in n for n in out["notes"])
    doc = declare("llama3-8b", overrides=TINY, **COMMON, dp=8, recompute="full", offload=(("activations", 0.4),))
    with pytest.raises(InvalidInput, match="activations offload \\(40%\\) beside recomputation"):
        launch_config(doc, "megatron")


#: A small DeepSeek-V3 with one multi-token-prediction depth (the zoo's mtp_layers).
MTP_MODEL = dict(layers=4, dense_layers=1, hidden=64, heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16,
                 qk_rope_dim=8, v_head_dim=16, ffn=128, expert_ffn=32, experts=8, top_k=2, shared_experts=1, vocab=128,
                 mtp_layers=1)


@pytest.mark.launch
def test_an_mtp_layer_goes_out_as_megatron_builds_it_last_in_the_layout():
    """The plan's last chunk holds the MTP layer: --mtp-num-layers 1, and a layout whose 'm' megatron-core's own
    parser puts in the last virtual stage of the last stage, beside the loss, with the plan's decoder chunks."""
    torch = pytest.importorskip("torch")
    from launch_plans import COMMON
    from megatron.core.transformer.transformer_config import TransformerConfig
    from planner.hypershard import declare

    doc = declare("deepseek-v3", overrides=MTP_MODEL, **COMMON, pp=2, vpp=2, dp=4, ep=4, zero=1,
                  stage_layers=(1, 2, 1, 1))
    out = launch_config(doc, "megatron")
    words = out["config"]["args"]
    ns, given = parse(words)  # both flags pinned
    assert words[words.index("--mtp-num-layers") + 1] == "1" and out["config"]["layers"] == 4
    layout = words[words.index("--pipeline-model-parallel-layout") + 1]
    tc = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=2,
                           virtual_pipeline_model_parallel_size=2, pipeline_model_parallel_layout=layout,
                           mtp_num_layers=1, pipeline_dtype=torch.bfloat16, params_dtype=torch.bfloat16, bf16=True)
    chunks = tc.pipeline_model_parallel_layout.layout
    assert [x.name for x in chunks[1][1]] == ["mtp", "loss"]
    decoders = [sum(x.name == "decoder" for x in chunks[c % 2][c // 2]) for c in range(4)]
    assert decoders == [1, 2, 1, 0]  # the plan's chunks, its MTP layer not counted as a decoder
    assert "4 decoder layers and 1 MTP layer." in export(doc, "megatron")
    # the other launch formats build no MTP layer: refused in one sentence rather than dropped
    for backend in ("torchtitan", "deepspeed", "mindformers"):
        with pytest.raises(InvalidInput, match="1 multi-token-prediction layer .its model code builds none"):
            export(doc, backend)
    # PP without interleaving, the MTP layer sharing the last stage with decoder layers; megatron-core reads it so
    flat = declare("deepseek-v3", overrides=MTP_MODEL, **COMMON, pp=2, dp=4, ep=4, zero=1)
    layout = launch_config(flat, "megatron")["config"]["args"]
    layout = layout[layout.index("--pipeline-model-parallel-layout") + 1]
    tc = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=2,
                           pipeline_model_parallel_layout=layout, mtp_num_layers=1, pipeline_dtype=torch.bfloat16,
                           params_dtype=torch.bfloat16, bf16=True)
    last = [x.name for x in tc.pipeline_model_parallel_layout.layout[1][0]]
    assert last[-2:] == ["mtp", "loss"] and "decoder" in last
    # the MTP layer split from the last chunk cannot be said: refused in one sentence
    with pytest.raises(InvalidInput, match="MTP layers over more than the last pipeline chunk"):
        export(declare("deepseek-v3", overrides=dict(MTP_MODEL, mtp_layers=2), **COMMON, pp=2, vpp=2, dp=4, ep=4,
                       zero=1, stage_layers=(1, 2, 2, 1)), "megatron")


@pytest.mark.launch
def test_an_mtp_layer_is_read_off_the_graph_and_keeps_the_all_to_all_overlap_where_megatron_core_takes_it(
        tmp_path, monkeypatch):
    """A zoo graph saved to ONNX keeps its MTP layer (it embeds the token ids again), so the export still builds it;
    and megatron-core's 1F1B all-to-all overlap takes one MTP layer, and only with a pipeline: without one the
    estimate costs the exchange unpaired and the export leaves the overlap off, saying why."""
    torch = pytest.importorskip("torch")
    import models_zoo
    import onnx
    from launch_plans import COMMON
    from megatron.core.transformer.transformer_config import TransformerConfig
    from planner.hypershard import declare

    path = tmp_path / "ds.onnx"
    onnx.save(models_zoo.build("deepseek-v3", **MTP_MODEL, seq_len=32), str(path))
    doc = declare(str(path), **COMMON, pp=2, vpp=2, dp=4, ep=4, zero=1, stage_layers=(1, 2, 1, 1))
    assert doc["model"]["mtp_layers"] == 1
    words = launch_config(doc, "megatron")["config"]["args"]
    assert words[words.index("--mtp-num-layers") + 1] == "1"
    stack = tmp_path / "a2a.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[overlap]\noverlap_ep_comm = true\n', encoding="utf-8")
    piped = launch_config(declare("deepseek-v3", overrides=MTP_MODEL, **COMMON, pp=2, vpp=2, dp=4, ep=4, zero=1,
                                  stage_layers=(1, 2, 1, 1), stack=str(stack)), "megatron")["config"]["args"]
    assert "--overlap-moe-expert-parallel-comm" in piped
    _moe_config(piped, torch, TransformerConfig)  # megatron-core's own checks of the pair with MTP pass
    alone = declare("deepseek-v3", overrides=MTP_MODEL, **COMMON, dp=8, ep=8, zero=1, stack=str(stack))
    out = launch_config(alone, "megatron")
    assert "--overlap-moe-expert-parallel-comm" not in out["config"]["args"]
    assert any("with a multi-token-prediction layer it needs a pipeline" in n for n in out["notes"])
    with pytest.raises(AssertionError, match="Pipeline model parallel size must be larger than 1"):
        _moe_config(out["config"]["args"] + ["--overlap-moe-expert-parallel-comm"], torch, TransformerConfig)


def _moe_config(words: list[str], torch, config):
    """megatron-core's TransformerConfig of MTP_MODEL's shape and the exported arguments (as `core_configs`)."""
    args = core_args(*parse(words), MTP_MODEL["layers"])
    fields = {f.name for f in dataclasses.fields(config)}
    return config(num_layers=4, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                  pipeline_dtype=torch.bfloat16, params_dtype=torch.bfloat16,
                  **{k: v for k, v in args.items() if k in fields})


@pytest.mark.launch
@pytest.mark.parametrize("stack, impl", [("megatron-core", "te"), ("megatron-core-2024", None), ("torchtitan", None)])
def test_the_loss_kernel_the_estimate_costs_goes_out_as_megatrons_fusion(stack, impl, monkeypatch):
    pytest.importorskip("megatron.core")
    from launch_plans import COMMON, TINY
    from planner.hypershard import declare

    out = launch_config(declare("llama3-8b", overrides=TINY, **COMMON, dp=8, zero=1, stack=stack), "megatron")
    ns, given = parse(out["config"]["args"])
    tc, *_ = core_configs(ns, given, "zero2", monkeypatch)
    assert tc.cross_entropy_loss_fusion == (impl is not None)
    if impl:
        assert tc.cross_entropy_fusion_impl == impl
    assert any("costs the loss as 'torch_compiled'" in n for n in out["notes"]) == (stack == "torchtitan")


@pytest.mark.launch
@pytest.mark.parametrize("name, impl, scopes", [("graphs_full", "local", ["full_iteration"]),
                                                ("graphs_layer", "transformer_engine",
                                                 ["attn", "moe_router", "moe_preprocess"])])
def test_cuda_graphs_the_estimate_costs_go_out_as_megatron_captures_them(name, impl, scopes, monkeypatch):
    """A stack's CUDA graphs (no host issue for what they capture) go out as Megatron-LM's --cuda-graph-impl and
    --cuda-graph-scope, with what validate_args asks of a full-iteration graph (no NaN check of the loss, padded
    experts under expert parallelism), and megatron-core's config takes the scopes (Megatron-LM's own validate_args
    too: benchmarks/megatron_parser_check.json); the other backends refuse them (launch_plans.REFUSES)."""
    pytest.importorskip("megatron.core")
    out = launch_config(plan(name), "megatron")
    words = out["config"]["args"]
    ns, given = parse(words)
    assert ns.cuda_graph_impl == impl and ns.cuda_graph_scope == scopes
    if impl == "local":
        assert ns.check_for_nan_in_loss_and_grad is False
    else:  # validate_args: Transformer Engine's graphs beside expandable segments need NCCL's registration off
        assert out["config"]["env"]["NCCL_GRAPH_REGISTER"] == "0"
    tc, *_ = core_configs(ns, given, name, monkeypatch)
    assert tc.cuda_graph_impl == impl and sorted(s.name for s in tc.cuda_graph_scope) == sorted(scopes)


@pytest.mark.launch
def test_graphed_attention_recompute_says_the_dropout_megatron_core_needs(monkeypatch):
    """Selective recompute of core attention under graphs: megatron-core refuses it with Megatron-LM's default
    attention dropout (0.1) and takes it at 0, which the export's note asks MODEL_ARGS to give."""
    pytest.importorskip("megatron.core")
    from launch_plans import COMMON, GRAPHS, TINY
    from planner.hypershard import declare

    out = launch_config(declare("llama3-8b", overrides=TINY, **COMMON, tp=2, dp=4, sp=True, zero=1,
                                recompute="selective", stack=GRAPHS["full_iteration"]), "megatron")
    assert any("--attention-dropout 0" in n for n in out["notes"])
    ns, given = parse(out["config"]["args"])
    with pytest.raises(AssertionError, match="attention dropout is not supported with graphed attention"):
        core_configs(ns, given, "graphs_full", monkeypatch)
    ns.attention_dropout = 0.0
    tc, *_ = core_configs(ns, given | {"attention_dropout"}, "graphs_full", monkeypatch)
    assert tc.recompute_modules == ["core_attn"]


@pytest.mark.launch
@pytest.mark.parametrize("change, strategy, words, megatron_says", [
    ({"cuda_graphs": ["attn"]}, dict(recompute="full"), "per-layer CUDA graphs beside full recompute",
     "full recompute is only supported with full iteration"),
    ({"cuda_graphs": ["moe"]}, {}, "CUDA graphs of a dropless MoE block", "only supported with drop-padding MoE"),
    ({"cuda_graphs": ["mlp"]}, {}, "CUDA graphs of dense MLPs where every layer is MoE",
     "mlp cuda graph is only supported for dense layers"),
    ({"cuda_graphs": ["moe_router"], "recompute_modules": ["moe"]}, dict(recompute="selective"),
     "CUDA graphs of the MoE router beside selective recompute of the MoE block",
     "moe recompute is not supported with moe_router")])
def test_graphs_megatron_core_refuses_are_refused_before_anything_is_written(change, strategy, words, megatron_says,
                                                                             tmp_path, monkeypatch):
    """Each refused combination is one megatron-core 0.16.1's TransformerConfig refuses: built anyway (the flags
    put in by hand), the config raises."""
    pytest.importorskip("megatron.core")
    from launch_plans import COMMON, MOE
    from planner.hypershard import declare

    text = f'[stack]\nbase = "megatron-core"\n[kernels]\ncuda_graphs = {json.dumps(change["cuda_graphs"])}\n'
    if "recompute_modules" in change:
        text += f'[recompute]\nrecompute_modules = {json.dumps(change["recompute_modules"])}\n'
    stack = tmp_path / "graphs.toml"
    stack.write_text(text, encoding="utf-8")
    doc = declare("mixtral-8x7b", overrides=MOE, **COMMON, ep=8, zero=1, stack=str(stack), **strategy)
    with pytest.raises(InvalidInput, match=words):
        launch_config(doc, "megatron")
    plain = launch_config(declare("mixtral-8x7b", overrides=MOE, **COMMON, ep=8, zero=1, **strategy),
                          "megatron")["config"]["args"]
    ns, given = parse(plain + ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", *change["cuda_graphs"]])
    ns.attention_dropout = ns.hidden_dropout = 0.0  # not what megatron-core refuses here
    given |= {"attention_dropout", "hidden_dropout"}
    if "recompute_modules" in change:
        ns.recompute_modules = change["recompute_modules"]
    with pytest.raises(AssertionError, match=megatron_says):
        core_configs(ns, given, "moe", monkeypatch)


def test_fp8_attention_goes_out_as_a_note_as_megatron_lm_has_no_flag_for_it(tmp_path):
    """Megatron-LM's parser (pinned) has no flag for fp8_dot_product_attention: a plan costed with attention in FP8
    goes out saying its launch runs attention in 16 bits; one costed without it says nothing of it."""
    assert not any("dot-product-attention" in flag for flag in PINNED["flags"])
    stack = tmp_path / "fp8_attention.toml"
    stack.write_text('[stack]\nname = "fp8-attention"\nbase = "megatron-core"\n\n[precision]\nfp8_recipe = "mxfp8"\n'
                     'fp8_attention = true\n', encoding="utf-8")
    from launch_plans import TINY
    from planner.hypershard import declare

    job = dict(cluster="gb200-nvl72", devices=8, global_batch=16, seq_len=32, dtype="fp8", dp=8, zero=1)
    notes = launch_config(declare("llama3-8b", overrides=TINY, stack=str(stack), **job), "megatron")["notes"]
    assert any("runs attention in FP8 (fp8_attention), which this Megatron-LM launch does not set" in n for n in notes)
    plain = launch_config(declare("llama3-8b", overrides=TINY, **job), "megatron")["notes"]
    assert not any("fp8_attention" in n for n in plain)


@pytest.mark.parametrize("backend, framework", [("megatron", "Megatron-LM"), ("torchtitan", "torchtitan"),
                                                ("mindformers", "MindFormers")])
def test_a_norm_scale_split_over_tp_goes_out_with_a_note_that_the_framework_keeps_it_whole(backend, framework):
    """A searched layout may split a norm's scale over the tensor axis (the estimate costs the partial sums); every
    launch framework keeps norm weights whole, so its config says it runs otherwise than scored."""
    doc = copy.deepcopy(plan("3d"))
    scales = [n for n, e in doc["layouts"]["params"].items() if e.get("op") == "scale"]
    assert scales and not launch.split_scales(doc)
    doc["layouts"]["params"][scales[-1]]["dims"] = ["tp"]
    text = export(doc, backend)
    text = text if isinstance(text, str) else text.decode()
    said = f"the declaration splits 1 norm scale over tp ({scales[-1]}); {framework} keeps norm weights whole"
    assert said in " ".join(line.lstrip("# ") for line in text.splitlines()), text[:600]


def test_a_position_table_split_over_tp_is_not_called_a_norm_scale():
    """GPT adds a learned position table to the token embeddings elementwise (op "scale", two dimensions): split
    over tp, the note had counted it among the norm scales."""
    from planner.hypershard import declare

    doc = declare("gpt", overrides={"layers": 2}, cluster="dgx-a100", devices=8, global_batch=32, seq_len=1024, tp=2)
    params = doc["layouts"]["params"]
    params["transformer.wpe.weight"]["dims"] = [None, "tp"]
    params["transformer.ln_f.weight"]["dims"] = ["tp"]
    notes = " ".join(launch_config(doc, "megatron")["notes"])
    assert "the declaration splits 1 norm scale over tp (transformer.ln_f.weight)" in notes
    assert ("the declaration splits transformer.wpe.weight, added elementwise (a learned position table), over tp; "
            "Megatron-LM keeps it whole") in notes


@pytest.mark.parametrize("backend, framework", [("megatron", "Megatron-LM"), ("torchtitan", "torchtitan"),
                                                ("mindformers", "MindFormers")])
def test_a_router_split_over_tp_goes_out_with_a_note_that_the_framework_keeps_it_whole(backend, framework):
    """The declaration marks a MoE router's weight (found from the graph); a searched layout may split it over the
    experts, where Megatron-LM (a plain Parameter in TopKRouter), torchtitan (NoParallel) and DeepSpeed's AutoTP (it
    skips the MoE gate) keep it whole on every tensor rank."""
    doc = copy.deepcopy(plan("moe"))
    routers = [n for n, e in doc["layouts"]["params"].items() if e.get("router")]
    assert routers == ["model.layers.*.mlp.gate.weight"]
    doc["layouts"]["params"][routers[0]]["dims"] = ["tp", None]
    text = export(doc, backend)
    text = text if isinstance(text, str) else text.decode()
    said = f"the declaration splits the MoE router's weight over tp ({routers[0]}); {framework} keeps the router whole"
    assert said in " ".join(line.lstrip("# ") for line in text.splitlines()), text[:600]
