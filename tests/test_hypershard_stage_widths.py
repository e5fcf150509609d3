"""Declarations of pipelines whose stages differ in width: written, validated, re-scored, edited, exported.

A stage states its `tp` and its `ranks` (the blocks `plan.stage_ranks` places widest first); the mesh has the
widest tp and no pp stride. Every exporter gives each stage its own mesh; the torch run of such a pipeline is
in test_hypershard_torch.py.
"""

from __future__ import annotations

import copy
import json

import onnx
import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from planner.api import estimate_model
from planner.errors import InvalidInput
from planner.hypershard import declare, declare_programs, read_document, score_document, strategy_of, write_document
from planner.hypershard.backends import BACKENDS, LAUNCH, export
from planner.hypershard.backends.common import PEERS_SRC, groups
from planner.hypershard.validate import validate_document
from planner.plan import stage_ranks

runner = CliRunner()
SMALL = dict(cluster="dgx-h100", devices=24, global_batch=4, seq_len=2048, overrides=dict(layers=4))
WIDE = dict(tp=8, pp=2, dp=2, stage_tp=(4, 8), sp=True)


@pytest.fixture(scope="module")
def doc():
    return declare("llama3-8b", **SMALL, **WIDE)


def _edited(doc: dict, widths: tuple[int, ...], ranks: list[tuple[int, int]] | None = None) -> dict:
    """A user's edit of the stages' tp (and, if given, their ranks); the recorded figures no longer hold."""
    out = copy.deepcopy(doc)
    out.pop("estimate")
    for st, w in zip(out["programs"][0]["stages"], widths):
        st["tp"] = w
    for st, (first, count) in zip(out["programs"][0]["stages"], ranks or []):
        st["ranks"] = {"first": first, "count": count}
    return out


def test_stages_state_their_width_and_ranks_and_the_file_is_deterministic(doc, tmp_path):
    s = strategy_of(doc)
    assert s.stage_tp == (4, 8) and s.tp == 8 and s.devices == 24
    stages = doc["programs"][0]["stages"]
    placed = stage_ranks(s)
    assert [st["tp"] for st in stages] == [4, 8]
    assert [(st["ranks"]["first"], st["ranks"]["first"] + st["ranks"]["count"] - 1) for st in stages] == placed
    assert placed == [(16, 23), (0, 15)]  # the wide stage first: its tensor groups stay within a node
    axes = {a["name"]: a for a in doc["meshes"][0]["axes"]}
    assert axes["tp"]["size"] == 8 and axes["pp"]["stride"] is None and "stage0" not in axes
    assert "stages of different widths" in doc["meshes"][0]["placement"]
    again = declare("llama3-8b", **SMALL, **WIDE)
    for suffix in (".yaml", ".json"):
        write_document(doc, str(tmp_path / f"a{suffix}"))
        write_document(again, str(tmp_path / f"b{suffix}"))
        assert (tmp_path / f"a{suffix}").read_bytes() == (tmp_path / f"b{suffix}").read_bytes()
        assert read_document(str(tmp_path / f"a{suffix}")) == json.loads(json.dumps(doc))  # schema-valid, same


def test_validate_rescores_to_the_recorded_figures(doc):
    rep = validate_document(doc)
    assert rep.ok, [c for c in rep.checks if not c.ok]
    assert rep.estimate["step_time_s"] == doc["estimate"]["step_time_s"]
    assert rep.estimate["memory_gib"] == doc["estimate"]["memory_gib"]
    assert [st["devices"] for st in rep.estimate["stages"]] == [8, 16]
    assert "tp=4+8" in next(c.detail for c in rep.checks if c.name == "cluster")


def test_a_hand_edit_of_the_stage_widths_is_scored_as_written(doc):
    swapped = _edited(doc, (8, 4), [(0, 16), (16, 8)])
    rep = validate_document(swapped)
    assert rep.ok, [c for c in rep.checks if not c.ok]
    want = estimate_model("llama3-8b", **SMALL, **dict(WIDE, stage_tp=(8, 4)))
    got = score_document(swapped).plan["estimate"]
    assert got["step_time_s"] == want["step_time_s"] != doc["estimate"]["step_time_s"]
    assert [st["devices"] for st in got["stages"]] == [16, 8]


def test_stale_ranks_after_an_edit_name_the_ranks_to_write(doc):
    rep = validate_document(_edited(doc, (8, 4)))
    cluster = next(c for c in rep.checks if c.name == "cluster")
    assert not cluster.ok and "set stages[0].ranks to first 0, count 16" in cluster.detail
    assert score_document(_edited(doc, (8, 4))).plan["strategy"]["stage_tp"] == [8, 4]  # scored all the same


