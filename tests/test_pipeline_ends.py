"""Pipeline chunks holding only the embedding or only the loss, as Megatron-Core splits a pipeline when it counts them
as a layer each (Megatron-Bridge's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split).

Llama 3.1 405B has 126 decoder layers; Megatron-Bridge's MXFP8 recipe on 256 GB200s runs TP4 x PP16 x VPP8 =
128 chunks (26.02-26.06 tables), so the first chunk holds the embedding alone and the last the loss alone. An
even split cannot say that layout (126 layers for 128 chunks); `stage_layers` with a 0 at either end does.
"""

from __future__ import annotations

import dataclasses

import pytest

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
def test_megatron_bridges_405b_layout_with_the_ends_alone_is_estimated_near_its_measured_step():
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
    predictor = Predictor()
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
    for given, says in (("0,2,2", "(3 chunks) must give pp x vpp = 4 layer counts"),
                        ("1,0,3,0", "positive but for the first and the last chunk"),
                        ("0,3*2,0", "the 4 pipeline chunks' layer counts add up to 6, but the model has 4 layers"),
                        ("0,2*x,0", "N*K for K chunks of N, like --stage-layers 0,1*126,0")):
        bad = runner.invoke(app, [*base, "--stage-layers", given], terminal_width=300)
        assert bad.exit_code == 2 and says in bad.output and "Traceback" not in bad.output, bad.output
