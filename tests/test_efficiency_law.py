"""The overhead law behind the matmul and memory curves, and every preset's curves against it.

dgx-a100.toml holds the fitted table (benchmarks/fit_calibration.py); the other presets carry the same
law and parameters with their own peaks (benchmarks/efficiency_curves.py). These tests tie the two
together: the generator reproduces the fitted table, and every preset follows the law to rounding.
"""

from __future__ import annotations

import math

import pytest

from benchmarks import efficiency_curves as gen
from cost_models import SpecError, load_cluster, preset_names
from cost_models.curves import EfficiencyCurve, half_decade_sizes, half_size, law_curve, overhead_law
from cost_models.loader import PRESET_DIR

ROUNDING = 0.5e-3  # the presets store efficiencies to 3 decimals
A100_T0_ROUNDING = 1.001e-3  # one unit of the 3rd decimal: the fit sampled its table before printing t0 as 9.8 us


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
        assert e == pytest.approx(overhead_law(s, 2.5e15, 0.749, 9.8e-6), abs=ROUNDING)
    assert curve(n_half) == pytest.approx(0.749 / 2, abs=0.02)  # interpolated in log(size) between samples


# -- the generator against the fitted A100 table ---------------------------------------------------------

def test_generator_reproduces_the_fitted_a100_table():
    """Same sizes, and every efficiency within the rounding of t0 to 9.8 us: the stated parameters are A100's."""
    a100 = load_cluster(gen.FITTED_PRESET)
    for stored, generated in zip((a100.matmul_efficiency, a100.memory_efficiency), gen.curves_for(a100)):
        assert [s for s, _ in generated.points] == [s for s, _ in stored.points]
        for (_, e_gen), (_, e_fit) in zip(generated.points, stored.points):
            assert e_gen == pytest.approx(e_fit, abs=A100_T0_ROUNDING)


def test_a100_is_never_a_generated_preset():
    assert gen.FITTED_PRESET not in gen.transferred_presets()
    assert sorted(gen.transferred_presets() + [gen.FITTED_PRESET]) == preset_names()


# -- every preset ----------------------------------------------------------------------------------------

def _law_through(curve: EfficiencyCurve) -> tuple[float, float]:
    """(plateau, n_half) of p s / (s + n) through the last point and the one nearest half of it (well conditioned)."""
    s1, e1 = curve.points[-1]
    s2, e2 = min(curve.points, key=lambda p: abs(p[1] - e1 / 2))
    n_half = (e1 - e2) / (e2 / s2 - e1 / s1)
    return e1 * (s1 + n_half) / s1, n_half


@pytest.mark.parametrize("name", preset_names())
@pytest.mark.parametrize("which, peak_of", [
    ("matmul_efficiency", lambda c: c.device.peak_flops(gen.MATMUL_DTYPE)),
    ("memory_efficiency", lambda c: c.device.hbm_bytes_per_s),
])
def test_preset_curves_follow_the_law(name, which, peak_of):
    """Monotone, <= plateau, on one saturating law, and that law's t0 is the A100 fit's, with this device's peak."""
    cluster = load_cluster(name)
    curve = getattr(cluster, which)
    effs = [e for _, e in curve.points]
    assert effs == sorted(effs)
    plateau, n_half = _law_through(curve)
    assert 0 < plateau <= 1 and n_half > 0
    assert max(effs) <= plateau + ROUNDING
    for s, e in curve.points:
        assert e == pytest.approx(max(1e-3, plateau * s / (s + n_half)), abs=1.5e-3)
    t0_s = n_half / (plateau * peak_of(cluster))
    assert t0_s == pytest.approx(gen.OVERHEAD_S, rel=0.05)
    assert plateau == pytest.approx(gen.MATMUL_PLATEAU if which.startswith("matmul") else gen.MEMORY_PLATEAU,
                                    abs=2e-3)
    # the table spans the knee: it starts far below half the plateau and ends on the plateau
    assert effs[0] < 0.02 and effs[-1] >= plateau - 2e-3


@pytest.mark.parametrize("name", gen.transferred_presets())
def test_transferred_presets_are_exactly_the_generators_output(name):
    """The files are regenerated, not hand-edited, and say what they assume."""
    cluster = load_cluster(name)
    matmul, memory = gen.curves_for(cluster)
    assert cluster.matmul_efficiency.points == matmul.points
    assert cluster.memory_efficiency.points == memory.points
    text = (PRESET_DIR / f"{name}.toml").read_text(encoding="utf-8")
    assert "transferred unchanged: no published runs\n# of this hardware were available to fit." in text


def test_a_faster_device_needs_bigger_ops_for_the_same_efficiency():
    """The point of regenerating: one 1e10-FLOP matmul is less efficient on H100 and GB200 than on A100."""
    effs = [load_cluster(n).matmul_efficiency(1e10) for n in ("dgx-a100", "dgx-h100", "gb200-nvl72")]
    assert effs[0] > effs[1] > effs[2]
    for name in preset_names():
        assert load_cluster(name).matmul_efficiency(1e14) == pytest.approx(gen.MATMUL_PLATEAU, abs=1e-3)


@pytest.mark.parametrize("size", [1e8, 1e9, 1e10, 1e11])
def test_a_package_op_matches_a_die_op_of_half_the_size(size):
    """cloudmatrix384 (2-die package) at 2s against cloudmatrix384-die at s: the law says equal."""
    package, die = load_cluster("cloudmatrix384"), load_cluster("cloudmatrix384-die")
    assert package.matmul_efficiency(2 * size) == pytest.approx(die.matmul_efficiency(size), abs=0.02)
    assert package.memory_efficiency(2 * size / 1e3) == pytest.approx(die.memory_efficiency(size / 1e3), abs=0.02)


# -- the script ------------------------------------------------------------------------------------------

def test_check_passes_on_the_bundled_presets(capsys):
    assert gen.main(["--check"]) == 0
    assert capsys.readouterr().err == ""


def test_rewrite_replaces_only_the_curves_and_is_idempotent():
    text = (PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8")
    stale = text.replace("[3.16e7, 0.003]", "[3.16e7, 0.03]")
    block = gen.efficiency_block("dgx-h100")
    fixed = gen.rewritten(stale, block, "dgx-h100.toml")
    assert fixed == text and gen.rewritten(fixed, block, "dgx-h100.toml") == fixed
    assert fixed.endswith("dp_overlap = 0.8\n")
    with pytest.raises(SpecError, match=r"dgx-h100.toml: no \[efficiency\] table"):
        gen.rewritten(text.replace("[efficiency]", "[other]"), block, "dgx-h100.toml")


def test_check_reports_a_stale_preset(monkeypatch, capsys):
    monkeypatch.setattr(gen, "MATMUL_PLATEAU", 0.7)
    assert gen.main(["--check", "--preset", "dgx-h100"]) == 1
    assert "curves differ from the law in: dgx-h100" in capsys.readouterr().err
    assert math.isclose(load_cluster("dgx-h100").matmul_efficiency.points[-1][1], 0.749)
