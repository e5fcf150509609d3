"""HyperMPMD in MoE layers: attention and routed experts as programs on their own device groups."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cost_models import load_cluster
from planner.api import load_graph, plan_model
from planner.graph.blocks import discover_blocks
from planner.costing.graph_facts import GraphFacts
from planner.search.moe_programs import MoeSplitSearch, cycle_s, plan_moe_programs
from planner.search.moe_split import expert_flops, expert_group, split_moe
from planner.strategy import Workload

SEQ = 512
SMALL_DSV3 = dict(layers=3, dense_layers=1)  # deepseek-v3's own widths: 256 experts, top-8, hidden 7168


@pytest.fixture(scope="module")
def dsv3():
    g = load_graph("deepseek-v3", batch=1, seq_len=SEQ, overrides=SMALL_DSV3)
    st = discover_blocks(g)
    facts = GraphFacts(g, st)
    return g, st, facts, split_moe(g, st, facts)


def test_the_experts_of_each_moe_layer_are_cut_out_with_their_activation(dsv3):
    g, st, _, split = dsv3
    assert sorted(split.regions) == ["model.layers.1", "model.layers.2"]  # layer 0 is dense
    assert split.experts == 256
    for region in split.regions.values():
        ops = [g.nodes[i].op_type for i in region]
        assert ops.count("MatMul") == 2  # the fused gate-up and down projections
        assert "Sigmoid" in ops  # SiLU between them goes with the experts, not back to attention
    inside = {i for r in split.regions.values() for i in r}
    assert len(split.attention.graph.nodes) + len(inside) == len(g.nodes)
    assert not any(".experts." in p for p in split.attention.graph.params)
    assert split.expert_params == sum(g.tensors[p].numel for p in g.params if ".experts." in p)


def test_experts_are_cut_out_whatever_their_weights_are_named(tmp_path):
    """The split finds a layer's routed experts from its router (`graph.moe`), not from `.experts.` in weight
    names: with the experts' weights renamed (as other model families and optimised exports name them), a MoE
    model had been taken for a dense one and got no attention | experts plan."""
    import onnx

    source = Path(__file__).parent / "fixtures" / "mixtral_moe.onnx"
    model = onnx.load(str(source), load_external_data=False)
    renamed = {t.name: t.name.replace(".experts.", ".ffn_bank.") for t in model.graph.initializer}
    for t in model.graph.initializer:
        t.name = renamed[t.name]
    for n in model.graph.node:
        n.input[:] = [renamed.get(x, x) for x in n.input]
    for prop in model.graph.metadata_props:  # the exporter's signature names them too
        prop.value = prop.value.replace(".experts.", ".ffn_bank.")
    onnx.save(model, str(tmp_path / "bank.onnx"))
    splits = []
    for path in (source, tmp_path / "bank.onnx"):
        g = load_graph(str(path), batch=1, seq_len=64)
        st = discover_blocks(g)
        facts = GraphFacts(g, st)
        splits.append(split_moe(g, st, facts))
    named, bank = splits
    assert bank is not None and named is not None
    assert (bank.experts, bank.expert_params, len(bank.regions)) == (named.experts, named.expert_params, 2)
    assert bank.regions == named.regions and bank.dispatch_bytes == named.dispatch_bytes
    # each region holds its layer's two expert contractions, reached through the export's Transpose and per-token
    # GatherND of the stacked weights (review of 2026-12-08: the regions had been two Transposes, 0 FLOPs)
    for name, region in bank.regions.items():
        assert facts.moe[name].expert_nodes <= set(region)
        assert [g.nodes[i].op_type for i in region].count("MatMul") == 2
    assert expert_flops(bank, facts) > 0


def test_tokens_cross_as_tokens_x_top_k_x_hidden_each_way(dsv3):
    *_, split = dsv3
    per_layer = SEQ * 8 * 7168 * 2  # tokens x top_k x hidden x bf16 bytes, per sample
    for name in split.regions:
        assert split.dispatch_bytes[name] == per_layer
        assert split.combine_bytes[name] == per_layer


def test_one_micro_batch_in_flight_takes_turns_and_more_overlap():
    a, e, c = 1.0, 0.8, 0.05
    assert cycle_s(a, e, c, c, 1) == pytest.approx(a + e + 2 * c)  # no ping-pong: the groups wait on each other
    assert cycle_s(a, e, c, c, 4) == pytest.approx(4 * a)  # attention busy all the time, the rest hidden
    assert cycle_s(a, e, 3.0, 3.0, 4) == pytest.approx(12.0)  # a slow link sets the pace
    assert cycle_s(a, a, c, c, 2) > 2 * a  # balanced groups: two in flight cannot hide the round trip


def test_expert_time_falls_and_memory_rises_as_the_expert_group_shrinks(dsv3):
    _, _, facts, split = dsv3
    cm = load_cluster("cloudmatrix384", devices=64)
    wl = Workload(global_batch=64, seq_len=SEQ)
    groups = {c: expert_group(split, facts, cm.scaled(c), wl, c, 32.0, 2) for c in (8, 16, 32)}
    busy = [groups[c].busy_s(2) for c in (8, 16, 32)]
    assert busy[0] > busy[1] > busy[2]
    assert groups[8].memory_bytes["params"] == pytest.approx(4 * groups[32].memory_bytes["params"])


@pytest.fixture(scope="module")
def split_search(dsv3):
    g, st, facts, split = dsv3
    cm = load_cluster("cloudmatrix384", devices=16)
    wl = Workload(global_batch=64, seq_len=SEQ)
    return MoeSplitSearch(g, st, cm, wl, split, facts), cm, wl


def test_traffic_per_step_is_every_token_to_its_experts_and_back_forward_and_backward(split_search, dsv3):
    search, cm, wl = split_search
    *_, split = dsv3
    sc = search.score(8)
    layers = len(split.regions)
    expected = wl.global_batch * SEQ * 8 * 7168 * 2 * 2 * 2 * layers  # dispatch + combine, forward + backward
    assert sc.traffic_bytes == pytest.approx(expected)


@pytest.mark.slow
def test_the_chosen_split_is_the_fastest_and_most_balanced_of_all(split_search):
    """The guided search (FLOPs balance, then proportional prediction) finds the split an exhaustive
    scoring of every expert-group size finds, and that split is near where the two groups' times meet (not
    always the most balanced: the attention group's own best micro-batch changes with its size)."""
    search, cm, wl = split_search
    best = search.best()
    every = {c: search.score(c) for c in search.sizes}
    fitting = {c: sc for c, sc in every.items() if sc is not None}
    assert search.sizes == [c for c in search.sizes if 256 % c == 0]  # groups split the 256 experts evenly
    assert best is not None and len(fitting) >= 2
    assert best.step_s == pytest.approx(min(sc.step_s for sc in fitting.values()))
    # the groups' times meet within the step of the sizes: an expert group doubles or halves (it splits the 256
    # experts evenly), which moves its time by up to 2x, so the best split leaves one group at most twice the other
    assert math.isfinite(best.imbalance) and best.imbalance < 2.0


