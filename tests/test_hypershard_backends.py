"""Exporters: every generated Python file compiles and carries the declaration; the ONNX export carries the
sharding annotations and passes onnx.checker; the JAX export places real arrays on a host-device mesh. (The
hyper-parallel export is checked against that project's pinned API in test_hyper_parallel_api.py.)"""

from __future__ import annotations

import copy
import importlib.util

import onnx
import pytest

from planner.errors import InvalidInput
from planner.hypershard import declare, strategy_of
from planner.hypershard.backends import BACKENDS, export, export_to_file
from planner.hypershard.backends.common import coords
from tests.jax_plan import run_jax_plan
from tests.layout_edits import megatron

TINY = dict(layers=4, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
MOE = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=64, experts=4, top_k=2)


@pytest.fixture(scope="module")
def docs():
    common = dict(cluster="dgx-a100", devices=8, global_batch=16, seq_len=32)
    return {
        "3d": megatron(declare("llama3-8b", overrides=TINY, tp=2, pp=2, dp=2, sp=True, recompute="full", zero=3,
                               offload=(("optimizer", 0.5), ("activations", 0.25)), **common)),
        "interleaved": declare("llama3-8b", overrides=TINY, pp=2, vpp=2, dp=4, recompute="selective", **common),
        "moe": declare("mixtral-8x7b", overrides=MOE, tp=2, ep=4, zero=1, **common),
        "gpt": declare("gpt", overrides=dict(layers=2, hidden=64, heads=4, vocab=128), dp=8, **common),
        "fsdp": megatron(declare("llama3-8b", overrides=TINY, tp=2, dp=4, recompute="full", zero=3, micro_batch=2,
                                 **common)),
    }


@pytest.mark.parametrize("backend", ["hyper-parallel", "mindspore", "torch", "jax"])
@pytest.mark.parametrize("which", ["3d", "interleaved", "moe", "gpt", "fsdp"])
def test_every_generated_python_file_compiles(docs, backend, which):
    if backend == "torch" and which == "moe":  # ep 4 over the tensor ranks (torch's ep takes data ranks only)
        with pytest.raises(InvalidInput, match=r"only \(ep 4 with tp 2, so it spans tensor ranks"):
            export(docs[which], backend)
        return
    if backend == "jax" and which in ("3d", "interleaved"):  # equal pipeline stages on one mesh: no JAX runtime
        with pytest.raises(InvalidInput, match="no pipeline runtime for 2 equal stages"):
            export(docs[which], backend)
        return
    source = export(docs[which], backend)
    code = compile(source, f"{which}_{backend}.py", "exec")
    assert code.co_filename.endswith(".py") and source.startswith('"""')
    assert "def layout_of(name):" in source and f"Strategy: {strategy_of(docs[which]).short()}." in source


def test_torch_runs_expert_parallelism_over_data_parallel_ranks_only():
    common = dict(cluster="dgx-a100", devices=8, global_batch=16, seq_len=32, zero=1)
    source = export(declare("mixtral-8x7b", overrides=MOE, ep=4, **common), "torch")
    assert "EXPERT_PARALLEL = 4" in source and "DATA_AXIS = 'dp_shard'" in source
    with pytest.raises(InvalidInput, match=r"runs expert parallelism over the data-parallel ranks of one program "
                                           r"only \(ep 2 with cp 2 in"):
        export(declare("mixtral-8x7b", overrides=MOE, cp=2, ep=2, **common), "torch")
    # the declaration folds ep over the tensor ranks first (consecutive ranks), which torch's ep does not follow
    with pytest.raises(InvalidInput, match=r"only \(ep 2 with tp 2, so it spans tensor ranks in"):
        export(declare("mixtral-8x7b", overrides=MOE, tp=2, etp=1, sp=True, ep=2, **common), "torch")
    with pytest.raises(InvalidInput, match=r"with its experts whole \(sequence parallel at tp > 1, etp 1, cp 1\), "
                                           r"and in main \(ranks 0-7\) cp is 2"):
        export(declare("mixtral-8x7b", overrides=MOE, cp=2, **common), "torch")
    oss = declare("gpt-oss-120b", overrides=dict(MOE, kv_heads=2), ep=4, **common)  # stacked experts with biases
    assert oss["layouts"]["params"]["model.layers.*.mlp.experts.gate_up_proj_bias"]["dims"] == ["ep", None]
    assert "EXPERT_PARALLEL = 4" in export(oss, "torch")  # the biases are the stacked module's, split with it
    doc = copy.deepcopy(declare("mixtral-8x7b", overrides=MOE, ep=4, **common))  # experts as one weight each
    params = doc["layouts"]["params"]
    params["model.layers.*.mlp.experts.*.w1.weight"] = dict(params.pop("model.layers.*.mlp.experts.gate_up_proj"),
                                                            dims=["ep", None])
    with pytest.raises(InvalidInput, match=r"splits stacked expert weights \[experts, ...\] over ep, and "
                                           r"model.layers.\*.mlp.experts.\*.w1.weight \(in .*\) is one expert's"):
        export(doc, "torch")