@pytest.mark.parametrize("widths, says", [
    ((8, 8), "the stages' tensor degrees 8+8 x cp 1 x dp 2 = 32 devices, but cluster.devices is 24; change "
             "stages[].tp so that they add up to 12"),
    ((2, 4), "the tp axis of mesh 'world' must be the widest, 4, not 8; set it to 4"),
])
def test_an_edit_that_breaks_the_device_count_is_one_sentence(doc, widths, says):
    bad = _edited(doc, widths)
    with pytest.raises(InvalidInput, match="^[^\n]*$") as err:
        score_document(bad)
    assert says in str(err.value)
    rep = validate_document(bad)
    assert not rep.ok and says in " ".join(c.detail for c in rep.checks if not c.ok)


def test_uniform_pipelines_keep_their_shape():
    uni = declare("llama3-8b", **SMALL, tp=4, pp=3, dp=2)
    stages = uni["programs"][0]["stages"]
    assert all("tp" not in st for st in stages) and [st["ranks"]["first"] for st in stages] == [0, 8, 16]
    assert next(a for a in uni["meshes"][0]["axes"] if a["name"] == "pp")["stride"] == 8
    assert len(groups(uni)) == 1


def test_a_program_of_several_may_have_stages_of_different_widths():
    """HyperMPMD: the encoders on ranks 0-1, the backbone's stages 1 + 2 tensor ranks wide, 2 replicas each."""
    tiny = dict(layers=2, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=512, vision_layers=2, vision_hidden=128,
                vision_heads=4, vision_ffn=256)
    doc = declare_programs("llava-style-7b", overrides=tiny, cluster="dgx-a100", global_batch=8, seq_len=1024,
                           programs=[dict(devices=2), dict(devices=6, tp=2, pp=2, dp=2, stage_tp=(1, 2))])
    rep = validate_document(doc)
    assert rep.ok, [c for c in rep.checks if not c.ok]
    assert strategy_of(doc, 1).stage_tp == (1, 2)
    backbone = doc["programs"][1]["stages"]
    assert [(st["tp"], st["ranks"]["first"], st["ranks"]["count"]) for st in backbone] == [(1, 6, 2), (2, 2, 4)]
    assert [(g.name, g.first, g.count) for g in groups(doc)] == [
        ("vision_tower+multi_modal_projector", 0, 2), ("language_model/stage0", 6, 2), ("language_model/stage1", 2, 4)]
    model = onnx.load_from_string(export(doc, "onnx"))
    assert [c.name for c in model.configuration][1:] == ["hyperplan/language_model/stage0",
                                                         "hyperplan/language_model/stage1"]


def _run(source: str, names: dict) -> dict:
    scope = dict(names)
    exec(compile(source, "generated", "exec"), scope)
    return scope


def test_every_backend_gives_each_stage_its_own_mesh(doc):
    """Every code backend (launch configs refuse stages of different widths: tests/test_launch_*.py)."""
    sources = {}
    with pytest.raises(InvalidInput, match="PipelineStage gives each of the 2 stages world / stages ranks"):
        export(doc, "hyper-parallel")  # its stages are equal by construction: refused before writing
    for backend in (b for b in BACKENDS if b not in LAUNCH and b != "hyper-parallel"):
        out = export(doc, backend)
        assert out == export(doc, backend)  # deterministic
        if backend != "onnx":
            compile(out, backend, "exec")
            sources[backend] = out
    torch_src = sources["torch"]
    assert "main/stage0" in torch_src and "class WidthSchedule" in torch_src and "def stage_peers" in torch_src
    for backend, src in sources.items():
        table = src[src.index("PROGRAMS = "):src.index("\n\n\n", src.index("PROGRAMS = "))]
        programs = eval(table.removeprefix("PROGRAMS = "))  # a literal the exporter wrote
        assert [(p["name"], p["first_rank"], p["ranks"]) for p in programs] == [("main/stage0", 16, 8),
                                                                                 ("main/stage1", 0, 16)], backend
        meshes = [dict(p["plan"].get("MESH") or p["plan"]["DEVICE_MATRIX"]) for p in programs]
        assert [m["tp"] for m in meshes] == [4, 8] and all(m["pp"] == 1 for m in meshes), backend
        assert [p["plan"]["STAGE"] for p in programs] == [0, 1], backend


