"""`hyperplan hardware list|show` through typer's CliRunner."""

from __future__ import annotations

import json
import re

import typer
from typer.testing import CliRunner

from cli import hardware_cmd

app = typer.Typer()


@app.callback()
def _root() -> None:
    """Test root."""


hardware_cmd.register(app)
runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def test_list_shows_every_preset():
    result = runner.invoke(app, ["hardware", "list"], env=ENV)
    assert result.exit_code == 0, result.output
    for name in ("ascend-910b", "cloudmatrix384", "dgx-a100", "dgx-h100", "gb200-nvl72"):
        assert name in result.output
    rows = json.loads(runner.invoke(app, ["hardware", "list", "--json"], env=ENV).output)
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
    sizes = {r["name"]: r["n_devices"] for r in rows}
    assert (sizes["gb200-nvl72"], sizes["cloudmatrix384"], sizes["cloudmatrix384-die"]) == (72, 384, 768)


def test_list_says_how_far_off_each_preset_came_out():
    """Beside each preset, its held-out runs as its file records them, or whose fit it carries."""
    from cost_models import load_cluster

    out = runner.invoke(app, ["hardware", "list"], env=ENV).output
    h = load_cluster("dgx-h100").checked("moe_training")
    line = next(x for x in out.splitlines() if x.startswith("dgx-h100") and "%" in x)
    assert f"{100 * h.mean:.1f} % ({h.runs}, {100 * h.max:.1f} %)" in line
    assert re.search(r"^cloudmatrix384 .*- \(ascend-910b's fit\)", out, re.M)
    rows = {r["name"]: r for r in json.loads(runner.invoke(app, ["hardware", "list", "--json"], env=ENV).output)}
    assert rows["dgx-h100"]["held_out"]["moe_training"] == {"runs": h.runs, "mean_abs_error": h.mean,
                                                            "max_abs_error": h.max}
    assert rows["cloudmatrix384"]["held_out"] == {} and rows["cloudmatrix384"]["transferred_from"] == "ascend-910b"


def test_show_scales_and_prints_json_deterministically():
    args = ["hardware", "show", "dgx-a100", "--devices", "1024", "--json"]
    first = runner.invoke(app, args, env=ENV)
    assert first.exit_code == 0, first.output
    data = json.loads(first.output)
    assert data["n_devices"] == 1024 and data["levels"][1]["groups"] == 1
    assert data["levels"][0]["groups"] == 128 and data["levels"][0]["bandwidth_bytes_per_s"] == 300e9
    assert runner.invoke(app, args, env=ENV).output == first.output
    table = runner.invoke(app, ["hardware", "show", "cloudmatrix384"], env=ENV)
    assert table.exit_code == 0 and "pooled-dram" in table.output and "supernode" in table.output


def test_show_says_whether_the_efficiency_is_this_hardwares_fit_or_carried_from_another():
    """Issue 13: a preset without its own fit says so in `hardware show` (as every estimate on it does)."""
    own = runner.invoke(app, ["hardware", "show", "dgx-h100"], env=ENV)
    carried = runner.invoke(app, ["hardware", "show", "cloudmatrix384"], env=ENV)
    assert own.exit_code == 0 and carried.exit_code == 0
    from cost_models import load_cluster

    fitted = len(load_cluster("dgx-h100").fitted_on)  # every other published row, at most half (15 of 30)
    assert fitted >= 10 and f"efficiency calibration: fitted on {fitted} measured runs" in own.output
    assert "efficiency calibration: transferred from the ascend-910b fit (an assumption" in carried.output
    # and what checks its estimates is what an estimate on it says: the 910B fit's held-out runs

    source = load_cluster("ascend-910b").checked("moe_training").sentence("ascend-910b", shipped=True)
    assert (f"checked: no held-out MoE training run on cloudmatrix384: how far off its estimates are is unchecked "
            f"(its efficiency is ascend-910b's fit, with {source})") in " ".join(carried.output.split())


