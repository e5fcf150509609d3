"""The cost model against published Megatron-LM runs (issue 4, part 3), and the modelling fixes it needed.

Acceptance of the issue: on the HELD-OUT rows (never used by the fit), every
step time within 10% and the mean |error| under 5%; the Korthikanti 2022
Figure 1 memory figures within 5%. The rows and their split are
`benchmarks/calibrate.py`'s; the preset's curves are `fit_calibration.py`'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import calibrate
from benchmarks.calibrate import DEFAULT_RUNS, Predictor, load_file, memory_checks, predict_all, runs_of, split_rows
from cost_models import load_cluster
from planner.api import load_graph
from planner.graph.blocks import discover_blocks
from planner.stage_costs import stage_costs
from planner.strategy import Strategy, Workload

needs_runs = pytest.mark.skipif(not DEFAULT_RUNS.is_file(), reason=f"no calibration file at {DEFAULT_RUNS}")


@pytest.fixture(scope="module")
def data() -> dict:
    return load_file(DEFAULT_RUNS)


@pytest.fixture(scope="module")
def results(data):
    """Every run row and memory row predicted once (one graph per model shape)."""
    predictor = Predictor()
    preds, skipped = predict_all(data, predictor)
    return preds, skipped, memory_checks(data, predictor)


# -- acceptance -----------------------------------------------------------------------------------

@needs_runs
@pytest.mark.slow
def test_held_out_rows_within_10_percent_and_mean_under_5(results):
    preds, skipped, _ = results
    assert not skipped
    held = [p for p in preds if p.group == "held-out"]
    assert len(held) >= 4
    for p in held:
        assert abs(p.error) < 0.10, f"{p.run.id}: predicted {p.predicted_s:.3f} s, measured {p.measured_s:.3f} s"
    mean, worst, _ = calibrate.summary(preds, "held-out")
    assert mean < 0.05 and worst < 0.10


@needs_runs
@pytest.mark.slow
def test_fit_rows_within_10_percent_and_mean_under_5(results):
    preds, _, _ = results
    fit = [p for p in preds if p.group == "fit"]
    assert len(fit) >= 4
    for p in fit:
        assert abs(p.error) < 0.10, f"{p.run.id}: predicted {p.predicted_s:.3f} s, measured {p.measured_s:.3f} s"
    assert calibrate.summary(preds, "fit")[0] < 0.05


@needs_runs
@pytest.mark.slow
def test_korthikanti_rows_beat_calculon(results):
    """Calculon (Isaev et al. SC'23) reports 3.65% mean error on Korthikanti 2022's rows."""
    preds, _, _ = results
    errs = [abs(p.error) for p in preds if p.run.id.startswith("korthikanti")]
    assert len(errs) == 4
    assert sum(errs) / len(errs) < 0.0365


@needs_runs
@pytest.mark.slow
def test_memory_rows_within_5_percent(results):
    _, _, mems = results
    kinds = {m.what for m in mems}
    assert kinds == {"activations, no recompute", "activations, SP + selective", "params + optimizer"}
    assert len(mems) == 6
    for m in mems:
        assert abs(m.error) < 0.05, f"{m.id} {m.what}: predicted {m.predicted_gib:.2f} GiB, measured {m.measured_gib}"


# -- how rows are read ----------------------------------------------------------------------------

@needs_runs
def test_split_alternates_within_each_paper(data):
    runs = runs_of(data)
    groups = split_rows(runs)
    for src in {calibrate.paper(r) for r in runs}:
        mine = [groups[r.id] for r in runs if calibrate.paper(r) == src]
        assert mine == [("fit", "held-out")[k % 2] for k in range(len(mine))]


@needs_runs
def test_mfu_and_iteration_time_agree(data):
    """A row giving both iter_s and mfu: the model-FLOP formula links them (Narayanan 2021 eq. 3)."""
    hw = load_cluster("dgx-a100")
    both = [r for r in runs_of(data) if "iter_s" in r.row and "mfu" in r.row]
    assert both
    for run in both:
        alone = calibrate.run_from_row({k: v for k, v in run.row.items() if k != "iter_s"})
        assert calibrate.measured_s(alone, hw) == pytest.approx(run.row["iter_s"], rel=0.03)


@needs_runs
@pytest.mark.slow
def test_micro_batch_rule(results):
    preds, _, _ = results
    for p in preds:
        r = p.run
        if r.micro_batch is not None:
            assert (p.micro_batch, p.micro_batch_rule) == (r.micro_batch, "row")
        elif r.pp > 1:
            assert (p.micro_batch, p.micro_batch_rule) == (1, "pp>1")
        else:
            assert (r.batch // r.dp) % p.micro_batch == 0 and p.estimate.fits
            assert p.micro_batch_rule == "largest fitting"


def test_measured_time_from_tflops_counts_the_recomputed_forward():
    row = dict(id="x", h=1024, L=2, heads=8, vocab=1000, seq=512, tp=1, pp=1, dp=1, gpus=1, batch=4,
               tflops_per_gpu=100.0, tflops_counts_recompute=True)
    run = calibrate.run_from_row(row)
    b, s, n, h, v = 4, 512, 2, 1024, 1000
    flops = 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    assert calibrate.measured_s(run) == pytest.approx(flops / 100e12)
    model_only = calibrate.run_from_row(row | {"tflops_counts_recompute": False})
    assert calibrate.measured_s(model_only) < calibrate.measured_s(run)


def test_unknown_hardware_is_skipped_with_a_reason():
    data = {"runs": [dict(id="x", src="Someone 2030 Table 1", hw="tpu-v9", h=256, L=2, heads=4, seq=128,
                          batch=8, iter_s=1.0)]}
    preds, skipped = predict_all(data, Predictor())
    assert preds == [] and skipped == ["x: no preset for hardware 'tpu-v9'"]
    assert calibrate.preset_for("h100-80gb-eos") == "dgx-h100"


def test_benchmark_reports_a_missing_file(tmp_path: Path, capsys):
    assert calibrate.main(["--runs", str(tmp_path / "none.json")]) == 2
    assert "no calibration file" in capsys.readouterr().err


def test_benchmark_prints_json_for_a_small_file(tmp_path: Path, capsys):
    row = dict(id="tiny", src="Test 2024 Table 1", hw="a100-80gb-selene", h=512, L=4, heads=8, vocab=1024,
               seq=512, tp=2, pp=2, dp=2, gpus=8, batch=16, micro_batch=2, recompute="selective", sp=True,
               iter_s=0.05)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [row]}))
    assert calibrate.main(["--runs", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["runs"]] == ["tiny"] and out["runs"][0]["group"] == "fit"
    assert out["runs"][0]["predicted_s"] > 0 and math.isfinite(out["runs"][0]["error"])


# -- the fitted preset follows the stated law -----------------------------------------------------

@pytest.mark.parametrize("which", ["matmul_efficiency", "memory_efficiency"])
def test_preset_curves_are_saturating_and_monotone(which):
    curve = getattr(load_cluster("dgx-a100"), which)
    (s1, e1), (s2, e2) = curve.points[-1], curve.points[len(curve.points) // 2]
    # e = p s / (s + k) through two points gives p and k; every other point must lie on it (to rounding)
    k = (e1 - e2) / (e2 / s2 - e1 / s1)
    p = e1 * (s1 + k) / s1
    assert 0 < p <= 1 and k > 0
    effs = [e for _, e in curve.points]
    assert effs == sorted(effs)
    for s, e in curve.points:
        assert e == pytest.approx(p * s / (s + k), abs=1.5e-3)


# -- modelling fixes the calibration needed -------------------------------------------------------

@pytest.fixture(scope="module")
def layers_22b():
    """Two layers of Korthikanti's 22B model: big enough that the layout ILP lands on Megatron's layout."""
    g = load_graph("gpt", batch=1, seq_len=2048, overrides=dict(hidden=6144, layers=2, heads=64, vocab=51200))
    return g, discover_blocks(g)


def _costs(graph, **kw):
    g, st = graph
    strat = Strategy(**{"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1} | kw)
    hw = load_cluster("dgx-a100", devices=strat.devices)
    return stage_costs(g, st, hw, Workload(global_batch=2 * strat.pp, seq_len=2048), strat)


def test_pipeline_boundary_is_sent_scattered_and_gathered_after(layers_22b):
    """Megatron's scatter/gather (Narayanan 2021, 4.1): 1/t of a replicated boundary crosses stages."""
    layer_input = 2048 * 6144 * 2.0
    plain = _costs(layers_22b, pp=2, recompute="full")
    assert plain.stages[1].boundary_bytes == pytest.approx(layer_input / 8)
    assert plain.stages[1].gather_bytes == pytest.approx(layer_input)
    assert plain.stages[0].gather_bytes == 0  # the first layer's input comes from the embedding, on the stage
    sp = _costs(layers_22b, pp=2, recompute="full", sp=True)
    assert sp.stages[1].boundary_bytes == pytest.approx(layer_input / 8)
    assert all(s.gather_bytes == 0 for s in sp.stages)  # already split by sequence: nothing to gather


def test_sequence_parallel_input_is_gathered_again_in_backward(layers_22b):
    """Korthikanti 2022, 4.2.2: a matmul keeps the sequence shard of its input and all-gathers it again
    in backward, so selective recompute runs as many all-gathers as full recompute (whose recomputed
    forward gathers anyway) and a third fewer reduce-scatters."""
    sel = _costs(layers_22b, sp=True, recompute="selective").stages[0].parts.tp_kinds
    full = _costs(layers_22b, sp=True, recompute="full").stages[0].parts.tp_kinds
    assert sel["all_gather"] == pytest.approx(full["all_gather"], rel=0.01)
    assert sel["reduce_scatter"] < 0.75 * full["reduce_scatter"]


def test_memory_bound_ops_are_not_charged_a_double_backward(layers_22b):
    """Only contractions compute two products backward; the rest move about their forward's bytes."""
    p = _costs(layers_22b, recompute="none").stages[0].parts
    assert 1.2 * p.forward < p.backward < 1.99 * p.forward
