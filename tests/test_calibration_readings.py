"""Our reading of the published rows (tests/data) into the shipped runs: nothing changed on the way.

Every degree a published row states (tp, pp, cp, ep, etp, vpp, dp, micro-batch, FSDP), its device count,
sequence and batch are what the shipped run uses, unless the spec corrects a table's column from the code
that produced the figure (`corrects`), which the run's notes then explain; its measured figure is the run's
step time; and the shipped files are exactly what benchmarks/calibration_readings.py writes from tests/data.
"""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import calibration_readings as readings
from benchmarks.calibration_specs import SPECS
from planner.calibration import read_runs, shipped_files

pytestmark = pytest.mark.calibration

RAW = readings.raw_rows()
#: the runs read from the published rows by SPECS (the sweep-read files are tests/test_bridge_sweep.py's)
RUNS = {r.id: r for r in read_runs() if not r.source.startswith("tests/data/bridge_sweep.json")}
SHIPPED_MEASURED = {row["id"]: next(iter(row["measured"])) for path in shipped_files()
                    for row in json.loads(path.read_text())["runs"]}
#: run id -> the row's columns its spec corrects, each with the words of the note that says why
CORRECTED = {rid + v.get("suffix", ""): spec.get("corrects", {}) for rid, spec in SPECS.items()
             for v in spec.get("variants", ({},))}


def test_the_shipped_files_are_the_readings_of_tests_data():
    assert readings.main(["--check"]) == 0


#: run id -> the key of the row's `measured.also` entry it reads: another layout of the same table, named by its key
ALSO = {rid + v.get("suffix", ""): v["also"] for rid, spec in SPECS.items() for v in spec.get("variants", ({},))
        if "also" in v}


def _layout(row: dict, run) -> dict:
    if run.id in ALSO:  # "same_table_A2A_TP2_EP8_PP32_VPP3_DP4_GA512": the degrees its key states
        return {k.lower(): int(n) for k, n in re.findall(r"_([A-Z]+)(\d+)(?=_|$)", ALSO[run.id])}
    layout = row.get("layout", {})
    if "tp" not in layout and "tp" in row:  # the A100 file keeps degrees at the top level
        layout = row
    if any(isinstance(v, dict) for k, v in layout.items() if k.endswith("K")):  # a layout per sequence length
        layout = layout[f"{run.seq_len // 1024}K"]
    return layout


@pytest.mark.parametrize("rid", sorted(RUNS))
def test_each_run_keeps_its_rows_degrees(rid):
    run = RUNS[rid]
    row = RAW[run.source.split("#")[1].split(" (")[0]]
    layout = {k: v for k, v in _layout(row, run).items() if k not in CORRECTED[rid]}
    for key, why in CORRECTED[rid].items():  # a correction names a column the row has, and says why in a note
        assert key in _layout(row, run), f"{rid}: corrects {key!r}, which the row does not state"
        assert any(why in note for note in run.notes), f"{rid}: no note says {why!r}"
    strategy = run.strategy_with(1 if run.strategy.get("micro_batch") == "largest fitting"
                                 else run.strategy.get("micro_batch", 1))
    for key, mine in (("tp", strategy.tp), ("pp", strategy.pp), ("cp", strategy.cp), ("ep", strategy.ep),
                      ("vpp", strategy.vpp), ("dp", strategy.dp)):
        theirs = layout.get(key)
        if isinstance(theirs, int) and not isinstance(theirs, bool):
            assert mine == theirs, f"{rid}: {key} {mine} against the row's {theirs}"
    if isinstance(layout.get("etp"), int):
        assert strategy.expert_tp == layout["etp"]
    mbs = layout.get("mbs", layout.get("micro_batch"))
    if isinstance(mbs, int) and not isinstance(mbs, bool):
        assert strategy.micro_batch == mbs
    if isinstance(layout.get("fsdp"), int) and layout["fsdp"] > 1:
        assert strategy.zero == 3
    count = layout.get("gpus", row.get("hardware", {}).get("count", row.get("gpus")))
    if isinstance(count, int):
        assert run.devices == count
    if isinstance(layout.get("global_batch"), int):  # a table whose batch changes with its rows' sequence length
        assert run.global_batch == layout["global_batch"]
    if isinstance(row.get("seq"), int):
        assert run.seq_len == row["seq"]
    if isinstance(row.get("global_batch", row.get("batch")), int):
        assert run.global_batch == row.get("global_batch", row.get("batch"))


@pytest.mark.parametrize("rid", sorted(RUNS))
def test_each_run_measures_what_its_row_measured(rid):
    """The figure a run is read from is the row's own: its step time, or else its tokens per second."""
    run = RUNS[rid]
    row = RAW[run.source.split("#")[1].split(" (")[0]]
    m, d = row.get("measured", {}), row.get("derived", {})
    tokens = run.global_batch * run.seq_len / run.devices
    step = m.get("step_s", d.get("step_s", row.get("iter_s")))
    given = m.get("tokens_per_s_per_gpu", m.get("tokens_per_s_per_npu"))
    if run.id in ALSO:  # another layout of the same table: the figure kept for it
        assert run.measured_step_s == m["also"][ALSO[run.id]]["step_s"]
    elif "(" in run.source:  # a variant of the row (another schedule or overlap): its own figure
        assert run.measured_step_s > 0
    elif SHIPPED_MEASURED[rid] == "step_s" and isinstance(step, (int, float)):
        assert run.measured_step_s == pytest.approx(step, rel=1e-3)
    elif SHIPPED_MEASURED[rid] == "tokens_per_s_per_device":
        assert tokens / run.measured_step_s == pytest.approx(given, rel=1e-6)
    else:  # a row that gives TFLOP/s: test_calibration.py's A100 runs check the FLOP count behind it
        assert not isinstance(step, (int, float)) and not isinstance(given, (int, float))
        assert run.measured_step_s > 0


def test_every_spec_reads_a_row_that_exists():
    for rid, spec in SPECS.items():
        assert spec.get("row", rid) in RAW, rid


def test_a_table_in_tflops_reads_as_the_step_times_its_formula_gives():
    """NeMo's long-sequence table gives TFLOP/s a GPU; each run's step time is the row's batch x sequence times NeMo's
    model FLOPs a token (its llama2 formula, attention counted whole) over the TFLOP/s times the GPUs."""
    row = RAW["nemo2403-longseq-llama2-7b-h100-fp8"]
    m = row["model"]
    L, h, ffn, V = m["L"], m["h"], m["ffn"], m["vocab"]
    for key, layout in ((k, v) for k, v in row["layout"].items() if isinstance(v, dict)):
        s = int(key[:-1]) * 1024
        flops = L * h * h * (12 + 12 + 18 * ffn / h + 12 * s / h + 6 * V / (L * h))  # MHA: query groups = heads
        step = layout["global_batch"] * s * flops / (row["measured"][key]["tflops_per_gpu_with_cp"] * 1e12
                                                     * layout["gpus"])
        run = RUNS[f"nemo2403-longseq-llama2-7b-{key.lower()}-h100-fp8"]
        assert run.measured_step_s == pytest.approx(step, rel=1e-4)