def test_show_says_where_the_flash_attention_figures_come_from():
    """Measured on this chip (H100: cuDNN's benchmark on H200, the same die, and the FlashAttention-3 paper's), or
    carried from another and said to be; with the length at which each kernel reaches half its plateau."""
    measured = runner.invoke(app, ["hardware", "show", "dgx-h100"], env=ENV)
    carried = runner.invoke(app, ["hardware", "show", "dgx-b200"], env=ENV)
    assert measured.exit_code == 0 and carried.exit_code == 0
    flat = " ".join(measured.output.split())
    assert "flash attention (plateau share of the bf16 peak, forward/backward): cudnn 0.722/0.627" in flat
    assert "half of it at 407/607 keys per query" in flat
    line = flat.split("flash attention")[1]  # its one assumption: MLA's heads, timed on H200 deterministic only
    assert "; measured: cudnn by cuDNN 9.19 on H200" in line and "heads wider than 128 at 1/0.877" in line
    assert line.count("ASSUMPTION") == 1 and "ASSUMPTION (heads wider than 128): MLA's rate" in line
    assert "; ASSUMPTION: GB200's measured cuDNN figures" in " ".join(carried.output.split())
    as_json = json.loads(runner.invoke(app, ["hardware", "show", "dgx-b200", "--json"], env=ENV).output)
    assert as_json["efficiency"]["attention_basis"].startswith("ASSUMPTION")
    assert as_json["efficiency"]["attention_wide_heads"] == {"forward": 1.0, "backward": 0.9}


def test_every_estimate_on_borrowed_attention_figures_says_so():
    from cost_models import load_cluster

    from planner.caveats import assumptions
    from planner.costing.execution import load_execution
    from planner.strategy import Workload

    work = Workload(global_batch=8, seq_len=1024)
    said = [a for a in assumptions(load_cluster("dgx-b200"), work) if "flash attention" in a]
    assert len(said) == 1 and said[0].startswith("dgx-b200's flash attention efficiency (cudnn): GB200's measured cuDNN")
    assert not [a for a in assumptions(load_cluster("dgx-h100"), work) if "flash attention" in a]
    # GB200's cudnn figures are measured, its flash2 (torchtitan's kernel) carried from H100: said for that one
    titan = Workload(global_batch=8, seq_len=1024, execution=load_execution("torchtitan"))
    assert not [a for a in assumptions(load_cluster("gb200-nvl72"), work) if "flash attention" in a]
    assert [a for a in assumptions(load_cluster("gb200-nvl72"), titan) if "flash attention" in a]


def test_an_estimate_with_narrow_heads_says_how_they_are_costed():
    """Head dim 64 on a device with the fitted head-dim law (H100): nothing to say; with the law carried (GB200,
    twice H200's D): that clause; without one (A100): that they run at head dim 128's rate. Head dim 128: silent."""
    from cost_models import load_cluster

    from planner.caveats import assumptions
    from planner.strategy import Workload

    work = Workload(global_batch=8, seq_len=1024)

    def heads(hw: str, dims) -> list[str]:
        return [a for a in assumptions(load_cluster(hw), work, dims) if "head dim" in a]

    assert heads("dgx-h100", {64.0}) == [] and heads("gb200-nvl72", {128.0}) == []
    assert heads("gb200-nvl72", {64.0, 128.0}) == [
        "gb200-nvl72's flash attention at head dim 64: the head-dim law at twice H200's D (Blackwell's tensor cores "
        "do twice Hopper's FLOPs per clock beside the same exponential rate)"]
    (a100,) = heads("dgx-a100", {64.0})
    assert a100.startswith("dgx-a100 has no flash-attention figures below head dim 128: heads of 64 are costed")
    b200 = [a for a in assumptions(load_cluster("dgx-b200"), work, {64.0}) if "flash attention" in a]
    assert len(b200) == 2 and "head dims under 128" not in b200[0]  # the kernel's clause and the heads' apart
    (mla,) = heads("dgx-a100", {160.0})  # MLA's 192/128 heads: measured on H200 and GB200, not on A100
    assert mla.startswith("dgx-a100 has no flash-attention figures above head dim 128: heads of 160 are costed at "
                          "head dim 128's rate (cuDNN runs MLA's 192/128 heads at 0.88x of it backward on H200")
    assert heads("dgx-h100", {160.0}) == [
        "dgx-h100's flash attention at head dim 160: MLA's rate (192/128) measured by cuDNN 9.19 on H200, timed there "
        "only with a deterministic backward (on GB200 the two agree within 0.1 % on the mean), for every wider head"]


