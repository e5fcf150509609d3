"""Runners-up the estimate cannot tell from the plan: within the hardware's held-out mean |error| of its step."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from planner.calibration.published import ranking_error
from planner.errors import InvalidInput
from planner.hypershard.io import check_schema
from planner.plan import close_calls

runner = CliRunner()
MOE = {"category": "moe_training", "runs": 11, "mean_abs_error": 0.10}
#: A small MoE plan on DGX H100 (Qwen3-30B-A3B cut to 4 layers) whose runners-up are close
PLAN = ["plan", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "16", "--global-batch", "64", "--seq-len", "1024",
        "--set", "layers=4"]


def _up(summary: str, step: float | None, fits: bool = True) -> dict:
    return {"summary": summary, "step_time_s": step, "fits": fits}


def test_only_fitting_runners_up_inside_the_band_are_named():
    ups = [_up("a", 10.9), _up("b", 11.0), _up("c", 11.2), _up("d", 10.5, fits=False), _up("e", None)]
    out = close_calls(ups, 10.0, MOE, "dgx-h100")
    assert out["runners_up"] == ["a", "b"]  # 11.0 is the edge of a 10 % band; 11.2 is outside it
    assert out["band"] == 0.10 and out["held_out_mean"] == 0.10 and out["ranking_median"] is None
    assert out["sentence"].startswith("2 runners-up within 10.0 % of the plan's step")
    assert "dgx-h100's 11 held-out MoE training runs; an assumption" in out["sentence"]


def test_the_measured_ranking_error_widens_the_band_when_it_is_larger():
    ups = [_up("a", 10.9), _up("b", 11.4), _up("c", 11.6)]
    ranking = {"category": "moe_training", "pairs": 9, "median_error": 0.15, "max_error": 0.34}
    out = close_calls(ups, 10.0, MOE, "dgx-h100", ranking)
    assert out["runners_up"] == ["a", "b"] and out["band"] == 0.15
    assert "median error of the estimated ratio between two MoE training layouts" in out["sentence"]
    assert "over 9 pairs" in out["sentence"] and "assumption" not in out["sentence"]
    narrow = close_calls(ups, 10.0, MOE, "dgx-h100", ranking | {"median_error": 0.02})
    assert narrow["band"] == 0.10 and narrow["runners_up"] == ["a"]


def test_nothing_is_said_without_a_measured_error_or_a_close_runner_up():
    ups = [_up("a", 10.5)]
    assert close_calls(ups, 10.0, None, "x") is None  # serving: no training accuracy
    assert close_calls(ups, 10.0, {"category": "dense_training", "runs": 0}, "x") is None  # no held-out run
    assert close_calls([_up("a", 12.0)], 10.0, MOE, "x") is None
    assert close_calls([], 10.0, MOE, "x") is None
    one = close_calls(ups, 10.0, MOE, "x")
    assert one["sentence"].startswith("1 runner-up within")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`plan -o`: its text output and the declaration it wrote."""
    path = tmp_path_factory.mktemp("close") / "plan.yaml"
    res = runner.invoke(app, PLAN + ["-o", str(path)])
    assert res.exit_code == 0, res.output
    return res.output, path


def test_a_moe_plan_on_dgx_h100_names_its_close_runners_up_by_the_presets_held_out_error(written):
    """The band is the preset's own held-out MoE figure, and the text output (of the run that writes the file) says
    what the JSON says."""
    res = runner.invoke(app, PLAN + ["--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    held = load_cluster("dgx-h100").checked("moe_training")
    assert held is not None and out["accuracy"]["mean_abs_error"] == pytest.approx(held.mean)
    ranking = ranking_error("moe_training")
    assert ranking is not None and ranking["pairs"] >= 5
    band = max(held.mean, ranking["median_error"])
    step = out["estimate"]["step_time_s"]
    within = [r["summary"] for r in out["runners_up"]
              if r["fits"] and r["step_time_s"] and r["step_time_s"] <= step * (1 + band)]
    assert within, [(r["summary"], r["step_time_s"], step) for r in out["runners_up"]]
    assert out["close_calls"]["runners_up"] == within and out["close_calls"]["band"] == pytest.approx(band)
    assert f"within {100 * band:.1f} % of the plan's step" in " ".join(written[0].split())


def test_the_declaration_keeps_the_close_calls_and_passes_its_schema(written):
    """`plan -o` writes them beside the runners-up; the schema takes them and `validate` accepts the file."""
    path = written[1]
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    close = doc["close_calls"]
    assert close["runners_up"] and set(close["runners_up"]) <= {r["summary"] for r in doc["runners_up"]}
    check_schema(doc, "plan.yaml")
    with pytest.raises(InvalidInput, match="close_calls"):
        check_schema(doc | {"close_calls": {"band": 0.1}}, "plan.yaml")  # no runners-up, no sentence
    res = runner.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
