"""The hyper-parallel export against hyper-parallel's real API, as pinned from its source (no stand-in modules).

hyper-parallel is not on PyPI, so CI cannot import it: tests/data/hyper_parallel_api.json holds the
signatures of every name the generated files import, read from mindspore-ai/hyper-parallel's source by
benchmarks/extract_hyper_parallel_api.py (its runs on that source are benchmarks/hyper_parallel_check.md).
Each generated file is parsed (ast, never run): every `from hyper_parallel... import X` must name a pinned
module path and name, and every call of those names (and of the mesh's methods) must fit the pinned
parameters. What the exporter decides itself (each parameter's layout, the mesh, the inputs) is read from
the generated file's data tables; the refusals are checked for the features hyper-parallel cannot run.
"""

from __future__ import annotations

import ast
import fnmatch
import json
from pathlib import Path

import pytest

from planner.errors import InvalidInput
from planner.hypershard import declare, declare_programs
from planner.hypershard.backends import export
from planner.hypershard.serving_doc import declare_serving_phases
from tests.layout_edits import megatron

API = json.loads((Path(__file__).parent / "data" / "hyper_parallel_api.json").read_text())
TINY = dict(layers=4, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
MOE = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=64, experts=4, top_k=2)
WHERE = dict(cluster="dgx-a100", devices=8, global_batch=16, seq_len=32)


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    vlm = dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=512, vision_layers=2, vision_hidden=512,
               vision_heads=8, vision_ffn=2048)
    docs = {
        "3d": megatron(declare("llama3-8b", overrides=TINY, tp=2, pp=2, dp=2, sp=True, recompute="full", zero=3,
                               offload=(("optimizer", 0.5), ("activations", 0.25)), **WHERE)),
        "interleaved": declare("llama3-8b", overrides=TINY, pp=2, vpp=2, dp=4, recompute="selective", **WHERE),
        "moe": declare("mixtral-8x7b", overrides=MOE, tp=2, ep=4, zero=1, **WHERE),
        "gpt": declare("gpt", overrides=dict(layers=2, hidden=64, heads=4, vocab=128), dp=8, zero=0, **WHERE),
        "mpmd": declare_programs("llava-style-7b", overrides=vlm, cluster="dgx-a100", global_batch=8, seq_len=1024,
                                 programs=[dict(devices=2), dict(devices=2, tp=2)]),
        "serving": declare_serving_phases("mixtral-8x7b", cluster="dgx-h100", prompt_len=8, gen_len=4, overrides=MOE,
                                          prefill=dict(tp=2), decode=dict(tp=1, dp=2)),
    }
    return {name: export(doc, "hyper-parallel") for name, doc in docs.items()}


