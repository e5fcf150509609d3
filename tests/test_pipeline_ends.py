"""Pipeline chunks holding only the embedding or only the loss, as Megatron-Core splits a pipeline when it counts them
as a layer each (Megatron-Bridge's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split).

Llama 3.1 405B has 126 decoder layers; Megatron-Bridge's MXFP8 recipe on 256 GB200s runs TP4 x PP16 x VPP8 =
128 chunks (26.02-26.06 tables), so the first chunk holds the embedding alone and the last the loss alone. An
even split cannot say that layout (126 layers for 128 chunks); `stage_layers` with a 0 at either end does.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.costing.pipeline_cut import assign_chunks
from planner.errors import InvalidInput
from planner.strategy import Strategy


def test_only_the_first_and_last_chunk_may_hold_no_layer():
    assert Strategy(pp=2, vpp=2, dp=1, stage_layers=(0, 4, 4, 0)).stage_layers == (0, 4, 4, 0)
    assert Strategy(pp=2, dp=1, stage_layers=(0, 8)).stage_layers == (0, 8)
    for bad in ((2, 0, 4, 2), (0, 0, 0, 0), (1, -1, 4, 4)):
        with pytest.raises(InvalidInput, match="positive but for the first and the last chunk, which may hold only "
                                               "the embedding or the loss"):
            Strategy(pp=2, vpp=2, dp=1, stage_layers=bad)


def test_the_embedding_goes_to_the_first_chunk_and_the_head_to_the_last_even_without_layers():
    from planner.api import load_graph
    from planner.graph.blocks import discover_blocks

    structure = discover_blocks(load_graph("llama3-8b", batch=1, seq_len=32, overrides={"layers": 4}))
    chunk = assign_chunks(structure, 4, (0, 2, 2, 0))
    layers = [b.name for b in structure.blocks if b.is_layer]
    others = [b.name for b in structure.blocks if not b.is_layer]
    assert [chunk[name] for name in layers] == [1, 1, 2, 2]
    assert {chunk[name] for name in others} == {0, 3}  # the embedding first, the final norm and head last
    assert chunk[others[0]] == 0 and chunk[others[-1]] == 3
    with pytest.raises(InvalidInput, match="too few for 6 pipeline chunks"):  # an even split still needs a layer each
        assign_chunks(structure, 6)


@pytest.mark.calibration
def test_megatron_bridges_405b_layout_with_the_ends_alone_is_estimated_near_its_measured_step(shared_graphs):
    """26.06 (Megatron-Bridge v0.5.0 docs/performance-summary.md): Llama 3.1 405B, 256 GB200s, MXFP8, batch 1,536 x
    8,192, TP4 PP16 VP8: 783 tokens/s per GPU, a 62.77 s step. Estimated with the recipe's split and the shipped
    MXFP8 run's stack: within 15 % (the model costs MXFP8 GEMMs at the FP8 rate, and the same table puts the
    405B's MXFP8 runs about 7 % below its FP8 ones); and the interleaving's bubble halves against VPP4's."""
    from planner.calibration import read_runs
    from planner.calibration.predict import Predictor

    runs = {r.id: r for r in read_runs()}
    base, mx = runs["mb2606-llama31-405b-256xgb200-fp8"], runs["mb2604-llama3-70b-64xgb200-mxfp8"].execution
    assert base.strategy["tp"] == 4 and base.strategy["pp"] == 16 and mx.fp8_recipe == "mxfp8"
    measured = 1536 * 8192 / (783 * 256)
    predictor = Predictor(graphs=shared_graphs)
    out = {}
    for vpp, split in ((8, (0,) + (1,) * 126 + (0,)), (4, ())):
        run = dataclasses.replace(base, strategy=dict(base.strategy, vpp=vpp, stage_layers=list(split)),
                                  execution=mx, measured_step_s=measured)
        out[vpp] = predictor.predict(run, predictor.cluster(run))
    assert out[8].predicted_s == pytest.approx(measured, rel=0.15) and out[8].estimate.fits
    assert out[8].estimate.breakdown_s["pp_bubble"] == pytest.approx(out[4].estimate.breakdown_s["pp_bubble"] / 2,
                                                                      rel=0.05)