def test_a_dense_model_has_no_expert_programs():
    g = load_graph("llama3-8b", batch=1, seq_len=256, overrides=dict(layers=2))
    st = discover_blocks(g)
    cm = load_cluster("cloudmatrix384", devices=16)
    assert plan_moe_programs(g, st, cm, Workload(global_batch=16, seq_len=256)) is None


@pytest.mark.slow
def test_attention_beside_experts_is_never_slower_than_the_plain_plan():
    out = plan_model("deepseek-v3", cluster="cloudmatrix384", devices=16, global_batch=64, seq_len=SEQ,
                     overrides=SMALL_DSV3, time_limit_s=None)  # the work budget only: the same plan under load
    mp = out["mpmd"]
    plain = mp["spmd_step_time_s"]
    assert out["estimate"]["step_time_s"] == pytest.approx(min(plain, mp["step_time_s"]))
    assert mp["used"] == (mp["step_time_s"] < plain)
    assert mp["kind"] == "experts" and [p["name"] for p in mp["programs"]] == ["attention", "experts"]
    assert sum(p["devices"] for p in mp["programs"]) == 16
    assert mp["imbalance"] >= 1.0 and mp["detail"]["traffic_bytes_per_step"] > 0
    print(f"\nattention | experts: {mp['step_time_s']:.3f} s/step against {plain:.3f} s plain "
          f"({mp['step_time_s'] / plain - 1:+.1%}), used: {mp['used']}")


def test_splits_predicted_well_behind_the_single_program_plan_go_unsearched(dsv3):
    g, st, facts, split = dsv3
    cm = load_cluster("cloudmatrix384", devices=16)
    wl = Workload(global_batch=64, seq_len=SEQ)
    hopeless = MoeSplitSearch(g, st, cm, wl, split, facts)
    assert hopeless.best(incumbent_s=1e-9) is not None and len(hopeless.scored) == 1
    # without an incumbent the same search goes on to the predicted splits (test_the_chosen_split_... scores them)


def test_an_attention_experts_plan_prints_and_one_to_write_is_one_a_declaration_holds(tmp_path):
    """`plan` of a MoE model whose best plan runs attention and experts as two programs prints it (with what the
    launch backends say of it) instead of failing on the declaration it did not ask for; with -o, where a
    declaration holds only the encoders | backbone split, the search leaves that split out and writes the best
    one-program plan (a torchscript export of a small DeepSeek-V3, 64 sequences of 64 tokens on 8 H100s)."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from cli.app import app
    from planner.hypershard import read_document
    from planner.hypershard.validate import validate_document

    model = str(Path(__file__).parent / "fixtures" / "hf" / "deepseek_v3_ts18_inline_axes.onnx")
    args = ["plan", model, "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "64", "--seq-len", "64"]
    run = CliRunner().invoke(app, [*args, "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.output)
    assert out["mpmd"]["used"] and out["mpmd"]["kind"] == "experts"
    assert [p["name"] for p in out["programs"]] == ["attention", "experts"]
    assert set(out["launch_configs"].values()) == {"2 programs on their own device groups (HyperMPMD: attention, "
                                                   "experts)"}
    written = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "plan.yaml")])
    assert written.exit_code == 0, written.output
    doc = read_document(str(tmp_path / "plan.yaml"))
    assert len(doc["programs"]) == 1 and validate_document(doc).ok
