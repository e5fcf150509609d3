"""The overhead law behind the GEMM and memory curves, and every preset's curves against it.

Presets give the law's parameters (matmul_plateau, memory_plateau, kernel_overhead_us, and fp8_matmul_plateau
where FP8 runs were fitted); the loader samples the law at the device's own peaks. Fitted presets list the
runs they were fitted on, which must be shipped runs of that hardware and at most half of them.
"""

from __future__ import annotations

import math

import pytest

from cost_models import SpecError, load_cluster, preset_names
from cost_models.curves import EfficiencyCurve, half_decade_sizes, half_size, law_curve, overhead_law
from cost_models.loader import PRESET_DIR



# -- the law itself -------------------------------------------------------------------------------------

def test_law_reaches_half_its_plateau_at_n_half_and_the_plateau_when_large():
    n_half = half_size(1e15, 0.8, 1e-5)
    assert n_half == pytest.approx(8e9)
    assert overhead_law(n_half, 1e15, 0.8, 1e-5) == pytest.approx(0.4)
    assert overhead_law(1e20, 1e15, 0.8, 1e-5) == pytest.approx(0.8, rel=1e-9)
    # the same op time both ways: t0 + size / (plateau * peak) == size / (efficiency * peak)
    size = 3e9
    assert size / (overhead_law(size, 1e15, 0.8, 1e-5) * 1e15) == pytest.approx(1e-5 + size / 0.8e15)


