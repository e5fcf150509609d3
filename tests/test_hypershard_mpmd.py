"""HyperMPMD declarations: a mesh per program, programs on their own ranks with their own sections; plan -o writes
them, validate and estimate --plan re-score them to the planned numbers, edits are scored as written, and every
backend exports them (Python that compiles and selects the rank's program, ONNX with a configuration per program)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import onnx
import pytest
from typer.testing import CliRunner

from cli.app import app
from planner.errors import InvalidInput
from planner.hypershard import declare_programs, read_document, strategy_of, write_document
from planner.hypershard.backends import export
from planner.hypershard.declared import estimate_declared, score_document, strategies_of
from planner.hypershard.io import check_schema
from planner.hypershard.programs import view
from planner.hypershard.validate import validate_document
from tests.jax_plan import run_jax_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
#: A llava whose encoders and backbone are both small: 2 + 2 ranks of a DGX, in about a second.
#: Small, but wide enough that splitting the backbone's matmuls over tp=2 beats replicating them.
TINY_VLM = dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=512, vision_layers=2, vision_hidden=512,
                vision_heads=8, vision_ffn=2048)
WHERE = dict(cluster="dgx-a100", global_batch=8, seq_len=1024)
ENCODERS, BACKBONE = "vision_tower+multi_modal_projector", "language_model"
MPMD_MODEL = ("internvl2-76b", "--set", "vision_image_size=1568", "--set", "layers=40", "--set", "vision_layers=22")


@pytest.fixture(scope="module")
def doc():
    """Encoders data-parallel on ranks 0-1, the backbone tensor-parallel on ranks 2-3."""
    return declare_programs("llava-style-7b", overrides=TINY_VLM, programs=[dict(devices=2), dict(devices=2, tp=2)],
                            **WHERE)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`plan -o` of a plan HyperMPMD wins: InternVL2-76B cut to 40 LLM and 22 ViT layers, with 1568 px images
    (3,136 image tokens of 4,096) on 64 CloudMatrix384 dies held to 30 GiB each, nothing offloaded. One program
    must shard and recompute both the ViT and the LLM to fit; as two groups each keeps only its own (56.9 s
    against 63.5 s a step when this case was chosen; the HyperMPMD search weighs both). The whole model on 128
    dies at 40 GiB wins too, but its two searches took 118 s of the suite, these 37 s."""
    folder = tmp_path_factory.mktemp("mpmd")
    args = ["plan", *MPMD_MODEL, "--cluster", "cloudmatrix384-die",
            "--devices", "64", "--global-batch", "512", "--seq-len", "4096", "--memory-gib", "30",
            "--no-offload", "--json", "-o", str(folder / "plan.yaml")]
    # the same plan again in a process of its own (this checkout's code, whatever is installed), beside this one:
    # two searches at once, as on a busy machine
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with subprocess.Popen([sys.executable, "-m", "cli.app", *args[:-1], str(folder / "again.yaml")], cwd=ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as again:
        try:
            r = runner.invoke(app, args)
            _, err = again.communicate()
        finally:
            if again.poll() is None:
                again.kill()
    assert r.exit_code == 0, r.output
    assert again.returncode == 0, err
    return folder, json.loads(r.output), args


def test_the_document_has_a_mesh_and_sections_per_program(doc):
    check_schema(doc, "doc")
    assert [m["name"] for m in doc["meshes"]] == [ENCODERS, BACKBONE]
    assert [(m["devices"], {a["name"]: a["size"] for a in m["axes"]}["tp"]) for m in doc["meshes"]] == [(2, 1), (2, 2)]
    progs = doc["programs"]
    assert [(p["name"], p["mesh"], p["ranks"]) for p in progs] == [
        (ENCODERS, ENCODERS, {"first": 0, "count": 2}), (BACKBONE, BACKBONE, {"first": 2, "count": 2})]
    assert progs[0]["submodels"] == ["vision_tower", "multi_modal_projector"]
    for p in progs:
        assert {"layouts", "zero", "recompute", "offload", "estimate"} <= set(p)
    assert not {"layouts", "zero", "recompute", "offload"} & set(doc)  # no top-level sections to confuse
    vision = set(progs[0]["layouts"]["params"])
    assert vision and all(k.startswith("model.vision_tower") or k.startswith("model.multi_modal") for k in vision)
    assert any("language_model" in k for k in progs[1]["layouts"]["params"])
    assert progs[1]["layouts"]["params"]["model.language_model.layers.*.self_attn.o_proj.weight"]["dims"][1] == "tp"
    assert [s.tp for s in strategies_of(doc)] == [1, 2] and strategy_of(doc, 0).dp == 2
    assert doc["estimate"]["breakdown_s"]["mpmd_fill"] > 0


def test_a_program_view_is_a_one_program_declaration_on_its_own_ranks(doc):
    v = view(doc, 1)
    assert v["meshes"][0]["name"] == BACKBONE and v["cluster"]["devices"] == 2
    assert v["programs"][0]["ranks"] == {"first": 0, "count": 2} and v["zero"] == doc["programs"][1]["zero"]
    assert v["estimate"] == doc["programs"][1]["estimate"]


def test_round_trip_and_bytes(doc, tmp_path):
    for suffix in (".yaml", ".json"):
        write_document(doc, str(tmp_path / f"d{suffix}"))
        report = validate_document(read_document(str(tmp_path / f"d{suffix}")))
        assert report.ok, report.to_dict()
        assert report.estimate["step_time_s"] == doc["estimate"]["step_time_s"]
        assert report.estimate["memory_gib"] == doc["estimate"]["memory_gib"]
        assert [p["estimate"]["step_time_s"] for p in report.estimate["programs"]] == [
            p["estimate"]["step_time_s"] for p in doc["programs"]]
    again = declare_programs("llava-style-7b", overrides=TINY_VLM, programs=[dict(devices=2), dict(devices=2, tp=2)],
                             **WHERE)
    write_document(again, str(tmp_path / "again.yaml"))
    assert (tmp_path / "again.yaml").read_bytes() == (tmp_path / "d.yaml").read_bytes()


@pytest.mark.slow
def test_plan_writes_the_programs_it_chose_and_validate_gives_its_numbers(planned):
    folder, plan, args = planned
    assert (folder / "again.yaml").read_bytes() == (folder / "plan.yaml").read_bytes()  # the same plan, the same bytes
    mp = plan["mpmd"]
    assert mp["used"] and mp["step_time_s"] < mp["spmd_step_time_s"], (
        f"HyperMPMD no longer wins this case ({mp['step_time_s']:.2f} s against one program's "
        f"{mp['spmd_step_time_s']:.2f} s): pick a case it wins, so that plan -o writes programs")
    doc = read_document(str(folder / "plan.yaml"))
    assert [(p["name"], [p["ranks"]["first"], p["ranks"]["first"] + p["ranks"]["count"] - 1]) for p in doc["programs"]] \
        == [(p["name"], p["ranks"]) for p in plan["programs"]]
    assert [strategy_of(doc, k).short() for k in range(2)] == [p["strategy"]["summary"] for p in plan["programs"]]
    r = runner.invoke(app, ["validate", str(folder / "plan.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["estimate"]["step_time_s"] == plan["estimate"]["step_time_s"]
    model = [*MPMD_MODEL, "--plan", str(folder / "plan.yaml")]
    r = runner.invoke(app, ["estimate", *model, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["step_time_s"] == plan["estimate"]["step_time_s"] and got["memory_gib"] == plan["estimate"]["memory_gib"]
    human = runner.invoke(app, ["estimate", *model], terminal_width=160)
    assert "2 programs (HyperMPMD)" in human.output and BACKBONE in human.output


def test_a_hand_edited_split_is_scored_as_written(doc, tmp_path):
    """Three encoder ranks and one backbone rank: the backbone loses its tensor axis and gets slower."""
    edited = copy.deepcopy(doc)
    edited["programs"][0]["ranks"] = {"first": 0, "count": 3}
    edited["programs"][1]["ranks"] = {"first": 3, "count": 1}
    edited["meshes"][0]["devices"], edited["meshes"][1]["devices"] = 3, 1
    for mesh, sizes in ((edited["meshes"][0], {"dp": 3}), (edited["meshes"][1], {"tp": 1})):
        for a in mesh["axes"]:
            a["size"] = sizes.get(a["name"], a["size"])
            a.pop("stride")
    edited["programs"][1]["layouts"]["params"] = {k: dict(e, dims=[None] * len(e["dims"]))
                                                  for k, e in edited["programs"][1]["layouts"]["params"].items()}
    edited["programs"][1]["layouts"]["sequence_parallel"] = False
    for p in edited["programs"]:
        p.pop("micro_batches")
        for st in p["stages"]:
            st.pop("ranks")
    write_document(edited, str(tmp_path / "e.yaml"))
    got = estimate_declared(str(tmp_path / "e.yaml"), "llava-style-7b")
    want = declare_programs("llava-style-7b", overrides=TINY_VLM, programs=[dict(devices=3), dict(devices=1)],
                            global_batch=8, seq_len=1024, cluster="dgx-a100")["estimate"]
    assert got["step_time_s"] == want["step_time_s"] and got["memory_gib"] == want["memory_gib"]
    assert got["programs"][1]["estimate"]["step_time_s"] > doc["programs"][1]["estimate"]["step_time_s"]
    report = validate_document(edited)
    assert [c.name for c in report.checks if not c.ok] == ["estimate"]  # the recorded figures are the old split's


@pytest.mark.parametrize("edit, check, message", [
    (lambda d: d["programs"].reverse(), "cluster", "starts at rank 2"),
    (lambda d: d["programs"][1]["ranks"].update(count=1), "cluster", "the programs' ranks end at 2"),
    (lambda d: d["programs"][1].update(mesh="world"), "strategy", "runs on mesh 'world', but the meshes are"),
    (lambda d: d["programs"][1]["zero"].update(stage=5), None, r"programs\[1\]\.zero\.stage' must be at most 3"),
    (lambda d: d["programs"][1].pop("zero"), None, r"programs\[1\]' is missing 'zero'"),
    (lambda d: [p.update(name=p["name"] + "_x") for p in d["programs"]], "model", "but the model splits into"),
    (lambda d: d["meshes"][1]["axes"][0].update(size=4), "cluster", "but programs[1].ranks.count is 2"),
])
def test_broken_programs_are_reported_in_one_sentence(doc, edit, check, message):
    bad = copy.deepcopy(doc)
    edit(bad)
    if check is None:
        with pytest.raises(InvalidInput, match=message):
            validate_document(bad)
        return
    failed = [c for c in validate_document(bad).checks if not c.ok]
    assert failed[0].name == check and message in failed[0].detail, failed
    assert "\n" not in failed[0].detail


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("backend", ["torch", "jax", "mindspore", "hyper-parallel"])
def test_python_exports_select_the_program_of_a_rank(doc, backend):
    source = export(doc, backend)
    compile(source, f"mpmd_{backend}.py", "exec")
    assert "2 programs (HyperMPMD)" in source and "def use_program(rank_or_name):" in source
    ns: dict = {}
    start = source.index("PROGRAMS = ")
    exec(source[start:source.index("\n\n\n", start)], ns)  # the table is a plain literal
    table = ns["PROGRAMS"]
    assert [(p["name"], p["first_rank"], p["ranks"]) for p in table] == [(ENCODERS, 0, 2), (BACKBONE, 2, 2)]
    mesh_key = "DEVICE_MATRIX" if backend == "mindspore" else "MESH"
    assert ("tp", 2) in table[1]["plan"][mesh_key] and ("tp", 1) in table[0]["plan"][mesh_key]
    if backend in ("jax", "mindspore"):  # importable without the framework's runtime pieces being called
        return
    assert "def build_mesh(" in source and "PROGRAM is None" in source


@pytest.mark.jax
@pytest.mark.skipif(sys.modules.get("jax") is None and __import__("importlib").util.find_spec("jax") is None,
                    reason="jax is not installed")
def test_jax_export_puts_each_program_on_its_own_devices(doc, tmp_path):
    path = tmp_path / "plan_jax.py"
    path.write_text(export(doc, "jax"))
    got = run_jax_plan(path, 4, (
        "out = {}\n"
        "for rank in (0, 3):\n"
        "    name = m.use_program(rank)\n"
        "    mesh = m.build_mesh()\n"
        "    w = 'model.language_model.layers.0.self_attn.q_proj.weight'\n"
        "    arr = m.shard_params({w: np.zeros((256, 256), np.float32)}, mesh)[w] if rank == 3 else None\n"
        "    out[name] = {'devices': [d.id for d in mesh.devices.flat],\n"
        "                 'shards': sorted([s.device.id, s.index[0].start or 0] for s in arr.addressable_shards)\n"
        "                 if arr is not None else None}\n"
        "print(json.dumps(out))\n"
    ))
    assert got[ENCODERS]["devices"] == [0, 1] and got[BACKBONE]["devices"] == [2, 3]
    assert got[BACKBONE]["shards"] == [[2, 0], [3, 128]]  # q_proj split on dim 0 over the backbone's tp


def test_onnx_export_has_a_configuration_per_program(doc):
    model = onnx.load_from_string(export(doc, "onnx"))
    onnx.checker.check_model(model)
    assert [(c.name, c.num_devices, list(c.device)) for c in model.configuration] == [
        (f"hyperplan/{ENCODERS}", 2, ["0", "1"]), (f"hyperplan/{BACKBONE}", 2, ["2", "3"])]
    by_config: dict[str, set[str]] = {}
    for n in model.graph.node:
        for dc in n.device_configurations:
            by_config.setdefault(dc.configuration_id, set()).update(s.tensor_name for s in dc.sharding_spec)
    assert any(t.startswith("model.vision_tower") for t in by_config[f"hyperplan/{ENCODERS}"])
    assert not any(t.startswith("model.vision_tower") for t in by_config[f"hyperplan/{BACKBONE}"])
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    spec = next(s for n in model.graph.node for dc in n.device_configurations for s in dc.sharding_spec
                if s.tensor_name == q)
    assert [(d.axis, d.simple_sharding[0].num_shards) for d in spec.sharded_dim] == [(0, 2)]
    assert sorted(spec.device) == [0, 1]  # devices of the backbone's configuration: global ranks 2 and 3


def test_score_document_matches_declare_programs(doc):
    assert score_document(doc).plan["estimate"]["step_time_s"] == doc["estimate"]["step_time_s"]
    with pytest.raises(InvalidInput, match="3 programs are given, but llava-style-7b splits into 2"):
        declare_programs("llava-style-7b", overrides=TINY_VLM, programs=[dict(devices=1)] * 3, **WHERE)


def _mesh_worker(rank: int, init: str, path: str, out: str) -> None:
    import importlib.util

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=4)
    spec = importlib.util.spec_from_file_location("plan_mpmd", path)
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    name = plan.use_program(rank)
    mesh = plan.build_mesh("cpu")
    axis = next(a for a, n in plan.MESH if n == 2)  # each program has one axis of size 2 here
    value = torch.tensor([float(rank)])
    dist.all_reduce(value, group=mesh.get_group(axis))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"program": name, "ranks": mesh.mesh.flatten().tolist(), "axis": axis, "sum": value.item()}, f)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.torch
def test_torch_export_builds_each_programs_mesh_over_its_ranks(doc, tmp_path):
    """Four gloo processes: ranks 0-1 join the encoders' mesh, 2-3 the backbone's; a collective stays inside."""
    pytest.importorskip("torch")
    from tests.forked import run_forked

    path = tmp_path / "plan_torch.py"
    path.write_text(export(doc, "torch"))
    init = f"file://{tmp_path}/rendezvous"  # a file, not a probed TCP port another process may take first
    assert run_forked(_mesh_worker, [(r, init, str(path), str(tmp_path / "out")) for r in range(4)], 120) == [0] * 4
    got = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(4)]
    assert [g["program"] for g in got] == [ENCODERS, ENCODERS, BACKBONE, BACKBONE]
    assert [g["ranks"] for g in got] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["axis"] for g in got] == ["dp_replicate", "dp_replicate", "tp", "tp"]
    assert [g["sum"] for g in got] == [1.0, 1.0, 5.0, 5.0]


def test_a_plan_of_other_programs_is_refused_in_one_sentence(doc):
    from planner.hypershard import build_document

    sc = score_document(doc)
    plan = copy.deepcopy(sc.plan)
    for p, name in zip(plan["programs"], ("attention", "experts")):
        p["name"] = name
    with pytest.raises(InvalidInput, match=r"this plan runs the programs attention \| experts, and declarations hold "
                                           r"the encoders \| backbone split .* re-plan with --no-mpmd"):
        build_document(plan, sc.graph, sc.structure, sc.request)