def test_torch_plan_carries_the_declaration(docs):
    source = export(docs["3d"], "torch")
    for needle in ("init_device_mesh", "parallelize_module", "ColwiseParallel", "RowwiseParallel", "fully_shard",
                   "CPUOffloadPolicy", "checkpoint_wrapper", "PipelineStage", "save_on_cpu"):
        assert needle in source
    ns = {}
    for line in source.splitlines():  # the data lines are plain literals
        if line.startswith(("MESH = ", "SEQUENCE_PARALLEL = ", "MICRO_BATCHES = ")):
            exec(line, ns)
    assert ns["MESH"] == [("pp", 2), ("dp_replicate", 1), ("dp_shard", 2), ("cp", 1), ("tp", 2)]
    assert ns["SEQUENCE_PARALLEL"] is True and ns["MICRO_BATCHES"] == docs["3d"]["programs"][0]["micro_batches"]


def test_onnx_export_annotates_nodes_and_passes_the_checker(docs, tmp_path):
    doc = docs["3d"]
    export_to_file(doc, "onnx", str(tmp_path / "m.onnx"))
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    onnx.checker.check_model(model)
    assert model.ir_version >= 11
    assert [(c.name, c.num_devices) for c in model.configuration] == [("hyperplan", 8)]
    stages = {n.device_configurations[0].pipeline_stage for n in model.graph.node if n.device_configurations}
    assert stages == {0, 1}
    specs = {s.tensor_name: (n, s) for n in model.graph.node for dc in n.device_configurations
             for s in dc.sharding_spec}
    node, spec = specs["model.layers.3.self_attn.q_proj.weight"]  # layer 3: stage 1, ranks 4..7
    assert node.device_configurations[0].pipeline_stage == 1
    assert [(d.axis, d.simple_sharding[0].num_shards, d.simple_sharding[0].dim_value) for d in spec.sharded_dim] == \
        [(0, 2, 64)]
    groups = {e.key: list(e.value) for e in spec.index_to_device_group_map}
    held = [groups[d] for d in spec.device]
    assert held == [[r for r in range(4, 8) if coords(doc, r)["tp"] == t] for t in range(2)] == [[4, 6], [5, 7]]
    # a layer input of stage 0: batch over dp, sequence over tp (SP); each of the 4 shards on one rank
    boundary = [s for t, (n, s) in specs.items() if not t.startswith(("model.", "lm_head"))
                and n.device_configurations[0].pipeline_stage == 0]
    assert boundary
    for s in boundary:
        assert [(d.axis, d.simple_sharding[0].num_shards) for d in s.sharded_dim] == [(0, 2), (1, 2)]
        assert list(s.device) == [0, 1, 2, 3]


def test_onnx_export_of_a_file_model_keeps_its_names(fixtures_dir, tmp_path):
    doc = megatron(declare(str(fixtures_dir / "llama_gqa.onnx"), cluster="dgx-a100", devices=2, global_batch=4,
                           seq_len=8, dims={"batch": 1}, tp=2))
    model = onnx.load_from_string(export(doc, "onnx"))
    onnx.checker.check_model(model)
    names = {s.tensor_name for n in model.graph.node for dc in n.device_configurations for s in dc.sharding_spec}
    assert "model.layers.1.mlp.down_proj.weight" in names


