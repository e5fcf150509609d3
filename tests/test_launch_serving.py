"""The vllm and sglang exports of serving declarations: every flag is the engine's own (pinned from its source at a
recorded commit; neither engine installs here without a CUDA torch), the degrees of each server are its phase's,
experts land where the declaration puts them, disaggregated phases are two servers joined as each engine joins
them, and what neither can say is refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_plans import parse_pinned, plan, serving
from planner.errors import InvalidInput
from planner.hypershard.backends import export, launch_config
from planner.hypershard.backends.common import mesh_sizes
from planner.hypershard.programs import mesh_of

DATA = Path(__file__).parent / "data"
VLLM = json.loads((DATA / "vllm_engine_args.json").read_text())
SGLANG = json.loads((DATA / "sglang_server_args.json").read_text())
WRITTEN = ["moe_disagg", "moe_uneven", "dense_colocated", "dense_pp"]


def phases(doc: dict) -> dict[str, dict]:
    return {p["phase"]: dict(mesh_sizes(mesh_of(doc, k)), experts=(p.get("experts") or {}).get("count", 0),
                             devices=p["ranks"]["count"], batch=p["batch_per_replica"])
            for k, p in enumerate(doc["programs"])}


def servers(doc: dict, backend: str) -> list[tuple[dict, dict, object]]:
    """(command, its phase, its parsed flags) of each server the export starts."""
    cfg = launch_config(doc, backend)["config"]
    by = phases(doc)
    out = []
    for c in cfg["commands"]:
        argv = c["argv"]
        flags = argv[next(i for i, w in enumerate(argv) if w.startswith("--")):]
        ns, _ = parse_pinned(flags, VLLM if backend == "vllm" else SGLANG)
        out.append((c, by["decode" if c["phase"] == "both" else c["phase"]], ns))
    assert len(out) == (1 if cfg["mode"] == "co-located" else 2)
    return out


@pytest.mark.parametrize("name", WRITTEN)
def test_vllm_servers_take_each_phases_degrees(name):
    doc = serving(name)
    for c, ph, ns in servers(doc, "vllm"):
        assert c["argv"][:3] == ["vllm", "serve", '"$MODEL"']
        assert ns.tensor_parallel_size * ns.pipeline_parallel_size * ns.data_parallel_size == ph["devices"]
        assert (ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size) == (ph["tp"], ph["pp"], ph["dp"])
        assert bool(getattr(ns, 'enable_expert_parallel', None)) == bool(ph["experts"])
        if ph["experts"]:  # vLLM's EP is TP x DP, the ranks the declaration spreads the experts over
            assert ns.tensor_parallel_size * ns.data_parallel_size == ph["ep"]
        assert ns.max_num_seqs == ph["batch"] and ns.max_model_len == 24
        if c["phase"] == "both":
            continue
        kv = json.loads(ns.kv_transfer_config)
        pinned = VLLM["kv_transfer_config"]
        assert set(kv) <= set(pinned["fields"]) and kv["kv_connector"] in pinned["connectors"]
        assert kv["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[c["phase"]]


def test_vllm_places_uneven_experts_as_the_declaration_does():
    """vLLM's linear placement (first E mod EP ranks one more) is the declaration's numpy.array_split rule."""
    doc = serving("moe_uneven")
    for prog in doc["programs"]:
        e, ep = prog["experts"]["count"], mesh_sizes(mesh_of(doc, doc["programs"].index(prog)))["ep"]
        counts = [e // ep + (1 if r < e % ep else 0) for r in range(ep)]
        assert (max(counts), min(counts)) == (prog["experts"]["per_rank_max"], prog["experts"]["per_rank_min"])
    export(doc, "vllm")


@pytest.mark.parametrize("name", ["moe_disagg", "dense_colocated", "dense_pp"])
def test_sglang_servers_take_each_phases_degrees(name):
    doc = serving(name)
    for c, ph, ns in servers(doc, "sglang"):
        assert c["argv"][:3] == ["python", "-m", "sglang.launch_server"]
        assert ns.model_path == '"$MODEL"' and ns.pp_size == ph["pp"] and ns.dp_size == ph["dp"]
        if getattr(ns, "enable_dp_attention", None):  # attention DP in groups of tp_size / dp_size; the MoE over all tp_size ranks
            assert ns.tp_size // ns.dp_size == ph["tp"] and ns.tp_size * ns.pp_size == ph["devices"]
            assert ns.max_running_requests == ph["batch"] * ph["dp"]
        else:  # dp_size whole replicas of tp_size ranks
            assert ns.tp_size == ph["tp"] and ns.tp_size * ns.pp_size * ns.dp_size == ph["devices"]
            assert ns.max_running_requests == ph["batch"]
        assert (getattr(ns, "ep_size", None) or 1) == (ph["ep"] if ph["experts"] else 1)
        assert getattr(ns, "disaggregation_mode", None) == (None if c["phase"] == "both" else c["phase"])


@pytest.mark.parametrize("backend, name, words", [
    ("vllm", "kv_offload", "KV-cache offload (50% of decode's cache on the host)"),
    ("sglang", "kv_offload", "KV-cache offload (50%"),
    ("vllm", "kv_int8", "int8 KV cache"),
    ("sglang", "moe_uneven", "4 experts over prefill's EP 3 (SGLang's EP MoE needs them to divide)"),
])
def test_what_the_engines_cannot_serve_is_refused_in_one_sentence(backend, name, words):
    with pytest.raises(InvalidInput, match=f"the {backend} backend cannot express this plan's") as err:
        export(serving(name), backend)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("backend", ["megatron", "torchtitan", "deepspeed", "mindformers"])
def test_a_plan_of_several_programs_is_refused_by_every_training_launch_config(backend):
    import copy

    doc = copy.deepcopy(plan("zero2"))
    doc["programs"].append(dict(doc["programs"][0], name="vision"))
    with pytest.raises(InvalidInput, match=f"the {backend} backend cannot express a plan of 2 programs") as err:
        export(doc, backend)
    assert "\n" not in str(err.value)


def test_training_and_serving_declarations_go_to_their_own_backends():
    with pytest.raises(InvalidInput, match="declaration is of a training plan; export it with --backend megatron"):
        export(plan("zero2"), "vllm")
    with pytest.raises(InvalidInput, match="is of a serving plan; export it with --backend vllm or sglang"):
        export(serving("moe_disagg"), "megatron")


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_the_script_holds_the_commands(backend):
    import shlex

    doc = serving("moe_disagg")
    text = export(doc, backend)
    blocks = [b for b in text.split("\n\n") if not b.startswith("# ") or "\n" in b]
    commands = [shlex.split(b.split("\n", 1)[1].replace("\\\n", " ").replace('"$MODEL"', "MODEL"))
                for b in blocks if b.startswith("# prefill") or b.startswith("# decode")]
    want = [[w.replace('"$MODEL"', "MODEL") for w in c["argv"]] for c in launch_config(doc, backend)["config"]["commands"]]
    assert commands == want
