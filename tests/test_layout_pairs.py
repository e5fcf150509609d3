"""Layout pairs: runs of one table measuring one job in two strategies, the estimated ratio against the measured."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from planner.calibration.layout_pairs import ratio_error

runner = CliRunner()
#: Korthikanti et al. 2022, Table 5: the 22B model on 8 A100s, full recompute against selective recompute with SP
BASE = {"category": "dense_training", "hardware": "dgx-a100", "devices": 8, "model": "gpt",
        "overrides": {"hidden": 6144, "layers": 48, "heads": 64, "vocab": 51200}, "seq_len": 2048, "global_batch": 4,
        "dtype": "bf16", "stack": "megatron-2021"}
FULL = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 4, "recompute": "full", "sp": False, "zero": 0}
SELECTIVE = FULL | {"recompute": "selective", "sp": True}


def _row(rid: str, strategy: dict, step_s: float, **extra) -> dict:
    return BASE | {"id": rid, "source": "Korthikanti 2022 Table 5", "strategy": strategy,
                   "measured": {"step_s": step_s}} | extra


def test_the_error_is_the_ratio_of_ratios_either_way():
    assert ratio_error(1.0, 1.25) == pytest.approx(0.25)
    assert ratio_error(1.25, 1.0) == pytest.approx(0.25)
    assert ratio_error(0.8, 1.0) == pytest.approx(0.25)
    assert ratio_error(1.3, 1.3) == 0.0


def test_calibrate_pairs_the_runs_of_one_table_only(tmp_path):
    """Two strategies in one table make one pair, its measured ratio the file's; the same layout measured in
    another table, and a run of the same strategy under another stack setting, pair with nothing."""
    rows = [_row("full", FULL, 1.42, table="paper"), _row("sel", SELECTIVE, 1.10, table="paper"),
            _row("sel-elsewhere", SELECTIVE, 1.20, table="our cluster"),
            _row("full-elsewhere-eager", FULL, 1.50, table="our cluster", execution={"fuse_elementwise": False})]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"about": "test", "runs": rows}), encoding="utf-8")
    res = runner.invoke(app, ["calibrate", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    found = out["layout_pairs"]["pairs"]
    assert [(p["a"], p["b"]) for p in found] == [("full", "sel"), ("sel-elsewhere", "full-elsewhere-eager")]
    first, second = found
    assert first["measured_ratio"] == pytest.approx(1.10 / 1.42)  # tokens/s: the inverse of the steps' ratio
    predicted = {r["id"]: r["predicted_step_s"] for r in out["runs"]}
    assert first["estimated_ratio"] == pytest.approx(predicted["sel"] / predicted["full"])
    assert first["differs"] == "layout" and second["differs"] == "layout + stack"
    assert first["error"] == pytest.approx(ratio_error(first["measured_ratio"], first["estimated_ratio"]))
    text = runner.invoke(app, ["calibrate", str(path)])
    assert text.exit_code == 0
    assert "layout pairs" in text.output


def test_a_table_that_is_not_a_string_is_refused(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"about": "test", "runs": [_row("full", FULL, 1.42, table=5)]}), encoding="utf-8")
    res = runner.invoke(app, ["calibrate", str(path)])
    assert res.exit_code != 0
    assert "table must name the set of measurements" in res.output
    assert "Traceback" not in res.output