def test_export_names_the_backends_and_refuses_wrong_suffixes(docs, tmp_path):
    assert list(BACKENDS) == ["hyper-parallel", "mindspore", "torch", "jax", "onnx", "megatron", "torchtitan",
                              "deepspeed", "mindformers", "vllm", "sglang"]
    with pytest.raises(InvalidInput, match="unknown backend 'tensorflow'; use one of hyper-parallel"):
        export(docs["gpt"], "tensorflow")
    with pytest.raises(InvalidInput, match="writes a .onnx file"):
        export_to_file(docs["gpt"], "onnx", str(tmp_path / "x.py"))


@pytest.mark.jax
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
@pytest.mark.parametrize("which", ["fsdp", "moe"])
def test_jax_export_places_arrays_as_declared(docs, tmp_path, which):
    doc = docs[which]
    path = tmp_path / "plan_jax.py"
    export_to_file(doc, "jax", str(path))
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight", "lm_head.weight"]
    shapes = {"model.layers.0.self_attn.q_proj.weight": [64, 64], "model.layers.1.self_attn.o_proj.weight": [64, 64],
              "lm_head.weight": [128, 64]}
    if which == "moe":
        names.append("model.layers.0.mlp.experts.gate_up_proj")
        shapes[names[-1]] = [4, 128, 64]
    got = run_jax_plan(path, 8, (
        "mesh = m.build_mesh()\n"
        f"out = m.shard_params({{n: np.zeros(s, np.float32) for n, s in {shapes!r}.items()}}, mesh)\n"
        "print(json.dumps({'devices': [d.id for d in mesh.devices.flat], 'shards': {n: sorted("
        "[s.device.id, [[i.start or 0, i.stop] for i in s.index]] for s in a.addressable_shards) "
        "for n, a in out.items()}}))\n"
    ))
    assert got["devices"] == list(range(8))  # device k is rank k of the declaration
    q = dict((d, idx) for d, idx in got["shards"]["model.layers.0.self_attn.q_proj.weight"])
    for rank in range(8):
        c = coords(doc, rank)
        assert q[rank][0] == [32 * c["tp"], 32 * c["tp"] + 32]
        if which == "fsdp":  # ZeRO-3: each tp row block split again over the 4 data-parallel ranks
            assert q[rank][1] == [16 * c["dp"], 16 * c["dp"] + 16]
        else:
            assert q[rank][1] == [0, None]
    if which == "moe":
        e = dict((d, idx) for d, idx in got["shards"]["model.layers.0.mlp.experts.gate_up_proj"])
        for rank in range(8):
            c = coords(doc, rank)
            assert e[rank][0] == [c["ep"], c["ep"] + 1] and e[rank][1] == [64 * c["tp"], 64 * c["tp"] + 64]


def test_expert_tensor_degree_is_declared_and_read_back():
    """etp = tp splits each expert's GEMMs over tp (column, then row); etp 1 places whole experts over tp x dp."""
    from planner.hypershard.validate import validate_document
    common = dict(cluster="dgx-a100", devices=8, global_batch=16, seq_len=32)
    folded = declare("mixtral-8x7b", overrides=MOE, tp=2, ep=4, zero=1, **common)
    whole = declare("mixtral-8x7b", overrides=dict(MOE, experts=8), tp=2, ep=8, etp=1, zero=1, **common)
    params = folded["layouts"]["params"]
    assert params["model.layers.*.mlp.experts.gate_up_proj"]["dims"] == ["ep", "tp", None]
    assert params["model.layers.*.mlp.experts.down_proj"]["dims"] == ["ep", None, "tp"]
    assert whole["layouts"]["params"]["model.layers.*.mlp.experts.gate_up_proj"]["dims"] == ["ep", None, None]
    assert whole["meshes"][0]["aliases"][0]["within"] == ["tp", "cp", "dp"]
    assert strategy_of(folded).expert_tp == 2 and strategy_of(whole).expert_tp == 1
    assert whole["estimate"]["step_time_s"] != folded["estimate"]["step_time_s"]
    for doc in (folded, whole):
        report = validate_document(doc)
        assert report.ok, [c for c in report.checks if not c.ok]
        assert report.estimate["step_time_s"] == doc["estimate"]["step_time_s"]  # re-scored with its etp
    ranks = {coords(whole, r)["ep"] for r in range(8)}
    assert ranks == set(range(8))  # every rank holds other experts: ep runs over the tensor axis too
    with pytest.raises(InvalidInput, match="across the tensor axis"):
        export(whole, "jax")


