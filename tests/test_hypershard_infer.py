"""Serving declarations (issue 9): `plan --mode infer -o` writes one; `validate` re-scores it to the numbers `plan`
printed; hand edits (a decode batch, a tp, a KV offload) are scored as written; a bad file gives one sentence; every
Python backend's export of it compiles (what the backends do with it: test_hypershard_infer_backends.py).

Plans: Mixtral-8x7B on 96 CloudMatrix NPUs (disaggregated, prefill pp8, 8 experts over ep 4 and 8: the planner
splits experts evenly), Llama-3-70B on 64 (disaggregated, decode tp4) and a 4-layer DeepSeek-V3 on 32 (co-located,
MLA, int8).
"""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from planner.errors import InvalidInput
from planner.hypershard import declare, read_document, write_document
from planner.hypershard.backends import export
from planner.hypershard.io import check_schema
from planner.hypershard.validate import validate_document

runner = CliRunner()
CM = ["--cluster", "cloudmatrix384", "--mode", "infer"]
PLANS = {
    "mixtral": ["mixtral-8x7b", *CM, "--devices", "96", "--prompt-len", "4096", "--gen-len", "1024", "--ttft-ms",
                "2000", "--tpot-ms", "50"],
    "llama": ["llama3-70b", *CM, "--devices", "64", "--prompt-len", "4096", "--gen-len", "1024", "--ttft-ms", "2000",
              "--tpot-ms", "50"],
    "deepseek": ["deepseek-v3", "--layers", "4", *CM, "--devices", "32", "--prompt-len", "2048", "--gen-len", "512",
                 "--ttft-ms", "1500", "--tpot-ms", "40", "--dtype", "int8"],
}
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
TOP = ("requests_per_s", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device", "ttft_ms", "tpot_ms",
       "output_tokens_per_s_per_device", "input_tokens_per_s_per_device")


def cli(*args: str):
    return runner.invoke(app, list(args), terminal_width=200)


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict:
    """name -> (what `plan --json` printed, the declaration it wrote)."""
    folder = tmp_path_factory.mktemp("serving")
    out = {}
    for name, args in PLANS.items():
        path = folder / f"{name}.yaml"
        r = cli("plan", *args, "--json", "-o", str(path))
        assert r.exit_code == 0, r.output
        out[name] = (json.loads(r.output), path)
    return out


def _edited(planned, name: str, tmp_path, edit) -> str:
    doc = read_document(str(planned[name][1]))
    edit(doc)
    path = tmp_path / f"{name}_edited.yaml"
    write_document(doc, str(path))
    return str(path)


