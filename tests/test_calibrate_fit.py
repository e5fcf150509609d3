"""`hyperplan calibrate --fit`: fitting a hardware file on measured runs, as a user fits one to their cluster.

The A100 preset was fitted on five of the 2021-22 Megatron-LM rows (its `fitted_on`); fitting it again on
them from the shipped file must give the shipped plateau, and the fit must start from the text it is handed
(benchmarks/fit_presets.py hands it a reset copy, and a dry run must not touch the installed preset).
"""

from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from cost_models.loader import PRESET_DIR
from planner.calibration import read_runs
from planner.calibration.fit import fit
from planner.calibration.predict import Predictor
from planner.calibration.report import calibrate_runs
from planner.errors import InvalidInput

pytestmark = pytest.mark.calibration

A100 = PRESET_DIR / "dgx-a100.toml"


def _efficiency(text: str) -> dict:
    return tomllib.loads(text)["efficiency"]


@pytest.fixture(scope="module")
def a100_runs():
    return [r for r in read_runs() if r.hardware == "dgx-a100"]


def test_refitting_the_a100_preset_on_its_rows_gives_the_shipped_plateau(tmp_path):
    shipped = _efficiency(A100.read_text(encoding="utf-8"))
    out = tmp_path / "a100.toml"
    res = CliRunner().invoke(app, ["calibrate", "--hardware", "dgx-a100", "--fit", ",".join(shipped["fitted_on"]),
                                   "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    fitted = _efficiency(out.read_text(encoding="utf-8"))
    assert fitted["matmul_plateau"] == pytest.approx(shipped["matmul_plateau"], abs=0.002)
    report = json.loads(res.output)
    assert all(abs(r["error"]) < 0.05 for r in report["runs"])  # the A100 rows, fit and held-out, within 5 %
    # beside the fit, the file records how far off the runs it left out came out: what its estimates then say
    held = [r for r in report["runs"] if r["group"] == "held-out"]
    errors = [abs(r["error"]) for r in held]
    assert fitted["held_out"] == {"dense_training": [len(held), round(100 * sum(errors) / len(errors), 1),
                                                     round(100 * max(errors), 1)]}
    assert load_cluster(str(out)).checked("dense_training").runs == len(held) == 6
    # the written file is the user's now: a second fit does not replace it without --force
    before = out.read_text(encoding="utf-8")
    again = CliRunner().invoke(app, ["calibrate", "--hardware", "dgx-a100", "--fit", shipped["fitted_on"][0],
                                     "-o", str(out)])
    assert again.exit_code != 0 and "--force" in again.output
    assert out.read_text(encoding="utf-8") == before


def test_a_value_the_fit_leaves_at_its_bound_is_said(tmp_path):
    """Three copies of an 8-GPU Llama-3-8B FP8 row at TP 1, 2 and 4 measured faster than the model can make them:
    the FP8 plateau ends at 1.0, the top of its range, and had been written without a word (QA of 2026-12-07)."""
    row = next(r.raw for r in read_runs() if r.id == "nemo2407-llama3-8b-8-h100-fp8")
    rows = []
    for i, (tp, tps) in enumerate([(1, 12000), (2, 11000), (4, 9000)]):
        x = json.loads(json.dumps(row))
        x.update(id=f"my-{i}", measured={"tokens_per_s_per_device": tps})
        x.pop("table", None)
        x["strategy"] = {k: v for k, v in x["strategy"].items() if k != "dp"} | {"tp": tp}
        rows.append(x)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"runs": rows}))
    res = CliRunner().invoke(app, ["calibrate", str(path), "--fit", "my-0,my-1", "--json"])
    assert res.exit_code == 0, res.output
    fitted = json.loads(res.output)["fit"]
    assert fitted["values"]["fp8_matmul_plateau"] == 1.0 and fitted["at_bound"] == ["fp8_matmul_plateau"]
    # the written file keeps the preset's name, but not its fit: the shipped runs' errors are not its to cite
    from planner.api import estimate_model

    mine = tmp_path / "mine.toml"
    text = CliRunner().invoke(app, ["calibrate", str(path), "--fit", "my-0,my-1", "-o", str(mine)],
                              terminal_width=200)
    assert text.exit_code == 0, text.output
    assert "warning: fp8_matmul_plateau 1: at the end of the range the fit allows" in " ".join(text.output.split())
    job = dict(devices=8, global_batch=128, seq_len=8192, dtype="fp8", cp=2, zero=1)
    assert "published" in estimate_model("llama3-8b", cluster="dgx-h100", **job)["accuracy"]
    assert "published" not in estimate_model("llama3-8b", cluster=str(mine), **job)["accuracy"]