def test_without_expert_parallelism_the_experts_are_declared_split_as_the_estimate_splits_them():
    """ep 1 with tp 2: the estimate holds and runs 1/2 of each expert per tensor rank (etp follows tp), so the
    declaration splits them so (column, then row; it had declared them whole); etp 1 keeps them whole. torch runs
    a MoE block at tp 2 only on each tensor rank's tokens with its experts whole (etp 1, sequence parallel), and
    refuses the other two in one sentence before writing anything."""
    common = dict(cluster="dgx-a100", devices=4, global_batch=8, seq_len=32)
    split = declare("mixtral-8x7b", overrides=MOE, tp=2, **common)
    whole = declare("mixtral-8x7b", overrides=MOE, tp=2, etp=1, **common)
    dims = {k.rsplit(".", 1)[-1]: v["dims"] for k, v in split["layouts"]["params"].items() if ".experts." in k}
    assert dims == {"gate_up_proj": [None, "tp", None], "down_proj": [None, None, "tp"]}
    assert split["layouts"]["params"]["model.layers.*.mlp.experts.down_proj"]["output_partial"] == ["tp"]
    assert all(v["dims"] == [None, None, None] for k, v in whole["layouts"]["params"].items() if ".experts." in k)
    assert split["estimate"]["memory_gib"]["params"] < whole["estimate"]["memory_gib"]["params"]
    for doc, why in ((split, r"model.layers.\*.mlp.experts.gate_up_proj is split over tp"),
                     (whole, "tp 2 has no sequence parallelism")):
        with pytest.raises(InvalidInput, match=r"the torch backend runs a MoE layer on each tensor rank's slice of "
                                               r"the sequence with its experts whole \(sequence parallel at tp > 1, "
                                               rf"etp 1, cp 1\), and in main \(ranks 0-3\) {why}; "):
            export(doc, "torch")
    local = export(declare("mixtral-8x7b", overrides=MOE, tp=2, etp=1, sp=True, **common), "torch")
    assert "MOE_TOKEN_SPLIT = True" in local
    assert "MOE_TOKEN_SPLIT = False" in export(declare("mixtral-8x7b", overrides=MOE, dp=4, **common), "torch")


def test_the_jax_refusal_points_at_a_backend_that_writes_the_plan():
    """GPT's Conv1D weights split over tp at pp 2: jax has no pipeline runtime, and torch splits no [in, out]
    linear, so jax's refusal names the code backends; a Llama plan, which torch runs, names torch."""
    from planner.hypershard import declare

    gpt = declare("gpt", overrides=dict(layers=2, hidden=64, heads=4, vocab=128), cluster="dgx-h100", devices=8,
                  global_batch=16, seq_len=32, tp=2, pp=2, dp=2)
    with pytest.raises(InvalidInput, match="or export with --backend mindspore or hyper-parallel$"):
        export(gpt, "jax")
    with pytest.raises(InvalidInput, match=r"\[in, out\] one \(GPT-2's Conv1D\)"):
        export(gpt, "torch")
    llama = declare("llama3-8b", overrides=TINY, cluster="dgx-h100", devices=8, global_batch=16, seq_len=32, tp=2,
                    pp=2, dp=2)
    with pytest.raises(InvalidInput, match="or export with --backend torch$"):
        export(llama, "jax")
    assert export(llama, "torch")