def _imports(tree: ast.Module) -> dict[str, dict]:
    """Local name -> pinned entry of each name imported from hyper_parallel (asserting each is pinned)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "hyper_parallel":
            assert node.module in API["modules"], f"{node.module} is not a module path of the pinned source"
            for alias in node.names:
                assert alias.name in API["modules"][node.module], f"{node.module} defines no {alias.name}"
                out[alias.asname or alias.name] = API["modules"][node.module][alias.name]
    return out


def _fits(call: ast.Call, sig: dict, what: str) -> None:
    """The call passes only keywords the signature has, not too many positionals, and every required one."""
    assert not any(isinstance(a, ast.Starred) for a in call.args) and all(k.arg for k in call.keywords), what
    names = [k.arg for k in call.keywords]
    allowed = sig["params"] + sig["keyword_only"]
    assert set(names) <= set(allowed), f"{what}: {sorted(set(names) - set(allowed))} not in {allowed}"
    assert sig["var_positional"] or len(call.args) <= len(sig["params"]), f"{what}: {len(call.args)} positionals"
    given = len(call.args) + sum(1 for n in names if n in sig["params"][:sig["required"]])
    assert given >= sig["required"], f"{what}: {given} of {sig['required']} required arguments"
    assert not set(names) & set(sig["params"][:len(call.args)]), f"{what}: an argument given twice"


MESH_METHODS = API["reached"]["hyper_parallel.DeviceMesh"]
POLICY = API["reached"]["hyper_parallel.core.activation_checkpoint.CheckpointPolicy"]


@pytest.mark.parametrize("which", ["3d", "interleaved", "moe", "gpt", "mpmd", "serving"])
def test_generated_files_import_and_call_only_the_pinned_api(sources, which):
    tree = ast.parse(sources[which])
    names = _imports(tree)
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            _fits(node, names[node.func.id], f"{which}: {ast.unparse(node)[:100]}")
            called.add(node.func.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) \
                == "mesh":
            assert node.func.attr in MESH_METHODS, f"DeviceMesh has no {node.func.attr}"
            _fits(node, MESH_METHODS[node.func.attr], f"{which}: {ast.unparse(node)[:100]}")
        elif isinstance(node, ast.Attribute) and ast.unparse(node.value) == "CheckpointPolicy":
            assert node.attr in POLICY, f"CheckpointPolicy has no member {node.attr}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_local":
            _fits(node, API["reached"]["hyper_parallel.core.dtensor.DTensor"]["to_local"], f"{which}: to_local")
    training = {"fully_shard", "PipelineStage", "Schedule1F1B", "checkpoint_wrapper", "swap_wrapper", "CPUOffloadPolicy"}
    want = {"init_device_mesh", "shard_module", "ShardingPlan", "Shard", "Replicate"} | (set() if which == "serving"
                                                                                         else training)
    assert called >= want, sorted(want - called)


def test_the_pin_names_its_source_and_files():
    src = API["source"]
    assert src["repository"] == "mindspore-ai/hyper-parallel" and len(src["commit"]) == 40
    files = {e["file"] for names in API["modules"].values() for e in names.values()}
    assert all(f.startswith("hyper_parallel/") and f.endswith(".py") for f in files)
    assert API["modules"]["hyper_parallel"]["PipelineStage"]["params"][:4] == ["submodule", "stage_index",
                                                                                "stage_num", "device"]


def _tables(source: str) -> dict:
    """The generated file's data tables (plain literals) and its pure-Python layout helpers, run on them."""
    tree = ast.parse(source)
    scope: dict = {"fnmatch": fnmatch}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            scope[node.targets[0].id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_RENAME":
            scope["_RENAME"] = ast.literal_eval(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name in ("layout_of", "_mesh_axes"):
            exec(compile(ast.Module([node], []), "generated", "exec"), scope)
    return scope


def test_every_parameter_gets_its_declared_layout_over_the_mesh(sources):
    t = _tables(sources["3d"])
    assert t["MESH"] == [("pp", 2), ("dp", 2), ("cp", 1), ("tp", 2)]
    axes = {n: [t["_mesh_axes"](s) for s in t["layout_of"](n)["dims"]]
            for n in ("model.layers.3.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                      "model.norm.weight")}
    assert axes == {"model.layers.3.self_attn.q_proj.weight": [("tp",), ()],
                    "model.layers.0.mlp.down_proj.weight": [(), ("tp",)], "model.norm.weight": [()]}
    assert t["KEPT_WHOLE"] == ["model.embed_tokens.weight"]  # split over its vocabulary: applied whole
    assert t["INPUTS"] == {"input_ids": {"dims": ["dp", None]}}
    assert t["LAYER_INPUTS"] == {"model.layers.*": {"dims": ["dp", "tp", None]}}  # sequence parallel
    moe = _tables(sources["moe"])
    assert moe["MESH"] == [("pp", 1), ("dp", 1), ("ep", 4), ("cp", 1), ("tp", 2)]
    expert = moe["layout_of"]("model.layers.1.mlp.experts.gate_up_proj")["dims"]
    assert [moe["_mesh_axes"](s) for s in expert] == [("ep",), ("tp",), ()]
    mpmd = _tables(sources["mpmd"])
    assert [(p["first_rank"], p["ranks"], p["plan"]["MESH"][-1]) for p in mpmd["PROGRAMS"]] == [
        (0, 2, ("tp", 1)), (2, 2, ("tp", 2))]


def test_features_without_a_hyper_parallel_api_are_refused_before_writing():
    widths = declare("llama3-8b", overrides=TINY, tp=2, pp=2, stage_tp=(2, 1), cluster="dgx-a100", devices=3,
                     global_batch=16, seq_len=32)
    with pytest.raises(InvalidInput, match="PipelineStage gives each of the 2 stages world / stages ranks"):
        export(widths, "hyper-parallel")
    replicas = declare("mixtral-8x7b", overrides=MOE, ep=2, dp=8, zero=1, **WHERE)
    with pytest.raises(InvalidInput, match=r"keeps 4 data-parallel replicas of each expert \(dp 8 over ep 2\)"):
        export(replicas, "hyper-parallel")
    crossed = megatron(declare("llama3-8b", overrides=TINY, tp=2, dp=4, **WHERE))
    crossed["layouts"]["params"]["lm_head.weight"]["dims"] = [["tp", "dp"], None]
    with pytest.raises(InvalidInput, match=r"splits lm_head.weight \(dim over tp, dp\) against the mesh order"):
        export(crossed, "hyper-parallel")