def test_the_fit_starts_from_the_text_it_is_given(a100_runs, shared_graphs):
    """A start text whose memory plateau (which five runs do not fit) differs from the installed one: the fit takes
    the text's value, makes up for the slower memory-bound ops with a higher GEMM plateau, and the written file
    keeps the value (fitted on the graphs the calibration tests built: half of a fit's time is building them)."""
    installed = A100.read_text(encoding="utf-8")
    ids = _efficiency(installed)["fitted_on"]
    start = installed.replace("memory_plateau = 0.741", "memory_plateau = 0.5")
    assert start != installed
    res = calibrate_runs(a100_runs, fit=ids, start_text=start, predictor=Predictor(graphs=shared_graphs))
    assert "memory_plateau" not in res.fit.values  # not fitted: the text decides it
    assert _efficiency(res.fitted_text)["memory_plateau"] == 0.5
    # the installed text's fit on the same runs gives the shipped plateau (the refit test above, within 0.002)
    assert res.fit.values["matmul_plateau"] > _efficiency(installed)["matmul_plateau"] + 0.007


def test_a_dry_run_of_fit_presets_writes_no_file(capsys):
    """benchmarks/fit_presets.py --dry-run fits and prints, and leaves every preset and stack file as it was (it
    used to reset a preset's file while fitting it, which a benchmark run beside it would read)."""
    from benchmarks import fit_presets
    from planner.costing.execution import STACK_DIR

    files = sorted(PRESET_DIR.glob("*.toml")) + sorted(STACK_DIR.glob("*.toml"))
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    assert fit_presets.main(["--dry-run", "dgx-h200"]) == 0
    assert "dgx-h200: fitted on 1 of 2 runs" in capsys.readouterr().out
    assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files} == before


