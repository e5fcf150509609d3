"""The Megatron-Bridge sweep (tests/data/bridge_sweep.json, benchmarks/bench_bridge_sweep.py): every row is read as
the preset its release ran, and that reading agrees with the table and with the calibration set's own readings."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.bench_bridge_sweep import (DATA, later, release_spread, retuned, row_key, run_of, scored, sweep, table,
                                          unscored)
from planner.calibration import alternate_split, read_runs
from planner.calibration.bridge_sweep import ERRORS, errors_table, rows_of
from planner.calibration.predict import Predictor
from planner.calibration.runs import parse_run

ROWS = json.loads(DATA.read_text(encoding="utf-8"))["rows"]
README = Path(__file__).resolve().parents[1] / "README.md"


def cell(row: dict, column: str) -> int:
    text = row["row"].get(column, "n/a")
    m = re.match(r"\s*([0-9][0-9,]*)", text)
    return int(m.group(1).replace(",", "")) if m else 1


def test_every_preset_runs_the_layout_its_row_states():
    """The extraction picks a release's preset by the row's GPUs, parallel sizes and batches: a wrong pick (or a
    table that changed under the same commit) shows up as a disagreement here."""
    matched = [r for r in ROWS if "preset" in r]
    assert len(matched) >= 60, "most sweep rows name the preset they ran"
    for r in matched:
        p = r["preset_fields"]
        got = (p["num_gpus"], p.get("tensor_model_parallel_size", 1), p.get("pipeline_model_parallel_size", 1),
               p.get("context_parallel_size", 1), p.get("expert_model_parallel_size", 1), p["global_batch_size"],
               p["micro_batch_size"])
        want = tuple(cell(r, c) for c in ("#-GPUs", "TP", "PP", "CP", "EP", "GBS", "MBS"))
        assert got == want, f"{r['release']} {r['hardware']} {r['model']}: preset {r['preset']} runs {got}, row {want}"


def test_the_sweep_reads_the_shipped_rows_as_the_calibration_set_does():
    """Sixteen sweep rows are calibration runs read by hand (benchmarks/calibration_specs.py); the sweep reads them from
    the presets mechanically. The two readings must give the same layout and execution."""
    shipped = {row_key(r): r for r in read_runs()
               if not r.source.startswith("tests/data/bridge_sweep.json")}  # GB300's runs are the sweep's own
    fields = ("moe_dispatcher", "overlap_ep_comm", "cuda_graphs", "recompute_modules", "fp8_recipe",
              "overlap_tp_comm", "optimizer_bytes", "moe_group_limit")
    compared = 0
    for i, row in enumerate(ROWS):
        spec = run_of(row, i)
        if spec is None:
            continue
        mine = parse_run(spec, where="sweep")
        if row_key(mine) not in shipped:
            continue
        theirs = shipped[row_key(mine)]
        for f in fields:
            assert getattr(mine.execution, f) == getattr(theirs.execution, f), (theirs.id, f)
        mb = mine.strategy["micro_batch"]
        a, b = mine.strategy_with(mb), theirs.strategy_with(mb)  # etp 0 is tp (Megatron-Core's default)
        assert replace(a, etp=a.expert_tp) == replace(b, etp=b.expert_tp), theirs.id
        compared += 1
    assert compared >= 14


@pytest.mark.parametrize("release, micro_batch, dispatcher, graphs", [
    # Megatron-Bridge v0.3.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py: the B200 Qwen3-30B-A3B
    # preset sets no micro-batch (1) and no dispatcher backend, TE graphs of the router and its preprocessing
    ("26.02", 1, "alltoall", ("moe_router", "moe_preprocess")),
    # r0.3.0 at the 26.02.01 table (1f0cfc3bc, v0.3.1 plus GPT-OSS presets): micro-batch 4, HybridEP, the attention
    # graphed too
    ("26.02.01", 4, "deepep", ("attn", "moe_router", "moe_preprocess")),
])
def test_qwen3_30b_on_b200_reads_each_release_preset(release, micro_batch, dispatcher, graphs):
    [(i, row)] = [(i, r) for i, r in enumerate(ROWS) if r["release"] == release and r["hardware"] == "dgx-b200"
                  and r["model"] == "qwen3-30b-a3b"]
    run = parse_run(run_of(row, i), where="sweep")
    assert run.strategy["micro_batch"] == micro_batch
    assert run.execution.moe_dispatcher == dispatcher
    assert tuple(run.execution.cuda_graphs) == graphs
    assert run.execution.fp8_recipe == "mxfp8"


@pytest.fixture(scope="module")
def swept(shared_graphs):
    items, _, skipped, _ = sweep(Predictor(graphs=shared_graphs))
    assert not skipped, skipped
    return items


def test_readme_shows_the_sweep_as_it_is(swept):
    """The README's sweep table is what benchmarks/bench_bridge_sweep.py prints from today's presets."""
    lines = table(swept)
    readme = README.read_text(encoding="utf-8")
    assert lines[0] in readme, "the README has no Megatron-Bridge sweep table"
    assert "\n".join(lines) in readme, "the README's sweep table is stale: run benchmarks/bench_bridge_sweep.py"
    assert unscored(swept) in readme, "the README does not say which rows the sweep leaves unscored"
    assert release_spread(ROWS) in readme, "the README's release-to-release spread is stale"
    assert retuned(swept, ROWS) in readme, "the README's retuned-preset pairs are stale"


def test_readme_and_what_ifs_show_the_hardware_pairs_as_they_are(swept):
    """The README's hardware-to-hardware table, and what what-if sweeps cite, are what
    benchmarks/bench_hardware_pairs.py computes from today's presets; and its pairs are
    the archive's: GPT-OSS 120B in BF16 on 64 GPUs (EP8, micro-batch 4, 26.04.01) ran 13,568 tokens/s per GPU on DGX
    B200 and 15,232 on DGX B300, a 1.123x speedup measured (26.04's B200 row, a regression its publisher names, pairs
    with nothing)."""
    from benchmarks.bench_hardware_pairs import table as pair_table
    from planner.calibration.hardware_pairs import PAIRS, pairs, pairs_table, speedups

    found = pairs(p for p, _ in scored(swept))
    summary = pairs_table(found)
    assert json.loads(PAIRS.read_text(encoding="utf-8")) == summary, \
        "planner/calibration/hardware_pairs.json is stale: run benchmarks/bench_bridge_sweep.py --write"
    assert "\n".join(pair_table(summary)) in README.read_text(encoding="utf-8"), "the README's hardware pairs are stale"
    gpt = [(a, b) for a, b in found if a.run.id == "26.04.01-dgx-b200-gpt-oss-120b-bf16-64gpu"]
    assert [b.run.hardware for _, b in gpt] == ["dgx-b300"]
    assert speedups(*gpt[0])[0] == pytest.approx(15232 / 13568, rel=1e-9)
    assert not [a for a, _ in found if a.run.id == "26.04-dgx-b200-gpt-oss-120b-bf16-64gpu"]
    assert all(a.run.hardware < b.run.hardware and a.run.model == b.run.model for a, b in found)


def test_the_release_spread_pairs_rows_whose_preset_did_not_change():
    """The archive lists Qwen3-235B on 256 DGX B300s at 4,865 tokens/s per GPU in 26.04 and 5,936 in 26.04.01, both
    with QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_MX_V2 at micro-batch 2, PP8, EP8. They are not one preset run twice:
    26.04.01's table was published from Megatron-Bridge's r0.4.0 branch (tag v0.4.2), whose qwen3_llm_pretrain.py
    sends that preset through the flex dispatcher with HybridEP (cherry-pick 6a5c997e7), where v0.4.0's forces the
    all-to-all one. So the pair is left out, and the largest move with the preset unchanged is Llama 3 70B FP8-CS on
    64 GB200s, 4,040 -> 4,357 tokens/s per GPU from 26.02 to 26.02.01 (+7.8 %)."""
    qwen = {r["release"]: r for r in ROWS if r["model"] == "qwen3-235b-a22b" and r["hardware"] == "dgx-b300"
            and r["release"] in ("26.04", "26.04.01")}
    assert qwen["26.04.01"]["tag"] == "v0.4.2"
    assert qwen["26.04"]["code"]["moe_token_dispatcher_type"] == "alltoall"
    assert qwen["26.04.01"]["code"]["moe_token_dispatcher_type"] == "flex"
    assert qwen["26.04.01"]["preset_fields"]["moe_flex_dispatcher_backend"] == "hybridep"
    said = release_spread(ROWS)
    assert "qwen3-235b-a22b on dgx-b300" not in said
    assert "at most +7.8 % (llama3-70b on gb200-nvl72, 26.02 -> 26.02.01)" in said
    assert round(100 * (4357 / 4040 - 1), 1) == 7.8


def test_gpt_oss_26_02_01_rows_read_the_presets_of_their_table_commit():
    """Megatron-Bridge's r0.3.0 commit that published the 26.02.01 table (1f0cfc3bc, the day after v0.3.1) comes
    right after 904597bd3 (#2915), which set GPT-OSS's B200 and B300 BF16 presets to EP8 through HybridEP, as the
    table lists them; at v0.3.1 they are EP64 and match no row, so those two rows were left out before."""
    rows = [(i, r) for i, r in enumerate(ROWS) if r["release"] == "26.02.01" and r["model"] == "gpt-oss-120b"
            and r["hardware"] in ("dgx-b200", "dgx-b300")]
    assert len(rows) == 2
    for i, row in rows:
        assert row["tag"].startswith("1f0cfc3bc") and row["row"]["EP"] == "8"
        assert row["preset_fields"]["expert_model_parallel_size"] == 8
        run = parse_run(run_of(row, i), where="sweep")
        assert run.strategy["ep"] == 8 and run.execution.moe_dispatcher == "deepep"


def test_a_row_the_publisher_says_a_bug_slowed_is_not_scored(swept):
    """Megatron-Bridge's 26.06.01 GPT-OSS rows carry the footnote "Performance regression in GPT-OSS 120B
    pre-training is a known issue": they are read and estimated, but left out of the table and of what estimates
    cite, and the GB300 one (a shipped run) is neither fitted on nor held out."""
    flagged = sorted(p.run.id for p, _ in swept if "known issue" in p.run.known_regression)
    assert flagged == ["26.06.01-gb200-nvl72-gpt-oss-120b-fp8_mx-64gpu", "26.06.01-gb300-nvl72-gpt-oss-120b-fp8_mx-64gpu"]
    assert not set(flagged) & {r["id"] for r in json.loads(ERRORS.read_text(encoding="utf-8"))["rows"]}
    shipped = {r.id: r for r in read_runs()}
    gb300 = shipped["26.06.01-gb300-nvl72-gpt-oss-120b-fp8_mx-64gpu"]
    fitted = [r.id for r in alternate_split(list(shipped.values()))["gb300-nvl72"]]
    assert gb300.known_regression and gb300.id not in fitted


def test_a_row_its_publisher_calls_a_regression_in_its_tracker_is_not_scored(swept):
    """Megatron-Bridge#1998 says Qwen3-30B ran 2x slower with the dropless schedule in 25.11 on H100 and B200: the
    25.11 B200 row (the H100 one matches no preset) is read and estimated, but not scored; the 26.02 rows, which the
    issue does not name, stay scored."""
    by_id = {p.run.id: p for p, _ in swept}
    flagged = by_id["25.11-dgx-b200-qwen3-30b-a3b-fp8_mx-8gpu"]
    assert flagged.group == "regression" and "Megatron-Bridge#1998" in flagged.run.known_regression
    assert by_id["26.02-dgx-b200-qwen3-30b-a3b-fp8_mx-8gpu"].group != "regression"
    assert flagged.run.id not in {r["id"] for r in json.loads(ERRORS.read_text(encoding="utf-8"))["rows"]}
    assert sum(p.group == "regression" for p, _ in swept) == 5


def test_the_rows_a_tracker_issue_names_by_precision_are_the_only_ones_not_scored(swept):
    """Megatron-Bridge#3387 and #3388 call the 26.04 tables' GPT-OSS BF16 on B200 and Llama 3 70B FP8-CS on GB200 5 %
    regressions: those two rows are not scored, nor the shipped runs read from them; the same tables' MXFP8 70B row on
    GB200 and the 26.04.01 patch's rows, which the issues do not name, are."""
    by_id = {p.run.id: p for p, _ in swept}
    for rid, issue in (("26.04-dgx-b200-gpt-oss-120b-bf16-64gpu", "#3387"),
                       ("26.04-gb200-nvl72-llama3-70b-fp8_cs-64gpu", "#3388")):
        assert by_id[rid].group == "regression" and f"Megatron-Bridge{issue}" in by_id[rid].run.known_regression
    for rid in ("26.04-gb200-nvl72-llama3-70b-fp8_mx-64gpu", "26.04.01-gb200-nvl72-llama3-70b-fp8_cs-64gpu",
                "26.04.01-dgx-b200-gpt-oss-120b-bf16-64gpu"):
        assert by_id[rid].group != "regression"
    shipped = {r.id: r for r in read_runs()}
    assert "#3387" in shipped["mb2604-gpt-oss-120b-64xb200-bf16"].known_regression
    assert "#3388" in shipped["mb2604-llama3-70b-64xgb200-fp8-fsdp"].known_regression


def test_the_errors_estimates_cite_are_the_rows_errors_today(swept):
    """planner/calibration/bridge_sweep_errors.json (what an estimate cites) is what the sweep gives now:
    benchmarks/bench_bridge_sweep.py --write rewrites it after a change of the cost model or a refit."""
    stored = json.loads(ERRORS.read_text(encoding="utf-8"))
    assert stored == json.loads(json.dumps(errors_table(scored(swept)))), \
        "bridge_sweep_errors.json is stale: run python benchmarks/bench_bridge_sweep.py --write"


def test_an_estimate_cites_the_models_bridge_rows_on_its_hardware():
    """Qwen3-30B-A3B on DGX B200: every Megatron-Bridge row of it there, with the range of their errors as computed
    today; changed by overrides it is not the model those rows trained, and none is cited."""
    from planner.api import estimate_model

    kw = dict(cluster="dgx-b200", devices=8, global_batch=512, seq_len=4096, ep=8)
    acc = estimate_model("qwen3-30b-a3b", **kw)["accuracy"]
    mine = rows_of("qwen3-30b-a3b", "dgx-b200")
    assert [r["id"] for r in acc["bridge_sweep"]] == [r["id"] for r in mine] and len(mine) >= 4
    low, high = min(r["error"] for r in mine), max(r["error"] for r in mine)
    assert f"{len(mine)} rows, {100 * low:+.1f} % to {100 * high:+.1f} %" in acc["bridge_sweep_sentence"]
    assert "bridge_sweep" not in estimate_model("qwen3-30b-a3b", overrides=dict(layers=4), **kw)["accuracy"]


def test_a_preset_without_held_out_shipped_runs_of_a_kind_cites_the_never_fitted_rows():
    """GB200 ships no held-out dense training run (two fitted, the third set aside as the regression #3388 names): an
    estimate there says so and gives the sweep's rows of dense training on GB200 that no fit saw, their count, mean
    and largest |error| as the errors file holds them; DGX H100, whose shipped runs hold some out, cites those
    instead."""
    from planner.api import estimate_model

    acc = estimate_model("llama3-8b", cluster="gb200-nvl72", devices=8, global_batch=64, seq_len=8192)["accuracy"]
    rows = [r["error"] for r in json.loads(ERRORS.read_text(encoding="utf-8"))["rows"]
            if r["hardware"] == "gb200-nvl72" and r["category"] == "dense_training" and not r["shipped"]]
    assert acc["runs"] == 0 and len(rows) >= 10
    mean, worst = sum(map(abs, rows)) / len(rows), max(map(abs, rows))
    assert acc["sentence"] == ("no held-out dense training run on gb200-nvl72 among the shipped ones; "
                               f"Megatron-Bridge's {len(rows)} never-fitted dense training rows there (NeMo "
                               f"25.11-26.08): mean |error| {100 * mean:.1f} %, max {100 * worst:.1f} %")
    h100 = estimate_model("llama3-8b", cluster="dgx-h100", devices=8, global_batch=64, seq_len=8192)
    assert "never-fitted" not in h100["accuracy"]["sentence"]
    assert acc["sentence"] in " ".join(README.read_text(encoding="utf-8").replace("`", "").split())  # as quoted


def test_an_eager_moe_estimate_says_how_its_host_issue_is_costed():
    """Training a MoE model without the whole iteration in CUDA graphs, the estimate says how the eager MoE layer's
    host issue is costed (per expert GEMM on megatron-core) and what it leaves out, and cites the witness rows'
    errors as computed today (the same model on the same GPUs, eager and graphed); a dense model, a serving step or
    a full-iteration graph stack gets no such line."""
    from planner.api import estimate_model
    from planner.calibration.bridge_sweep import WITNESS, eager_moe

    kw = dict(cluster="dgx-h100", devices=16, global_batch=64, seq_len=4096)
    said = [a for a in estimate_model("qwen3-30b-a3b", ep=8, **kw)["assumptions"] if "eager MoE layer" in a]
    evidence = eager_moe()
    assert len(said) == 1 and evidence and evidence in said[0] and "per expert GEMM" in said[0]
    eager = [r["error"] for r in rows_of(*WITNESS) if r["cuda_graphs"] != "full iteration"]
    assert f"{100 * min(eager):+.1f} %" in evidence
    graphs = str(Path(__file__).parent / "data" / "stacks" / "graphs_full_iteration.toml")
    assert not [a for a in estimate_model("qwen3-30b-a3b", ep=8, stack=graphs, **kw)["assumptions"]
                if "eager MoE layer" in a]
    assert not [a for a in estimate_model("llama3-8b", **kw)["assumptions"] if "eager MoE layer" in a]


def test_readme_states_the_rows_published_after_the_fits_as_they_are(swept):
    """Megatron-Bridge's 26.08 rows are kept out of the shipped runs and scored blind; the README says how they came
    out as benchmarks/bench_bridge_sweep.py prints it."""
    said = later(swept)
    assert said.startswith("Published after every preset was fitted (NeMo 26.08), 8 rows"), said
    assert said in README.read_text(encoding="utf-8"), "the README's 26.08 sentence is stale: run bench_bridge_sweep.py"
    assert not any(r.id.startswith("26.08-") for r in read_runs()), "a later release's row is shipped, so not blind"


def test_a_retuned_preset_pairs_rows_whose_run_changed(swept):
    """Retuned pairs are consecutive rows of one job whose run changed as the estimate reads it: a preset renamed or
    re-read that runs the same is a release's drift (`release_spread`), not a retuning."""
    said = retuned(swept, ROWS)
    m = re.search(r"moe (\d+) pairs, ([0-9.]+) % \(median\), ([0-9.]+) % at most \([^)]*\), (\d+) flipped", said)
    assert m, said
    pairs, median, worst, flipped = int(m[1]), float(m[2]), float(m[3]), int(m[4])
    changed = sum(1 for a, b in zip(ROWS, ROWS[1:]) if a.get("preset_fields") != b.get("preset_fields"))
    assert 20 <= pairs < changed and median <= worst and flipped <= pairs // 10