def test_estimate_takes_stage_layers_and_refuses_bad_ones_in_one_sentence():
    """`--stage-layers` on the command line, N*K for K chunks of N: the strategy's split, costed by what its stages
    hold. Llama 3 8B cut to 4 layers: its output layer (128,256 x 4,096, 525 M weights) outweighs a decoder layer
    (218 M), so the even split's last stage (a layer and the head) is the slowest, and the head alone in the last
    chunk, the embedding alone in the first, runs faster (the reason Megatron counts them as layers)."""
    import json

    from typer.testing import CliRunner

    from cli.app import app

    runner = CliRunner()
    base = ["estimate", "llama3-8b", "--layers", "4", "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "8",
            "--seq-len", "1024", "--pp", "4", "--zero", "1"]
    r = runner.invoke(app, [*base, "--stage-layers", "0,2*2,0", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["strategy"]["stage_layers"] == [0, 2, 2, 0] and "layers/stage 0+2×2+0" in out["strategy"]["summary"]
    even = json.loads(runner.invoke(app, [*base, "--json"]).output)
    assert even["strategy"]["stage_layers"] == [] and out["step_time_s"] < even["step_time_s"]
    for given, says in (("0,2,2", "gives 3 layer counts, one a pipeline chunk, but pp x vpp = 4; give --pp (and --vpp) whose "
                                  "product is 3"),
                        ("1,0,3,0", "positive but for the first and the last chunk"),
                        ("0,3*2,0", "the 4 pipeline chunks' layer counts add up to 6, but the model has 4 layers"),
                        ("0,2*x,0", "N*K for K chunks of N, like --stage-layers 0,1*126,0")):
        bad = runner.invoke(app, [*base, "--stage-layers", given], terminal_width=300)
        assert bad.exit_code == 2 and says in bad.output and "Traceback" not in bad.output, bad.output


def test_the_search_cuts_a_stage_of_the_head_alone_and_its_bound_stays_below_such_cuts():
    """A GPT of 6 layers (hidden 512) with a 400,000-word vocabulary on 4 H100s, PP4: the output layer (205 M
    weights against a layer's 3 M) takes longer than two layers (4.17 ms against 3.61 ms a micro-batch), so the
    head alone in the last stage and two layers in each other runs fastest. The branch and bound's pipeline bound
    takes the embedding and the head apart from the first and last layer: folded into them (a stage never without a
    layer) it is above that cut's step, and would prune it."""
    from dataclasses import replace

    from cost_models import load_cluster
    from planner.api import _graph_for_costing, make_workload, plan_model
    from planner.costing.estimate import estimate
    from planner.costing.graph_facts import GraphFacts
    from planner.costing.stage_costs import stage_costs
    from planner.graph.blocks import discover_blocks
    from planner.search.bounds import layer_times, least_widest_stage, pipeline_bound_s
    from planner.search.stage_widths import edge_blocks

    over = dict(layers=6, hidden=512, heads=8, vocab=400000)
    graph = _graph_for_costing("gpt", 1024, None, over)
    structure = discover_blocks(graph)
    facts = GraphFacts(graph, structure)
    hw = load_cluster("dgx-h100", devices=4)
    work = make_workload("train", 8, 1024, "bf16", None)
    one_per_stage = Strategy(pp=6, dp=1, micro_batch=1, layouts="searched")
    rep = stage_costs(graph, structure, hw, replace(work, global_batch=1), one_per_stage, facts=facts)
    times = layer_times(rep, work.execution, False, 1, True, edges=edge_blocks(structure))
    assert times.head_s > 2 * max(times.per_layer_s) and 0 < times.stem_s < times.head_s
    bound = pipeline_bound_s(times, 4, 8, 1)
    folded = 7 * least_widest_stage(times.folded(), 4) + times.total_s

    def step(cut):
        return estimate(graph, structure, hw, work, Strategy(pp=4, dp=1, micro_batch=1, layouts="searched",
                                                             stage_layers=cut), facts=facts).step_time_s

    steps = {cut: step(cut) for cut in ((), (0, 3, 3, 0), (2, 2, 2, 0), (1, 2, 3, 0))}
    assert min(steps, key=steps.get) == (2, 2, 2, 0) and steps[(2, 2, 2, 0)] < 0.7 * steps[()]
    assert bound <= min(steps.values()) < folded
    plan = plan_model("gpt", cluster="dgx-h100", devices=4, global_batch=8, seq_len=1024, overrides=over,
                      constraints={"pp": 4, "tp": 1, "micro_batch": 1, "zero": 0, "recompute": "none"},
                      offload=False, mpmd=False)
    assert tuple(plan["strategy"]["stage_layers"]) == (2, 2, 2, 0) and plan["search"]["complete"]
    assert plan["estimate"]["step_time_s"] == pytest.approx(steps[(2, 2, 2, 0)], rel=1e-9)
    # MindFormers' format gives every stage a layer: `plan --backend mindformers` keeps one in every chunk
    from planner.hypershard.backends import plan_limits

    held = plan_model("gpt", cluster="dgx-h100", devices=4, global_batch=8, seq_len=1024, overrides=over,
                      constraints={**plan["constraints"], **plan_limits("mindformers")}, mpmd=False)
    assert min(held["strategy"]["stage_layers"] or [1]) >= 1 and held["constraints"]["ends_alone"] is False
    assert held["estimate"]["step_time_s"] > plan["estimate"]["step_time_s"]


def test_a_declaration_may_leave_only_its_first_and_last_chunk_without_layers():
    """A HyperShard declaration of Llama 3 8B (4 layers) on PP2·VPP2 with the embedding alone in chunk 0 and the
    head alone in chunk 3 validates; moving chunk 1's layers into chunk 2, leaving a middle chunk empty, does not."""
    import copy

    from planner.hypershard import declare
    from planner.hypershard.validate import validate_document

    doc = declare("llama3-8b", cluster="dgx-h100", devices=2, global_batch=8, seq_len=64, overrides={"layers": 4},
                  pp=2, vpp=2, dp=1, stage_layers=(0, 2, 2, 0))
    chunks = {ch["chunk"]: ch for st in doc["programs"][0]["stages"] for ch in st["chunks"]}
    assert chunks[0]["layers"] == [] and chunks[0]["blocks"] and chunks[3]["layers"] == [] and chunks[3]["blocks"]
    assert validate_document(doc, "ends").ok
    hollow = copy.deepcopy(doc)
    chunks = {ch["chunk"]: ch for st in hollow["programs"][0]["stages"] for ch in st["chunks"]}
    chunks[2]["layers"] = chunks[1]["layers"] + chunks[2]["layers"]
    chunks[1]["layers"] = []
    report = validate_document(hollow, "hollow")
    assert not report.ok
    assert any("positive but for the first and the last chunk, which may hold only the embedding or the loss" in
               c.detail for c in report.checks if not c.ok)


def test_the_plan_around_the_405b_recipes_degrees_is_its_layout_with_the_ends_alone():
    """Megatron-Bridge's Llama 3.1 405B MXFP8 recipe on 256 GB200s fixes TP4 and PP16 and interleaves 8 chunks a
    stage, 128 chunks for 126 layers with the embedding and the loss counted as a layer each. Planned around the
    same two degrees, the search's interleaved pipelines include that accounted split (126 layers divide into no
    16 x v equal chunks, so before it only VPP1 was searched: 7+8x14+7, 57.4 s); it finds the recipe's layout, and
    its bound stays below it."""
    from planner.api import estimate_model, plan_model

    job = dict(cluster="gb200-nvl72", devices=256, global_batch=1536, seq_len=8192, dtype="fp8")
    plan = plan_model("llama3-405b", constraints={"tp": 4, "pp": 16}, offload=False, mpmd=False, **job)
    s = plan["strategy"]
    assert (s["tp"], s["pp"], s["vpp"], s["dp"]) == (4, 16, 8, 4)
    assert tuple(s["stage_layers"]) == (0,) + (1,) * 126 + (0,)
    before = estimate_model("llama3-405b", tp=4, pp=16, dp=4, sp=True, zero=1, micro_batch=1,
                            stage_layers=(7,) + (8,) * 14 + (7,), **job)
    assert plan["search"]["bound_s"] <= plan["estimate"]["step_time_s"] < 0.98 * before["step_time_s"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=8), st.integers(1, 5))
def test_the_least_widest_stage_is_the_linear_partition_bottleneck_from_below(per, pp):
    """Against every cut of the units into pp contiguous stages (empty ones allowed), counted out: the search's
    pipeline bound takes the least slowest stage, never above it and within 1e-9 of it."""
    from planner.search.bounds import least_widest_stage

    n = len(per)
    exact = min(max(sum(per[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
                for cuts in itertools.combinations_with_replacement(range(n + 1), pp - 1))
    got = least_widest_stage(per, pp)
    assert got <= exact
    assert got >= exact * (1 - 1e-8)