def test_grand_teton_takes_its_overlap_from_the_dgx_h100_fit_and_says_so():
    """Grand Teton's runs barely pin its overlap efficiency (benchmarks/CALIBRATION.md), so benchmarks/fit_presets.py
    holds it at DGX H100's fitted value: the file carries that value, lists it as not fitted on its own runs, and names
    where it came from."""
    from benchmarks import fit_presets

    values, note = fit_presets.shared_values("h100-grand-teton", {})
    gt = _efficiency((PRESET_DIR / "h100-grand-teton.toml").read_text(encoding="utf-8"))
    h100 = _efficiency((PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8"))
    assert gt["overlap"] == h100["overlap"] and "overlap" not in h100["not_fitted"] and "overlap" in gt["not_fitted"]
    assert values == {"overlap": gt["overlap"]} and note in gt["calibration"]  # the file says where it came from
    assert note.startswith("ASSUMPTION") and "dgx-h100's fit" in note


def test_dgx_b300_fits_its_fp8_plateau_alone_and_says_where_the_rest_came_from():
    """DGX B300's runs are all MoE, its 16-bit ones all GPT-OSS: benchmarks/fit_presets.py fits its FP8 GEMM plateau
    on them and holds its overheads, overlap and BF16 plateau at DGX B200's (benchmarks/CALIBRATION.md: DGX B300). The
    file carries B200's values, lists them as not fitted, names where they came from; its FP8 plateau is fitted, and
    above B200's, as the two DGX systems' paired rows measure."""
    from benchmarks import fit_presets

    values, note = fit_presets.shared_values("dgx-b300", {})
    b300 = _efficiency((PRESET_DIR / "dgx-b300.toml").read_text(encoding="utf-8"))
    b200 = _efficiency((PRESET_DIR / "dgx-b200.toml").read_text(encoding="utf-8"))
    assert values == {k: b200[k] for k in ("host_overhead_us", "kernel_overhead_us", "overlap", "matmul_plateau")}
    assert all(b300[k] == v and k in b300["not_fitted"] for k, v in values.items())
    assert note in b300["calibration"] and note.startswith("ASSUMPTION") and "dgx-b200's fit" in note
    assert "fp8_matmul_plateau" not in b300["not_fitted"] and b300["fp8_matmul_plateau"] > b200["fp8_matmul_plateau"]


def test_dgx_h200_is_dgx_h100s_die_and_torchtitans_share_is_the_stacks():
    """H200 SXM is H100 SXM's die at the same peaks and power: benchmarks/fit_presets.py gives DGX H200 every value
    of DGX H100's fit the die sets (benchmarks/CALIBRATION.md), so a Megatron-Core step costs the same GEMMs on both,
    and what torchtitan's step gives of the die, fitted on the H200 runs (its only ones), is written into the torchtitan
    stack as its kernel efficiency, which Grand Teton's fit (also torchtitan's) comes after."""
    from benchmarks import fit_presets
    from planner.costing.execution import load_execution

    values, note = fit_presets.shared_values("dgx-h200", {})
    h200 = _efficiency((PRESET_DIR / "dgx-h200.toml").read_text(encoding="utf-8"))
    h100 = _efficiency((PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8"))
    die = ("matmul_plateau", "fp8_matmul_plateau", "kernel_overhead_us", "host_overhead_us", "overlap")
    assert values == {k: h100[k] for k in die} and all(h200[k] == h100[k] and k in h200["not_fitted"] for k in die)
    assert note in h200["calibration"] and "dgx-h100's fit" in note
    torchtitan, megatron = load_execution("torchtitan"), load_execution("megatron-core")
    assert 0.5 < torchtitan.kernel_efficiency < 1.0 and megatron.kernel_efficiency == 1.0
    assert fit_presets.reference_depth("dgx-h200") < fit_presets.reference_depth("h100-grand-teton")


def test_references_are_fitted_before_the_presets_that_take_their_values():
    """A preset that takes values from another's fit (TIED_TO, SHARED_FROM) is fitted after it, however long the
    chain: DGX B300 takes DGX B200's, which takes DGX H100's; DGX A100 its host issue from DGX H100's."""
    from benchmarks import fit_presets

    depth = fit_presets.reference_depth
    assert depth("dgx-h100") == 0 < depth("dgx-a100")
    assert depth("dgx-h100") < depth("dgx-b200") < depth("dgx-b300")
    for hw, (ref, _, _) in fit_presets.SHARED_FROM.items():
        assert depth(ref) < depth(hw), hw


def test_a_fit_that_rewrites_a_stack_refits_the_presets_that_run_it_after_it():
    """Fitting DGX H200 rewrites torchtitan's kernel efficiency, which Grand Teton's runs use: a fit of DGX H200 fits
    Grand Teton after it (a dry run, which writes nothing, does not); a fit of Grand Teton alone does not pull in
    DGX H200, and the order puts references first whatever order they were asked in."""
    from benchmarks import fit_presets

    runs = {"dgx-h100", "dgx-h200", "h100-grand-teton", "dgx-a100"}
    assert fit_presets.fit_order(["dgx-h200"], runs) == ["dgx-h200", "h100-grand-teton"]
    assert fit_presets.fit_order(["dgx-h200"], runs, dry_run=True) == ["dgx-h200"]
    assert fit_presets.fit_order(["h100-grand-teton"], runs) == ["h100-grand-teton"]
    assert fit_presets.fit_order(["h100-grand-teton", "dgx-h200", "dgx-h100"], runs) == \
        ["dgx-h100", "dgx-h200", "h100-grand-teton"]


def test_holding_every_parameter_the_runs_could_pin_or_an_unknown_one_is_refused(a100_runs):
    with pytest.raises(InvalidInput, match="every parameter these runs could pin is held"):
        fit(a100_runs[:2], load_cluster("dgx-a100"), held=("matmul_plateau",))
    with pytest.raises(InvalidInput, match="cannot hold overlap_efficiency"):
        fit(a100_runs[:2], load_cluster("dgx-a100"), held=("overlap_efficiency",))


def test_a_runs_file_none_of_whose_runs_can_be_predicted_is_an_error(tmp_path):
    run = {"id": "my-run", "category": "dense_training", "hardware": "dgx-h100", "devices": 8, "model": "llama3-9b",
           "seq_len": 4096, "global_batch": 64, "dtype": "bf16", "stack": "megatron-core",
           "strategy": {"dp": 8, "micro_batch": 1, "zero": 1, "recompute": "none"},
           "measured": {"step_s": 5.0}}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [run, run | {"id": "my-other-run"}]}), encoding="utf-8")
    res = CliRunner().invoke(app, ["calibrate", str(path)])
    assert res.exit_code == 2 and "no run could be predicted: my-run: no file or zoo model named 'llama3-9b'" in \
        res.output and "(and 1 more run)" in res.output and "Traceback" not in res.output


def test_an_empty_runs_file_and_an_empty_fit_are_said_as_such(tmp_path):
    """QA of 2026-12-07: an empty runs list had read "no run has ;", and --fit "" with -o asked for --fit."""
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": []}), encoding="utf-8")
    res = CliRunner().invoke(app, ["calibrate", str(path)])
    assert res.exit_code == 2 and "the runs file holds no run; add rows to its 'runs' list" in res.output, res.output
    res = CliRunner().invoke(app, ["calibrate", "--fit", "", "-o", str(tmp_path / "x.toml")])
    assert res.exit_code == 2 and "--fit '' names no run" in res.output, res.output
    assert not (tmp_path / "x.toml").exists()
