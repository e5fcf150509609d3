"""Hand-edited parameter layouts are scored: the estimate pins the declared layouts in the intra-op problem and
solves the rest; an unedited file scores to the planned numbers; layouts that cannot be scored fail in one
sentence."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from planner.errors import InvalidInput
from planner.costing.estimate import estimate
from planner.hypershard import declare, strategy_of, write_document
from planner.hypershard.declared import estimate_declared, score_document, workload_of
from planner.hypershard.pins import declared_pins
from planner.hypershard.validate import validate_document
from planner.search.space import REPLICATED

runner = CliRunner()
#: Big enough that the estimator splits the MLP over 4 tensor ranks (Megatron's column/row pair).
MODEL = dict(layers=2, hidden=1024, heads=8, kv_heads=8, vocab=2048, ffn=4096)
MLP = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def doc():
    return declare("llama3-8b", cluster="dgx-a100", devices=4, global_batch=8, seq_len=512, overrides=MODEL, tp=4,
                   recompute="selective", zero=1)


def _params(d: dict) -> dict:
    return d["layouts"]["params"]


def _replicated_mlp(d: dict) -> dict:
    d = copy.deepcopy(d)
    for name, entry in _params(d).items():
        if name.split(".")[-2] in MLP:
            entry["dims"] = [None] * len(entry["dims"])
            entry.pop("output_partial", None)
    return d


def test_the_estimator_splits_the_mlp_and_an_unedited_file_pins_nothing_new(doc):
    mlp = {k: e["dims"] for k, e in _params(doc).items() if k.split(".")[-2] in MLP}
    assert mlp == {"model.layers.*.mlp.gate_proj.weight": ["tp", None], "model.layers.*.mlp.up_proj.weight": ["tp", None],
                   "model.layers.*.mlp.down_proj.weight": [None, "tp"]}
    scored = score_document(doc)
    assert not scored.edited and scored.plan["estimate"]["step_time_s"] == doc["estimate"]["step_time_s"]


def test_replicating_the_mlp_weights_costs_memory_and_tensor_traffic(doc, tmp_path):
    path = tmp_path / "replicated.yaml"
    write_document(_replicated_mlp(doc), str(path))
    r = runner.invoke(app, ["estimate", "llama3-8b", "--plan", str(path), "--json"])
    assert r.exit_code == 0, r.output
    got, before = json.loads(r.output), doc["estimate"]
    assert got["step_time_s"] > before["step_time_s"]
    for kind in ("params", "grads", "optimizer", "peak"):
        assert got["memory_gib"][kind] > before["memory_gib"][kind]
    assert got["breakdown_s"]["tp_comm"] > before["breakdown_s"]["tp_comm"]
    layer = next(rows for rows in got["layouts"].values() if "mlp.up_proj.weight" in rows)
    assert layer["mlp.up_proj.weight"] == "R" and layer["self_attn.q_proj.weight"] == "S0"  # what it scored
    # MLP weights are 3 x 1024 x 4096 per layer, 2 layers: replicated instead of split over 4, they hold 3/4 of
    # that more per device, in bf16 weights + bf16 grads (today's Megatron-Core recipes; ZeRO-1 shards nothing
    # over dp 1)
    mlp = 2 * 3 * 1024 * 4096 * 3 / 4
    assert (got["memory_gib"]["params"] - before["memory_gib"]["params"]) * 2**30 == pytest.approx(2 * mlp)
    assert (got["memory_gib"]["grads"] - before["memory_gib"]["grads"]) * 2**30 == pytest.approx(2 * mlp)
    v = runner.invoke(app, ["validate", str(path), "--json"])
    report = json.loads(v.output)
    assert v.exit_code == 2 and report["estimate"]["step_time_s"] == got["step_time_s"]
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["estimate"]
    assert any("6 parameter(s) are declared with other tensor-axis layouts" in w and "the estimate scores the "
               "declared ones" in w for w in report["warnings"])


def test_the_pins_are_the_declared_layouts(doc):
    """The file's score is the estimate with its layouts pinned, and only where they differ from the estimator's."""
    edited = _replicated_mlp(doc)
    sc = score_document(edited)
    pins = declared_pins(edited, sc.graph, sc.structure, strategy_of(edited))
    assert pins["model.layers.1.mlp.up_proj.weight"] == REPLICATED
    assert pins["model.layers.0.self_attn.q_proj.weight"] == 0
    assert sc.edited["model.layers.0.mlp.down_proj.weight"] == (REPLICATED, 1) and len(sc.edited) == 6
    direct = estimate(sc.graph, sc.structure, load_cluster("dgx-a100", devices=4), workload_of(edited),
                      strategy_of(edited), param_pins=pins)
    assert direct.step_time_s == sc.plan["estimate"]["step_time_s"]


def test_a_row_parallel_up_projection_needs_the_searched_layout_space(doc):
    edited = copy.deepcopy(doc)
    _params(edited)["model.layers.*.mlp.up_proj.weight"].update(dims=[None, "tp"], output_partial=["tp"])
    with pytest.raises(InvalidInput, match=r"cannot read the declared layout of .* in the 'megatron' tensor-axis "
                                           r"layout space .* or set layouts.space to searched"):
        score_document(edited)
    report = validate_document(edited)
    assert [c.name for c in report.checks if not c.ok] == ["estimate"] and report.estimate is None
    edited["layouts"]["space"] = "searched"
    searched = copy.deepcopy(doc)
    searched["layouts"]["space"] = "searched"
    row, free = score_document(edited).plan["estimate"], score_document(searched).plan["estimate"]
    assert row["step_time_s"] != free["step_time_s"] and row["step_time_s"] < 1.0  # scored, not a 1000 s penalty


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update({"model.layers.*.mlp.up_proj.weight": {"dims": ["tp", None]},
                         "model.layers.*.mlp.nope.weight": {"dims": [None]}}),
     "layout entry 'model.layers.*.mlp.nope.weight' matches no parameter of the model"),
    (lambda p: p.update({"model.embed_tokens.weigth": {"dims": [None, None]}}),
     "layout entry 'model.embed_tokens.weigth' matches no parameter"),
    (lambda p: p["model.norm.weight"].update(dims=["tp", None]), "model.norm.weight has 1 dims [1024] and its layout "
                                                                "gives 2"),
    (lambda p: p["model.norm.weight"].update(dims=["xp"]), "model.norm.weight dim 0 names mesh axis 'xp'"),
    (lambda p: p["lm_head.weight"].update(dims=["tp", "tp"]), "lm_head.weight is split over tp on dims [0, 1]"),
    (lambda p: p.update({"model.layers.1.mlp.up_proj.weight": {"dims": [None, None]}}),
     "model.layers.1.mlp.up_proj.weight is declared replicated over tp and model.layers.0.mlp.up_proj.weight split "
     "on dim 0, but layers of one block type share their layouts"),
])
def test_layouts_that_cannot_be_scored_are_one_sentence(doc, tmp_path, edit, message):
    edited = copy.deepcopy(doc)
    edit(_params(edited))
    path = tmp_path / "bad.yaml"
    write_document(edited, str(path))
    with pytest.raises(InvalidInput) as err:
        estimate_declared(str(path), "llama3-8b")
    assert message in str(err.value) and "\n" not in str(err.value)
    r = runner.invoke(app, ["estimate", "llama3-8b", "--plan", str(path)], terminal_width=400)
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1
    report = validate_document(edited)
    failed = [c for c in report.checks if not c.ok]
    assert failed[0].name == "layouts" and report.estimate is None


def test_a_dim_tp_does_not_divide_is_refused():
    small = declare("llama3-8b", cluster="dgx-a100", devices=4, global_batch=8, seq_len=64, tp=4,
                    overrides=dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=130, ffn=128))
    _params(small)["model.embed_tokens.weight"]["dims"] = ["tp", None]
    with pytest.raises(InvalidInput, match=r"model.embed_tokens.weight dim 0 \(130\) does not split evenly over "
                                           r"tp = 4; declare another dim or null"):
        score_document(small)


def test_a_layer_boundary_must_agree_with_sequence_parallelism(doc):
    edited = copy.deepcopy(doc)
    edited["layouts"]["activations"]["model.layers.*"]["dims"] = [None, "tp", None]
    with pytest.raises(InvalidInput, match=r"layouts.activations\['model.layers.\*'\] is \[None, 'tp', None\], but "
                                           r"this strategy places it \[None, None, None\]"):
        score_document(edited)
    edited["layouts"]["sequence_parallel"] = True  # now they agree: sequence parallelism, scored as such
    sp = score_document(edited).plan
    assert sp["strategy"]["sp"] and sp["estimate"]["step_time_s"] != doc["estimate"]["step_time_s"]


def test_a_moe_router_stays_whole_on_every_tensor_rank():
    """Megatron-Core's TopKRouter is not split over the tensor axis (nor HF's router module, which is no nn.Linear):
    in the megatron layout space the router's weight is whole on every tensor rank, whatever the program would
    gain by splitting it; the searched space may split it."""
    kw = dict(cluster="dgx-a100", devices=4, global_batch=8, seq_len=64, tp=2, dp=2, sp=True,
              overrides=dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, ffn=128, experts=4))
    router = "model.layers.*.mlp.gate.weight"
    doc = declare("mixtral-8x7b", **kw)
    assert doc["layouts"]["params"][router]["dims"] == [None, None]
    assert doc["layouts"]["params"]["model.layers.*.self_attn.q_proj.weight"]["dims"] == ["tp", None]
    assert validate_document(doc).ok


def test_routed_experts_are_found_from_the_router_not_from_names():
    """The weights a router's top-k feeds are the experts (Mixtral's stacked gate_up/down), a dense model has none."""
    from planner.api import load_graph
    from planner.graph.blocks import discover_blocks
    from planner.graph.moe import expert_params

    tiny = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, ffn=128, experts=4)
    g = load_graph("mixtral-8x7b", batch=1, seq_len=64, overrides=tiny)
    found = expert_params(g, discover_blocks(g))
    assert found and found == {p for p in g.params if ".experts." in p}
    assert all(g.tensors[p].shape[0] == 4 for p in found)
    dense = load_graph("llama3-8b", batch=1, seq_len=64, overrides=dict(layers=2, hidden=64, heads=4, kv_heads=4,
                                                                        vocab=128))
    assert expert_params(dense, discover_blocks(dense)) == frozenset()