def test_onnx_nodes_carry_their_stages_configuration(doc):
    model = onnx.load_from_string(export(doc, "onnx"))
    onnx.checker.check_model(model)
    confs = {c.name: [int(d) for d in c.device] for c in model.configuration}
    assert confs == {"hyperplan/main/stage0": list(range(16, 24)), "hyperplan/main/stage1": list(range(16))}
    seen = {}
    for node in model.graph.node:
        for dc in node.device_configurations:
            seen.setdefault(dc.configuration_id, set()).add(dc.pipeline_stage)
            for spec in dc.sharding_spec:
                devices = [d for d in spec.device if d >= 0]
                devices += [x for m in spec.index_to_device_group_map for x in m.value]
                assert max(devices) < len(confs[dc.configuration_id])  # within the stage's own devices
    assert seen == {"hyperplan/main/stage0": {0}, "hyperplan/main/stage1": {1}}
    q = next(n for n in model.graph.node if any(x.endswith("layers.3.self_attn.q_proj.weight") for x in n.input))
    spec = next(s for s in q.device_configurations[0].sharding_spec if s.tensor_name.endswith("q_proj.weight"))
    assert spec.sharded_dim[0].simple_sharding[0].num_shards == 8  # the wide stage's tp


@pytest.mark.parametrize("widths", [(4, 8), (8, 4), (1, 2), (2, 1), (2, 4, 8), (8, 2, 2)])
def test_stage_peers_hand_every_rank_exactly_one_copy(widths):
    """Both ways across each boundary: every rank of the receiving stage gets one copy, from the rank it reads
    from, of its own data-parallel replica."""
    replicas, table, first = 2, [None] * len(widths), 0
    for k in sorted(range(len(widths)), key=lambda k: -widths[k]):  # widest first, as plan.stage_ranks
        table[k] = {"stage": k, "first_rank": first, "ranks": widths[k] * replicas, "tp": widths[k]}
        first += widths[k] * replicas
    peers = _run(PEERS_SRC, {"STAGE_RANKS": table})["stage_peers"]

    def ranks(k):
        return range(table[k]["first_rank"], table[k]["first_rank"] + table[k]["ranks"])

    def replica(k, r):
        return (r - table[k]["first_rank"]) // widths[k]

    for k in range(len(widths) - 1):
        for src, dst in ((k, k + 1), (k + 1, k)):
            assert sorted(r for s in ranks(src) for r in peers(s, dst)[1]) == list(ranks(dst))
            for r in ranks(dst):
                source = peers(r, src)[0]
                assert source in ranks(src) and r in peers(source, dst)[1]
                assert replica(src, source) == replica(dst, r)


def test_estimate_cli_takes_stage_widths():
    base = ["estimate", "llama3-8b", "--layers", "4", "--cluster", "dgx-h100", "--global-batch", "4",
            "--seq-len", "2048", "--sp", "--zero", "1"]
    r = runner.invoke(app, [*base, "--devices", "24", "--stage-tp", "4,8", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["strategy"]["stage_tp"] == [4, 8] and [s["devices"] for s in out["stages"]] == [8, 16]
    for extra, says in (
        (["--devices", "24", "--stage-tp", "4,8,8", "--pp", "2"], "--stage-tp 4,8,8 gives 3 stages, but --pp is 2"),
        (["--devices", "24", "--stage-tp", "0,8"], "every stage's tensor degree must be at least 1"),
        (["--devices", "24", "--stage-tp", "4,x"], "like --stage-tp 4,8"),
        (["--devices", "24", "--stage-tp", "8"], "gives one stage"),
        (["--devices", "24", "--stage-tp", "4,8", "--tp", "4"], "tp is then the widest stage's degree, 8"),
        (["--devices", "32", "--dp", "2", "--stage-tp", "4,8"], "= 24 devices, but the cluster has 32"),
    ):
        bad = runner.invoke(app, [*base, *extra], terminal_width=300)
        assert bad.exit_code == 2 and says in bad.output and "Traceback" not in bad.output, bad.output


@pytest.mark.slow
def test_plan_writes_a_stage_width_plan_that_validates_and_estimates_to_its_numbers(tmp_path):
    """A plan with stages of different widths (fixed by --stage-tp: over the whole space TP2·CP4·PP3 is
    faster here, and the planner's own picks of widths are test_stage_widths'): plan -o, validate and
    estimate --plan agree exactly."""
    out = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", "llama3-8b", "--layers", "8", "--cluster", "dgx-h100", "--devices", "24",
                            "--global-batch", "4", "--seq-len", "8192", "--no-mpmd", "--stack", "torchtitan",
                            "--stage-tp", "4,8", "--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert len(set(plan["strategy"]["stage_tp"])) > 1
    written = json.loads(out.read_text())
    assert [st["tp"] for st in written["programs"][0]["stages"]] == plan["strategy"]["stage_tp"]
    checked = runner.invoke(app, ["validate", str(out), "--json"])
    assert checked.exit_code == 0 and json.loads(checked.output)["ok"], checked.output
    scored = runner.invoke(app, ["estimate", "llama3-8b", "--plan", str(out), "--json"])
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.output)["step_time_s"] == plan["estimate"]["step_time_s"]
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    assert validate_document(read_document(str(tmp_path / "plan.yaml"))).ok
