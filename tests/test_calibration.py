"""The cost model against the published runs hyperplan ships: held-out error per hardware, and every run fits.

The runs are `planner/calibration/runs/*.json`, our reading of the published rows in tests/data
(test_calibration_readings.py checks the reading). Each preset lists the runs it was fitted on
(`fitted_on`, at most half of its hardware's runs: test_efficiency_law.py); only the others count here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from cost_models import load_cluster
from planner.api import calibrate
from planner.calibration import alternate_split, read_runs
from planner.calibration.predict import Predictor, summarise
from planner.calibration.published import ERRORS
from planner.calibration.reserve_fit import fit_reserves, tensor_gib
from planner.calibration.runs import load_runs
from planner.costing.execution import load_execution
from planner.errors import InvalidInput

pytestmark = pytest.mark.calibration

#: Held-out (mean, max) |error| of the step time we hold each hardware and category to (issue 13's target is
#: 5% and 15%; where a hardware is above it the README says so and why).
BOUNDS = {
    ("dgx-a100", "dense_training"): (0.05, 0.05),
    # the target since NeMo's 2024 rows run FlashAttention-2, as its launcher set, with FlashAttention-2's own length
    # law (4.8 %, max 11.7 % over 17 rows, nine of them NeMo 24.03.01's Llama 2 7B at 4K-1M tokens with CP up to 32,
    # -4.2 % to +9.7 %, which cuDNN's kernel had put 22-40 % fast from 16K on); 5.17 %, max 8.5 % over the 8 before
    ("dgx-h100", "dense_training"): (0.05, 0.15),
    ("ascend-910b", "dense_training"): (0.05, 0.15),  # the target
    ("h100-grand-teton", "dense_training"): (0.05, 0.15),  # the target (the 8B FP8 async-TP row at -13.6 %)
    # above the target: the ModelZoo's BF16 Qwen3-235B +23.7 % since DeepSeek-V3 runs as it ran and pulls GB200's
    # BF16 plateau down (benchmarks/CALIBRATION.md: DeepSeek-V3 as run), GPT-OSS -20.5 % (README), and of Megatron-LM's
    # MoE recipe index (never fitted) Qwen3-30B in MXFP8 -24.3 % and -16.0 %; 11.8 % over 9 rows (12.3 % over the 4
    # before the index)
    ("gb200-nvl72", "moe_training"): (0.119, 0.244),
    # above the target, both rows of Megatron-LM's MoE recipe index (never fitted): Qwen3-235B in MXFP8 with the
    # all-to-all overlap run eagerly -21.4 %, DeepSeek-V3 -1.0 %
    ("dgx-b200", "moe_training"): (0.113, 0.215),
    # above the target: guards against regressions, not the target (README: calibration)
    # DeepSeek-V3 on 1,024 GPUs as it ran -16.1 %, the ModelZoo's Megatron-FSDP row +19.4 % (README), and of
    # Megatron-LM's MoE recipe index (never fitted) Qwen3-235B in BF16 -26.6 % (the open PR #5728 re-measures its
    # recipe 41 % faster) and Qwen3-30B in BF16 +20.5 %; 10.6 % over 11 rows (8.3 % over the 8 before the index)
    ("dgx-h100", "moe_training"): (0.107, 0.267),
    ("gb300-nvl72", "dense_training"): (0.05, 0.15),  # the target (2.5 %, max 8.0 %)
    # the target since GPT-OSS's scaled RoPE runs unfused (5.5 % before): GPT-OSS's four BF16 rows at EP64 about
    # -10 %, its FP8 one (the fused grouped MLP, without the bias loop it does not run) about -7 % (the sixth is the
    # regression its table's footnote names, not scored); Qwen3-235B's six within 2.5 % (benchmarks/CALIBRATION.md:
    # GB300 NVL72); 4.7 % over 11 rows; 4.5 % over 13 with the recipe index's two (never fitted: Qwen3-235B +5.8 %,
    # DeepSeek-V3 -1.2 %); 4.65 % over 14 with the ModelZoo's GB300 row (never fitted: -6.8 %)
    ("gb300-nvl72", "moe_training"): (0.05, 0.15),
    # above the target, all MoE rows of eager stacks: Qwen3-235B in 26.02 at micro-batch 1 -38.1 % where 26.04's
    # micro-batch 2 runs in half its time, GPT-OSS in MXFP8 about -12 % (benchmarks/CALIBRATION.md: DGX B300); 9.5 %
    # over 9 rows, its BF16 plateau DGX B200's (12.6 % with the network at the product's 800 Gb/s: GPT-OSS across 8
    # nodes -28.4 %); 9.3 % over 10 with the recipe index's Qwen3-235B (-7.0 %, never fitted)
    ("dgx-b300", "moe_training"): (0.094, 0.392),
}


@pytest.fixture(scope="module")
def result(shared_graphs):
    return calibrate(predictor=Predictor(graphs=shared_graphs))


def test_every_shipped_run_is_predicted(result):
    assert not result.skipped
    assert len(result.predictions) == len(read_runs()) >= 70


def test_the_readme_table_is_todays(result):
    """The README's calibration table (per hardware and category: runs, fitted, held-out mean and max, worst run)
    is what `benchmarks/bench_calibration.py` prints from today's model and presets: a refit or a new run that is
    not carried into the README fails here."""
    from benchmarks.bench_calibration import table, unscored

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    head = table(result)[0]
    assert head in readme, "the README has no calibration table"
    start = readme.index(head)
    shown = readme[start:readme.index("\n\n", start)].splitlines()
    assert shown == table(result)
    assert unscored(result.predictions) in readme, "the README does not name the runs left unscored"


def test_the_readme_table_of_never_fitted_runs_is_todays(result):
    """The README's table of the runs no fit may use (Megatron-LM's MoE recipe index, the ModelZoo's GB300 row) and
    the line under it are what `benchmarks/bench_calibration.py` prints from today's model: a change that moves one
    of them fails here."""
    from benchmarks.bench_calibration import blind

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    lines = blind(result)
    assert len(lines) == 14 + 4 and lines[0] in readme, "the README has no table of the never-fitted runs"
    start = readme.index(lines[0])
    assert readme[start:].splitlines()[:len(lines)] == lines


def test_the_readme_table_of_layout_pairs_is_todays(result):
    """The README's table of layout pairs (two runs one table measured of the same job in two strategies: the
    estimated throughput ratio against the measured one) is what `benchmarks/bench_layout_pairs.py` prints; and the
    pairs it rests on are real ones: one table, one job, two strategies."""
    from benchmarks.bench_layout_pairs import pairs, table

    found = pairs(result.predictions)
    assert len(found) >= 20
    for p in found:
        a, b = p.a.run, p.b.run
        assert (a.model, a.hardware, a.seq_len, a.dtype) == (b.model, b.hardware, b.seq_len, b.dtype)
        assert a.strategy != b.strategy
        assert p.error >= 0.0
    from planner.calibration.layout_pairs import by_category

    stored = json.loads(ERRORS.read_text(encoding="utf-8"))["layout_pairs"]  # what plan's close calls read
    assert stored == by_category(found), "published_errors.json's layout pairs are stale: run published_errors.py"
    lines = table(result.predictions)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert lines[0] in readme, "the README has no table of layout pairs"
    start = readme.index(lines[0])
    assert readme[start:].splitlines()[:len(lines)] == lines, "the README's layout pairs are stale"


def test_every_published_run_is_predicted_to_fit(result):
    """They ran: a plan that says they cannot is wrong about memory."""
    over = [(p.run.id, round(p.predicted_memory_gib, 1)) for p in result.predictions if not p.estimate.fits]
    assert not over


@pytest.mark.parametrize("hardware, category", sorted(BOUNDS))
def test_held_out_runs_are_within_their_bounds(result, hardware, category):
    held = [p for p in result.predictions
            if p.cluster == hardware and p.run.category == category and p.group == "held-out"]
    assert len(held) >= 2
    s = summarise(held)
    mean_bound, max_bound = BOUNDS[(hardware, category)]
    worst = max(held, key=lambda p: abs(p.error))
    assert s.mean <= mean_bound and s.max <= max_bound, f"worst {worst.run.id}: {100 * worst.error:+.1f}%"


@pytest.mark.parametrize("hardware", sorted({r.hardware for r in read_runs()}))
def test_each_preset_states_the_held_out_errors_it_has(result, hardware):
    """What every estimate on a preset repeats (`Cluster.checked`) is what its held-out runs give today: a change of
    the cost model without a refit (benchmarks/fit_presets.py writes them) fails here."""
    cluster = load_cluster(hardware)
    held = [p for p in result.predictions if p.cluster == hardware and p.group == "held-out"]
    for category in sorted({p.run.category for p in held} | {h.category for h in cluster.held_out}):
        mine = [p for p in held if p.run.category == category]
        stated = cluster.checked(category)
        assert stated is not None and stated.runs == len(mine), category
        s = summarise(mine)
        assert stated.mean == pytest.approx(s.mean, abs=0.0005) and stated.max == pytest.approx(s.max, abs=0.0005)


def test_the_errors_estimates_cite_are_the_runs_errors_today(result):
    """An estimate of a zoo model on a preset cites that model's runs there (planner/calibration/published.py):
    what it cites is what the runs give now (benchmarks/published_errors.py writes them after a refit), but for a run
    its publisher says a bug slowed."""
    cited = {r["id"]: r for r in json.loads(ERRORS.read_text(encoding="utf-8"))["runs"]}
    scored = [p for p in result.predictions if p.group != "regression"]
    assert set(cited) == {p.run.id for p in scored} and len(scored) < len(result.predictions)
    for p in scored:
        r = cited[p.run.id]
        assert (r["model"], r["hardware"], r["devices"], r["as_shipped"]) == (p.run.model, p.cluster, p.run.devices,
                                                                              not p.run.overrides)
        assert r["group"] == p.group and r["error"] == pytest.approx(p.error, abs=1e-4)


def test_the_a100_runs_stay_within_5_percent(result):
    """The 2021-22 Megatron-LM rows the model was first fitted to, fit and held-out alike."""
    a100 = [p for p in result.predictions if p.cluster == "dgx-a100"]
    assert len(a100) == 11
    assert max(abs(p.error) for p in a100) <= 0.05


def test_held_out_memory_agrees_with_the_reserved_peaks_published(result):
    """Published memory is the allocator's reserved peak: the tensors the estimate counts stay under it, and with
    the stack's fitted reserve the held-out runs' peaks come within 7 % on average (9.6 % without it), 20 % at
    most (the 405B 1F1B row on 512 GPUs, -18.5 %)."""
    with_memory = [p for p in result.predictions if p.run.memory_gib is not None]
    assert len(with_memory) >= 12
    for p in with_memory:
        assert tensor_gib(p) <= p.run.memory_gib, p.run.id
    held = [p for p in with_memory if p.group == "held-out"]
    errors = [abs(p.memory_error) for p in held]
    assert len(held) >= 6
    assert sum(errors) / len(errors) <= 0.07 and max(errors) <= 0.20


def test_the_shipped_allocator_reserve_is_the_fit_on_half_the_runs(result):
    """benchmarks/fit_allocator_reserve.py wrote it: the stack file carries what its fitted runs give."""
    fits = {f.stack: f for f in fit_reserves(result.predictions)}
    assert set(fits) == {"torchtitan"}
    assert fits["torchtitan"].reserve == pytest.approx(load_execution("torchtitan").allocator_reserve, abs=5e-4)
    assert len(fits["torchtitan"].fitted) <= len(fits["torchtitan"].held_out)


# -- the runs format ----------------------------------------------------------------------------------

def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": rows}))
    return path


_ROW = {"id": "a", "hardware": "dgx-a100", "devices": 8, "model": "gpt", "overrides": {"layers": 2},
        "seq_len": 512, "global_batch": 16, "stack": "megatron-2021",
        "strategy": {"tp": 2, "micro_batch": 2}, "measured": {"step_s": 0.05}}


@pytest.mark.parametrize("change, words", [
    ({"devices": 0}, "devices must be a positive integer"),
    ({"measured": {}}, "measured must give step_s or tokens_per_s_per_device"),
    ({"strategy": {"tp": 2, "xp": 3}}, "unknown strategy key 'xp'"),
    ({"stack": "nemo-9000"}, "unknown stack 'nemo-9000'"),
    ({"execution": {"overlap_tp_comm": 3}}, "execution.overlap_tp_comm: expected true or false"),
    ({"colour": "red"}, "unknown field 'colour'"),
    ({"known_regression": True}, "known_regression must be the publisher's sentence"),
    ({"never_fitted": 1}, "never_fitted must say why no fit may use the run"),
    ({"measured": {"step_s": 0.05, "memory_gib": 60}}, "unknown field 'memory_gib'.*the row's own memory_gib field"),
    # QA of 2026-12-07: tp 0 had crashed (ZeroDivisionError), sp "false" had read as true, any category passed
    ({"strategy": {"tp": 0}}, r"strategy.tp must be an integer of at least 1, got 0"),
    ({"strategy": {"tp": 2, "sp": "false"}}, r"strategy.sp must be true or false, got 'false'"),
    ({"category": "foo"}, "category must be one of training, dense_training, moe_training, got 'foo'"),
])
def test_bad_rows_are_refused_with_one_sentence(tmp_path, change, words):
    with pytest.raises(InvalidInput, match=words):
        load_runs(_write(tmp_path, [_ROW | change]))


def test_tokens_per_second_is_read_as_a_step_time(tmp_path):
    runs = load_runs(_write(tmp_path, [_ROW | {"measured": {"tokens_per_s_per_device": 1024.0}}]))
    assert runs[0].measured_step_s == pytest.approx(16 * 512 / (1024.0 * 8))


def test_a_users_runs_are_predicted_on_their_hardware(tmp_path):
    got = calibrate([_write(tmp_path, [_ROW])])
    (p,) = got.predictions
    assert p.cluster == "dgx-a100" and p.micro_batch == 2 and p.predicted_s > 0 and not p.fitted


def test_a_run_its_publisher_says_a_bug_slowed_is_neither_fitted_nor_held_out(tmp_path):
    """Four runs, the first and third alike but for the flag: the flagged one keeps its place in the order (so the
    rule still fits on the even positions it would have) but is never fitted on, and the summary reports it apart."""
    rows = [_ROW | {"id": f"r{i}", "global_batch": 16 * (i + 1)} for i in range(4)]
    rows[0] |= {"known_regression": "a known issue, fixed in the next release"}
    runs = load_runs(_write(tmp_path, rows))
    assert [r.id for r in alternate_split(runs)["dgx-a100"]] == ["r2"]
    got = calibrate([_write(tmp_path, rows)])
    assert [p.group for p in got.predictions] == ["regression", "held-out", "held-out", "held-out"]
    assert {s["group"]: s["rows"] for s in got.summary()} == {"held-out": 3, "regression": 1}
    said = [r["known_regression"] for r in got.to_dict()["runs"]]
    assert said == ["a known issue, fixed in the next release", None, None, None]


def test_a_run_no_fit_may_use_is_held_out_and_outside_the_split(tmp_path):
    """Five runs, two of them kept out of every fit: the split is the one the other three alone give (their first
    fitted; counted in, the five runs' cap would fit the third too), and all five are scored as held out."""
    rows = [_ROW | {"id": f"r{i}", "global_batch": 16 * (i + 1)} for i in range(5)]
    for i in (0, 3):
        rows[i] |= {"never_fitted": "read after the fit"}
    runs = load_runs(_write(tmp_path, rows))
    assert [r.id for r in alternate_split(runs)["dgx-a100"]] == ["r1"]
    got = calibrate([_write(tmp_path, rows)])
    assert [p.group for p in got.predictions] == ["held-out"] * 5
    said = [r["never_fitted"] for r in got.to_dict()["runs"]]
    assert said == ["read after the fit", None, None, "read after the fit", None]
    with pytest.raises(InvalidInput, match="keeps out of every fit \\(never_fitted\\): r3"):
        calibrate([_write(tmp_path, rows)], fit=["r1", "r3"])
    fitted = calibrate([_write(tmp_path, rows)], fit=["r1"])
    assert [p.group for p in fitted.predictions] == ["held-out", "fit", "held-out", "held-out", "held-out"]


def test_the_shipped_split_is_what_each_preset_fitted_on():
    """The rule's split of the shipped runs, never-fitted ones left out of it, is each fitted preset's fitted_on: a
    change of the rule or of the runs that would move a fit without a refit fails here."""
    split = alternate_split(read_runs())
    for hw, runs in split.items():
        assert sorted(r.id for r in runs) == sorted(load_cluster(hw).fitted_on), hw
        assert not any(r.never_fitted for r in runs)


def test_the_recipe_index_rows_are_never_fitted(result):
    """Megatron-LM's MoE recipe index, read after every preset was fitted: every row held out, none fitted on."""
    recipes = [p for p in result.predictions if p.run.id.startswith("mlm-recipe-")]
    assert len(recipes) == 13 and all(p.run.never_fitted and p.group == "held-out" for p in recipes)
    fitted = {rid for name in ("dgx-h100", "dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72")
              for rid in load_cluster(name).fitted_on}
    assert not fitted & {p.run.id for p in recipes}


def test_predictors_given_one_store_build_each_graph_once(tmp_path):
    """Two predictors on one graph store: the second reads the graph the first built; micro-batch choices stay
    each predictor's own."""
    run = load_runs(_write(tmp_path, [_ROW | {"strategy": {"tp": 2, "micro_batch": "largest fitting"}}]))[0]
    store: dict = {}
    first, second = Predictor(graphs=store), Predictor(graphs=store)
    assert second.graph(run) is first.graph(run) and len(store) == 1
    assert first.micro_batch(run, first.cluster(run)) == 4 and first._micro and not second._micro


def test_the_largest_fitting_micro_batch_is_chosen_once(tmp_path):
    row = _ROW | {"strategy": {"tp": 2, "micro_batch": "largest fitting"}}
    run = load_runs(_write(tmp_path, [row]))[0]
    pred = Predictor()
    # a 2-layer model: 8 sequences of 512 would fit, but each of the 4 data-parallel ranks has only 4
    assert pred.micro_batch(run, pred.cluster(run)) == 4


def test_the_reserve_fit_makes_the_fitted_peaks_agree_on_average(tmp_path):
    """Two runs whose allocators report 10 % and 20 % over the tensors the estimate counts: one reserve fits both
    best in log terms, 1 - 1/sqrt(1.1 x 1.2), and the calibration's memory summary reports what is left."""
    rows = [_ROW | {"id": "t1", "stack": "torchtitan"}, _ROW | {"id": "t2", "stack": "torchtitan", "global_batch": 32}]
    first = calibrate([_write(tmp_path, rows)])
    tensors = {p.run.id: tensor_gib(p) for p in first.predictions}
    measured = {"t1": 1.1 * tensors["t1"], "t2": 1.2 * tensors["t2"]}
    rows = [r | {"memory_gib": measured[r["id"]]} for r in rows]
    got = calibrate([_write(tmp_path, rows)])
    (fit,) = fit_reserves([dataclasses.replace(p, fitted=True) for p in got.predictions])
    assert fit.reserve == pytest.approx(1.0 - 1.0 / math.sqrt(1.1 * 1.2))
    (summary,) = got.memory_summary()
    reserve = load_execution("torchtitan").allocator_reserve
    worst = max(abs(1.0 / (1.0 - reserve) / 1.1 - 1.0), abs(1.0 / (1.0 - reserve) / 1.2 - 1.0))
    assert summary["group"] == "held-out" and summary["max_abs_error"] == pytest.approx(worst)