@pytest.mark.parametrize("args, words", [
    ((0.0, 0.7, 1e-5), "positive peak rate, got 0.0"),
    ((1e15, 1.2, 1e-5), "plateau must lie in (0, 1], got 1.2"),
    ((1e15, 0.7, -1.0), "overhead must be a positive number of seconds, got -1.0"),
    ((float("nan"), 0.7, 1e-5), "positive peak rate"),
])
def test_law_refuses_bad_parameters(args, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        half_size(*args)


def test_half_decade_sizes_round_the_span_outward_to_the_grid():
    assert half_decade_sizes(1e9, (-1.0, 1.0)) == (1e8, 3.16e8, 1e9, 3.16e9, 1e10)
    # 10**9.36 * 10**-2.5 = 10**6.86 -> nearest half-decade 10**7; 10**12.86 -> 10**13
    assert half_decade_sizes(2.29e9, (-2.5, 3.5))[::12] == (1e7, 1e13)
    with pytest.raises(SpecError, match="low < high"):
        half_decade_sizes(1e9, (2.0, 1.0))
    with pytest.raises(SpecError, match="half-efficiency size"):
        half_decade_sizes(0.0, (-1.0, 1.0))


def test_law_curve_is_sampled_monotone_and_capped_at_the_plateau():
    curve = law_curve(2.5e15, 0.749, 9.8e-6, (-2.5, 3.5))
    n_half = half_size(2.5e15, 0.749, 9.8e-6)
    effs = [e for _, e in curve.points]
    assert effs == sorted(effs) and max(effs) == 0.749 and min(effs) >= 1e-3
    for s, e in curve.points:
        assert e == pytest.approx(overhead_law(s, 2.5e15, 0.749, 9.8e-6), abs=0.5e-3)
    assert curve(n_half) == pytest.approx(0.749 / 2, abs=0.02)  # interpolated in log(size) between samples


# -- every preset ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", preset_names())
def test_preset_curves_are_the_law_at_the_devices_own_peaks(name):
    """Sampled finely enough that interpolating in log(size) stays within 0.1% of the plateau of the law."""
    c = load_cluster(name)
    bf16 = c.device.peak_flops("bf16")
    for size in (1e8, 3e9, 1e11, 5e12):
        assert c.matmul_efficiency(size) == pytest.approx(
            overhead_law(size, bf16, c.matmul_plateau, c.kernel_overhead_s), abs=1e-3 * c.matmul_plateau)
    for size in (1e5, 3e7, 1e9):
        assert c.memory_efficiency(size) == pytest.approx(
            overhead_law(size, c.device.hbm_bytes_per_s, c.memory_plateau, c.kernel_overhead_s), abs=1e-3)
    if c.fp8_matmul_plateau is not None:
        fp8 = c.device.peak_flops("fp8")
        assert c.fp8_matmul_efficiency(1e12) == pytest.approx(
            overhead_law(1e12, fp8, c.fp8_matmul_plateau, c.kernel_overhead_s), abs=1e-3)


@pytest.mark.parametrize("name", preset_names())
def test_each_preset_says_where_its_efficiency_comes_from(name):
    """Fitted on at most half of its hardware's shipped runs, each one of them; otherwise an assumption."""
    from planner.calibration import read_runs

    c = load_cluster(name)
    assert c.calibration
    mine = {r.id for r in read_runs() if r.hardware == name and not r.never_fitted}  # the runs a fit may use
    if c.fitted:
        assert set(c.fitted_on) <= mine
        assert len(c.fitted_on) <= len(mine) / 2
    else:
        assert "assumption" in c.calibration and not mine


def test_a_faster_device_needs_bigger_ops_for_the_same_efficiency():
    """The same per-kernel overhead costs a faster device more: one 1e10-FLOP op on A100, H100 and B200."""
    effs = [overhead_law(1e10, peak, 0.75, 10e-6) for peak in (312e12, 989e12, 2250e12)]
    assert effs[0] > effs[1] > effs[2]


@pytest.mark.parametrize("size", [1e8, 1e9, 1e10, 1e11])
def test_a_package_op_matches_a_die_op_of_half_the_size(size):
    """cloudmatrix384 (2-die package) at 2s against cloudmatrix384-die at s: the law says equal."""
    package, die = load_cluster("cloudmatrix384"), load_cluster("cloudmatrix384-die")
    assert package.matmul_efficiency(2 * size) == pytest.approx(die.matmul_efficiency(size), abs=0.02)
    assert package.memory_efficiency(2 * size / 1e3) == pytest.approx(die.memory_efficiency(size / 1e3), abs=0.02)


def test_law_parameters_come_together_or_not_at_all(tmp_path):
    from cost_models import load_file

    text = (PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8")
    broken = tmp_path / "hw.toml"
    broken.write_text("\n".join(l for l in text.splitlines() if not l.startswith("kernel_overhead_us")) + "\n")
    with pytest.raises(SpecError, match="kernel_overhead_us: missing; the overhead law needs"):
        load_file(broken)


@pytest.mark.parametrize("name, reference", [("dgx-b200", "dgx-h100")])
def test_a_preset_fitted_on_fp8_runs_only_keeps_its_references_bf16_to_fp8_ratio(name, reference):
    """Its runs cannot pin the bf16 GEMM plateau, so the fit ties it to the fp8 one at the ratio its reference
    preset's fit measures (benchmarks/fit_presets.py TIED_TO), and the file says so."""
    c, ref = load_cluster(name), load_cluster(reference)
    ratio = ref.matmul_plateau / ref.fp8_matmul_plateau
    assert c.matmul_plateau == pytest.approx(ratio * c.fp8_matmul_plateau, abs=2e-3)
    assert "matmul_plateau" in c.not_fitted and reference in c.calibration


def test_a_tied_preset_with_a_16_bit_fit_run_fits_its_bf16_plateau_and_says_no_tie():
    """GB200's split fits DeepSeek-V3's BF16 run: the bf16 plateau is its own, and the file claims no ratio."""
    from planner.calibration import read_runs

    c, dtypes = load_cluster("gb200-nvl72"), {r.id: r.dtype for r in read_runs()}
    assert any(dtypes[i] == "bf16" for i in c.fitted_on)
    assert "matmul_plateau" not in c.not_fitted and "x fp8_matmul_plateau" not in c.calibration