def test_an_fp8_estimate_says_when_it_costs_block_scaling_as_per_tensor():
    from dataclasses import replace

    from cost_models import load_cluster
    from planner.caveats import assumptions
    from planner.costing.execution import load_execution
    from planner.strategy import Workload

    core = load_execution("megatron-core")
    mx = Workload(global_batch=8, seq_len=1024, dtype="fp8", execution=replace(core, fp8_recipe="mxfp8"))
    said = [a for a in assumptions(load_cluster("gb200-nvl72"), mx) if "per-tensor FP8" in a]
    assert len(said) == 1 and said[0].startswith("mxfp8 GEMMs are costed as per-tensor FP8 ones")
    for work in (replace(mx, execution=core), replace(mx, dtype="bf16")):  # per-tensor FP8, or no FP8 at all
        assert not [a for a in assumptions(load_cluster("gb200-nvl72"), work) if "per-tensor FP8" in a]


def test_a_users_fit_under_a_presets_name_is_not_checked_by_the_shipped_runs(tmp_path):
    """`hyperplan calibrate --fit -o` keeps the preset's name. The shipped runs' and deployments' errors were
    computed with the preset's fit, so the file's `checked` lines neither point at them nor quote them."""
    from cost_models.loader import PRESET_DIR

    text = (PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8")
    mine = tmp_path / "my-h100.toml"
    mine.write_text(re.sub(r"(?m)^matmul_plateau = .*$", "matmul_plateau = 0.61", text), encoding="utf-8")
    preset = " ".join(runner.invoke(app, ["hardware", "show", "dgx-h100"], env=ENV).output.split())
    shown = runner.invoke(app, ["hardware", "show", str(mine)], env=ENV)
    assert shown.exit_code == 0, shown.output
    out = " ".join(shown.output.split())
    assert "(hyperplan calibrate --hardware dgx-h100)" in preset
    assert "hyperplan calibrate --hardware" not in out
    assert "checked (serving): published serving deployment" not in out
    assert ("checked (serving): this file's efficiency is not the shipped dgx-h100's: the published serving "
            "deployments were compared with the shipped fit, and none checks this one") in out


def test_a_file_without_efficiency_is_refused_not_shown_at_the_peak(tmp_path):
    """Without [efficiency] every curve would be 1: `hardware show` printed "matmul efficiency by FLOPs: 1" and an
    estimate under materialised attention ran every kernel at the peak."""
    from cost_models.loader import PRESET_DIR

    text = (PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8")
    path = tmp_path / "bare.toml"
    path.write_text(text[:text.index("\n[efficiency]") + 1], encoding="utf-8")
    shown = runner.invoke(app, ["hardware", "show", str(path)], env=ENV)
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    assert "bare.toml: efficiency: missing: without it every kernel would be costed at the device's peak" in \
        " ".join(shown.stderr.split())


def test_errors_are_one_line_and_exit_2(tmp_path):
    bad = runner.invoke(app, ["hardware", "show", "dgx-a100", "--devices", "12"], env=ENV)
    assert bad.exit_code == 2
    assert "error:" in bad.stderr and "a multiple of 8" in bad.stderr and "Traceback" not in bad.output
    path = tmp_path / "hw.toml"
    path.write_text('[cluster]\ndevices = "x"\n', encoding="utf-8")
    bad_file = runner.invoke(app, ["hardware", "show", str(path)], env=ENV)
    assert bad_file.exit_code == 2 and "hw.toml" in bad_file.stderr
    split = runner.invoke(app, ["hardware", "show", "cloudmatrix384", "--devices", "100"], env=ENV)
    assert split.exit_code == 2 and "(nearest: 96 or 104)" in split.stderr
    missing = runner.invoke(app, ["hardware", "show", "nope"], env=ENV)
    assert missing.exit_code == 2 and "unknown hardware 'nope'" in missing.stderr
