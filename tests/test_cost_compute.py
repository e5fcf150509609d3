"""Roofline op times with efficiency curves, and the curves themselves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models import EfficiencyCurve, SpecError, load_cluster
from cost_models.compute import op_time, op_time_s, roofline_s


def test_roofline_takes_the_slower_roof():
    assert roofline_s(1e12, 1e6, peak_flops_per_s=1e14, hbm_bytes_per_s=1e12) == pytest.approx(1e-2)
    assert roofline_s(1e6, 1e12, peak_flops_per_s=1e14, hbm_bytes_per_s=1e12) == pytest.approx(1.0)
    half = roofline_s(1e12, 0, peak_flops_per_s=1e14, hbm_bytes_per_s=1e12, flops_efficiency=0.5)
    assert half == pytest.approx(2e-2)
    memory_only = roofline_s(1e15, 1e9, peak_flops_per_s=None, hbm_bytes_per_s=1e12, memory_efficiency=0.5)
    assert memory_only == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        roofline_s(-1, 0, peak_flops_per_s=1.0, hbm_bytes_per_s=1.0)


def test_matmul_time_uses_the_clusters_efficiency_by_size():
    c = load_cluster("dgx-a100")
    flops = 2 * 8192**3  # a large square GEMM: compute bound
    bytes_moved = 3 * 8192**2 * 2
    t = op_time(c, flops, bytes_moved)
    assert t.bound == "compute"
    assert t.time_s == pytest.approx(flops / (312e12 * c.matmul_efficiency(flops)))
    small = 2 * 256**3
    assert small / op_time_s(c, small, 3 * 256**2 * 2) < 0.2 * flops / t.time_s  # small GEMMs run far below peak


def test_elementwise_ops_are_memory_bound_and_dtype_peaks_are_checked():
    c = load_cluster("dgx-h100")
    n = 1e8
    t = op_time(c, 5 * n, 4 * n, kind="elementwise")
    assert t.bound == "memory"
    assert t.time_s == pytest.approx(4 * n / (3350e9 * c.memory_efficiency(4 * n)))
    assert t.compute_s == pytest.approx(5 * n / 67e12)
    # the Ascend presets' vector peaks are their AI Vector cores' lanes at fp32 (bf16 elementwise math runs there):
    # 48 AIV per die at 1.8 GHz (910B) or 1.85 GHz (910C), 64 fp32 lanes each, two dies per 910C
    for name, cores, hz in (("ascend-910b", 48, 1.8e9), ("cloudmatrix384-die", 48, 1.85e9),
                            ("cloudmatrix384", 96, 1.85e9)):
        vector = load_cluster(name).device.vector_flops_per_s
        assert vector == pytest.approx(cores * hz * 64, rel=0.01), name
    cm = load_cluster("cloudmatrix384")
    assert op_time(cm, 1e13, 1e6, kind="elementwise").bound == "compute"  # math-heavy on the vector units
    assert op_time(cm, 1e8, 1e9, kind="elementwise").bound == "memory"  # a plain elementwise op: HBM
    unknown = replace(cm, device=replace(cm.device, vector_flops_per_s=None))
    assert op_time(unknown, 1e12, 1e6, kind="elementwise").compute_s == 0.0  # unknown vector peak: memory roof only
    assert op_time_s(c, 1e12, 0, dtype="fp8") < op_time_s(c, 1e12, 0, dtype="bf16")
    with pytest.raises(SpecError, match="A100-SXM4-80GB lists no fp8 peak; use one of"):
        op_time_s(load_cluster("dgx-a100"), 1e12, 0, dtype="fp8")
    with pytest.raises(ValueError):
        op_time_s(c, 1.0, 1.0, kind="conv")


def test_curve_interpolates_in_log_size_and_clamps():
    curve = EfficiencyCurve(points=((1e6, 0.2), (1e8, 0.6)))
    assert curve(1e7) == pytest.approx(0.4)
    assert curve(10**6.5) == pytest.approx(0.3)
    assert curve(1.0) == 0.2 and curve(0.0) == 0.2 and curve(1e12) == 0.6
    assert EfficiencyCurve.constant(0.7)(123.0) == 0.7
    assert curve.scaled(2.0).points == ((1e6, 0.4), (1e8, 1.0))  # capped at 1


@pytest.mark.parametrize("points", [(), ((1e6, 0.5), (1e5, 0.6)), ((1e6, 0.0),), ((1e6, 1.5),), ((-1.0, 0.5),)])
def test_bad_curves_are_refused(points):
    with pytest.raises(SpecError):
        EfficiencyCurve(points=points)


def test_curves_are_hashable_values():
    a = EfficiencyCurve(points=((1.0, 0.5), (10.0, 0.9)))
    b = EfficiencyCurve(points=((1.0, 0.5), (10.0, 0.9)))
    assert a == b and hash(a) == hash(b)


def test_a_faster_dtype_needs_a_bigger_op_for_the_same_efficiency():
    """Without a measured fp8 curve, fp8 about doubles the peak: an op r times bigger (r = fp8 / bf16 peak) runs
    as long as the bf16 one (the same per-kernel overhead)."""
    import dataclasses

    c = dataclasses.replace(load_cluster("dgx-h100", devices=8), fp8_matmul_efficiency=None)
    r = c.device.peak_flops("fp8") / c.device.peak_flops("bf16")
    bf16 = op_time(c, 1e10, 0.0, "matmul", "bf16").compute_s
    fp8 = op_time(c, 1e10 * r, 0.0, "matmul", "fp8").compute_s
    assert fp8 == pytest.approx(bf16, rel=1e-9)
    assert op_time(c, 1e10, 0.0, "matmul", "fp8").compute_s > bf16 / 2


def test_a_measured_fp8_curve_is_read_at_the_fp8_peak():
    from cost_models.curves import overhead_law

    c = load_cluster("dgx-h100", devices=8)
    assert c.fp8_matmul_plateau is not None
    peak = c.device.peak_flops("fp8")
    expected = 1e12 / (peak * overhead_law(1e12, peak, c.fp8_matmul_plateau, c.kernel_overhead_s))
    assert op_time(c, 1e12, 0.0, "matmul", "fp8").compute_s == pytest.approx(expected, rel=2e-3)