# -- the declaration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PLANS))
def test_validate_rescores_to_the_numbers_plan_printed(planned, name):
    printed, path = planned[name]
    r = cli("validate", str(path), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["ok"] and [c["name"] for c in rep["checks"]] == [
        "strategy", "cluster", "model", "pipeline", "layouts", "kv_cache", "memory", "estimate"]
    est = rep["estimate"]
    for phase in ("prefill", "decode"):
        assert est[phase] == printed[phase]  # every figure of the phase, bit for bit
    assert {k: est[k] for k in TOP} == {k: printed[k] for k in TOP}
    assert est["serving"] == printed["serving"] and est["kv_cache"] == printed["kv_cache"]


def test_the_declaration_says_how_far_off_its_estimate_may_be(planned):
    printed, path = planned["mixtral"]
    assert read_document(str(path))["accuracy"] == printed["accuracy"]
    assert printed["accuracy"]["category"] == "serving" and "cloudmatrix384" in printed["accuracy"]["sentence"]


def test_disaggregated_phases_are_programs_on_their_own_ranks_and_meshes(planned):
    printed, path = planned["mixtral"]
    doc = read_document(str(path))
    assert printed["serving"] == doc["serving"]["mode"] == "disaggregated"
    assert doc["workload"] == {"mode": "infer", "prompt_len": 4096, "gen_len": 1024, "batch": None, "ttft_ms": 2000.0,
                               "tpot_ms": 50.0, "dtype": "bf16", "kv_dtype": "bf16"}
    pre, dec = doc["programs"]
    k = printed["prefill"]["devices"]
    assert (pre["phase"], pre["ranks"], dec["phase"], dec["ranks"]) == (
        "prefill", {"first": 0, "count": k}, "decode", {"first": k, "count": 96 - k})
    for prog, mesh in zip(doc["programs"], doc["meshes"]):
        s = printed[prog["phase"]]["strategy"]
        sizes = {a["name"]: a["size"] for a in mesh["axes"]}
        assert prog["mesh"] == mesh["name"] == prog["phase"]
        assert sizes == {"tp": s["tp"], "dp": s["dp"], "pp": s["pp"]} and s["tp"] * s["dp"] * s["pp"] == mesh["devices"]
        assert mesh["aliases"] == [dict(mesh["aliases"][0], name="ep", size=s["ep"], within=["tp", "dp"])]
        assert s["ep"] == s["tp"] * s["dp"] and 8 % s["ep"] == 0  # the planner splits experts evenly
        assert prog["batch_per_replica"] == printed[prog["phase"]]["batch_per_replica"]
        assert prog["layouts"]["params"]["model.layers.*.mlp.experts.gate_up_proj"]["dims"] == ["ep", None, None]
        assert prog["experts"]["count"] == 8 and prog["experts"]["top_k"] == 2
        assert prog["estimate"] == printed[prog["phase"]]
    # prefill's pipeline: 32 layers in even stages, each on its slice of the ranks, embedding first, head last
    pp = printed["prefill"]["strategy"]["pp"]
    assert pp == len(pre["stages"]) > 1
    per = printed["prefill"]["strategy"]["dp"]
    assert [st["ranks"] for st in pre["stages"]] == [{"first": i * per, "count": per} for i in range(pp)]
    assert [len(st["layers"]) for st in pre["stages"]] == [32 // pp] * pp
    assert [n for st in pre["stages"] for n in st["layers"]] == [f"model.layers.{i}" for i in range(32)]
    assert "model.embed_tokens" in pre["stages"][0]["blocks"] and "lm_head" in pre["stages"][-1]["blocks"]
    assert dec["kv_cache"]["offload"]["fraction"] == printed["decode"]["kv_offload"]["fraction"]


def test_tensor_parallel_layouts_and_kv_heads_follow_the_decode_mesh(planned):
    printed, path = planned["llama"]
    dec = read_document(str(path))["programs"][1]
    assert printed["decode"]["strategy"]["tp"] == 4
    p = dec["layouts"]["params"]
    assert p["model.layers.*.self_attn.q_proj.weight"]["dims"] == ["tp", None]  # column-parallel
    assert p["model.layers.*.self_attn.o_proj.weight"] == {"dims": [None, "tp"], "op": "linear",
                                                            "output_partial": ["tp"]}  # row-parallel
    assert p["lm_head.weight"]["model_output"] and p["model.embed_tokens.weight"]["dims"] == ["tp", None]
    kv = dec["kv_cache"]
    assert (kv["heads_axis"], kv["head_ways"], kv["latent"]) == ("tp", 4, False)  # 8 KV heads over tp 4
    assert kv["bytes_per_token_per_device"] * 4 == pytest.approx(kv["bytes_per_token"])
    assert "experts" not in dec and "aliases" not in read_document(str(path))["meshes"][1]


def test_co_located_phases_share_every_rank_and_one_mesh(planned):
    printed, path = planned["deepseek"]
    doc = read_document(str(path))
    assert printed["serving"] == doc["serving"]["mode"] == "co-located"
    assert [m["name"] for m in doc["meshes"]] == ["serving"]
    assert [(p["mesh"], p["ranks"]) for p in doc["programs"]] == [("serving", {"first": 0, "count": 32})] * 2
    kv = doc["programs"][1]["kv_cache"]
    assert kv["latent"] and kv["head_ways"] == 1 and kv["heads_axis"] is None  # MLA's latent is read whole
    assert doc["programs"][1]["estimate"]["decode_share"] == printed["decode"]["decode_share"]


def test_same_inputs_same_bytes(planned, tmp_path):
    _, path = planned["mixtral"]
    again = tmp_path / "again.yaml"
    assert cli("plan", *PLANS["mixtral"], "-o", str(again)).exit_code == 0
    assert again.read_bytes() == path.read_bytes()
    as_json = tmp_path / "again.json"  # the same document in JSON, which validates to the same figures
    write_document(read_document(str(again)), str(as_json))
    assert json.loads(as_json.read_text()) == yaml.safe_load(path.read_text())
    assert validate_document(read_document(str(as_json))).ok


def test_training_declarations_keep_their_schema():
    doc = declare("llama3-8b", cluster="dgx-a100", devices=2, global_batch=4, seq_len=16, overrides=TINY, tp=2)
    check_schema(doc, "train.yaml")
    assert "serving" not in doc and doc["workload"]["mode"] == "train"
    with pytest.raises(InvalidInput, match="field 'serving' is not part of a training declaration"):
        check_schema(dict(doc, serving={"mode": "co-located"}), "train.yaml")


# -- hand edits ---------------------------------------------------------------------------------------------------
def test_a_hand_edited_decode_batch_is_scored_as_written(planned, tmp_path):
    from cost_models import load_cluster
    from planner.inference.phase_cost import Layout
    from planner.inference.rescore import PhaseChoice, score_phase
    from planner.inference.serve import load_profile, serving_options

    printed, _ = planned["llama"]
    batch = printed["decode"]["batch_per_replica"] // 2
    path = _edited(planned, "llama", tmp_path, lambda d: d["programs"][1].update(batch_per_replica=batch))
    rep = validate_document(read_document(path))
    failed = [c for c in rep.checks if not c.ok]
    assert [c.name for c in failed] == ["estimate"]
    assert "programs[1].estimate.batch_per_replica is" in failed[0].detail and "scores it as it is" in failed[0].detail
    dec = rep.estimate["decode"]
    assert dec["batch_per_replica"] == batch and dec["tpot_ms"] < printed["decode"]["tpot_ms"]
    assert dec["tokens_per_s_per_device"] < printed["decode"]["tokens_per_s_per_device"]
    assert rep.estimate["prefill"] == printed["prefill"]
    # the same figure, costed directly on the decode group as the declaration lays it out, at that batch
    mesh = next(m for m in read_document(str(planned["llama"][1]))["meshes"] if m["name"] == "decode")
    size = {a["name"]: a["size"] for a in mesh["axes"]}
    serving = serving_options(prompt_len=4096, gen_len=1024, batch=None, ttft_ms=2000, tpot_ms=50, dtype="bf16",
                              kv_dtype="bf16", offload=True)
    direct = score_phase(load_profile("llama3-70b"), load_cluster("cloudmatrix384", devices=64), serving, "decode",
                         PhaseChoice(layout=Layout(tp=size["tp"], dp=size["dp"], pp=size["pp"]), batch=batch))
    assert dec["tokens_per_s_per_device"] == direct.tokens_per_s_per_device
    r = cli("estimate", "llama3-70b", "--plan", path, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["decode"] == dec


def test_a_hand_edited_tp_and_kv_offload_are_scored_as_written(planned, tmp_path):
    printed, _ = planned["deepseek"]

    def edit(doc):
        axes = doc["meshes"][0]["axes"]
        axes[0]["size"], axes[1]["size"], axes[1]["stride"], axes[2]["stride"] = 2, 16, 2, 32
        doc["programs"][1]["kv_cache"]["offload"]["fraction"] = 0.5

    rep = validate_document(read_document(_edited(planned, "deepseek", tmp_path, edit)))
    assert [c.name for c in rep.checks if not c.ok] == ["estimate"]
    assert "prefill tp2 dp16 ep32" in rep.checks[0].detail and "50% of the KV cache offloaded" in rep.checks[0].detail
    dec = rep.estimate["decode"]
    assert dec["strategy"]["summary"] == "tp2 dp16 ep32" and dec["breakdown_ms"]["tp_comm"] > 0
    assert printed["decode"]["breakdown_ms"]["tp_comm"] == 0
    assert dec["kv_offload"]["fraction"] == 0.5 and dec["memory_gib"]["offloaded_kv"] > 0
    assert any("differ from the derived ones" in w for w in rep.warnings)  # tp 2 splits nothing as declared


# -- bad files ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, words", [
    (lambda d: d["programs"][1].update(batch_per_replica="many"),
     "field 'programs[1].batch_per_replica' must be integer"),
    (lambda d: d["programs"].pop(), "field 'programs' must have at least 2 items"),
    (lambda d: d.update(zero={"stage": 1}), "field 'zero' is not part of a serving"),
    (lambda d: d["programs"][1]["kv_cache"]["offload"].update(fraction=1.0), "offload.fraction' must be"),
    (lambda d: d["programs"][1].update(phase="prefill"), "both run prefill"),
])
def test_a_malformed_serving_file_is_one_sentence(planned, tmp_path, edit, words):
    r = cli("validate", _edited(planned, "mixtral", tmp_path, edit))
    assert r.exit_code == 2 and words in r.output, r.output
    assert "Traceback" not in r.output and [ln.startswith(("FAIL", "error:")) for ln in r.output.splitlines()].count(
        True) == 1


@pytest.mark.parametrize("name, edit, words", [
    ("mixtral", lambda d: d["meshes"][1]["axes"][1].update(size=7), "= 56 devices, but programs[1].ranks.count is 64"),
    ("deepseek", lambda d: d["programs"][1].update(ranks={"first": 0, "count": 16}), "co-located decode runs on ranks"),
    ("mixtral", lambda d: d["programs"][0]["stages"][0].update(layers=["model.layers.0"]), "prefill stage 0 layers"),
    ("llama", lambda d: d["programs"][1]["kv_cache"].update(head_ways=8), "kv_cache.head_ways is 8 as declared, 4"),
    ("llama", lambda d: d["programs"][1]["layouts"]["params"]["model.layers.*.self_attn.q_proj.weight"].update(
        dims=["ep", None]), "names mesh axis 'ep'"),
])
def test_an_inconsistent_serving_file_fails_its_check_in_one_sentence(planned, tmp_path, name, edit, words):
    r = cli("validate", _edited(planned, name, tmp_path, edit))
    assert r.exit_code == 2 and words in r.output, r.output
    assert "not valid" in r.output and "Traceback" not in r.output


def test_bad_yaml_is_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hypershard: 1\nworkload: {mode: infer\n")
    r = cli("validate", str(bad))
    assert r.exit_code == 2 and "bad.yaml: not valid YAML at line" in r.output and r.output.count("error:") == 1


# -- exports ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("backend", ["torch", "jax", "hyper-parallel", "mindspore"])
def test_every_python_export_compiles(planned, name, backend):
    doc = read_document(str(planned[name][1]))
    source = export(doc, backend)
    compile(source, f"{name}_{backend}.py", "exec")
    assert source.startswith('"""') and "PROGRAMS = [" in source and "def use_program(" in source
    assert f"serving {doc['model']['name']}" in source
