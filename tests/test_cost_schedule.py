"""Pipeline bubbles and step times, equal and unequal stages, with p2p."""

from __future__ import annotations

import pytest

from cost_models.schedule import bubble_fraction, pipeline_time


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (8, 64), (35, 280)])
def test_bubble_fraction(p, m):
    assert bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / m)
    assert bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / m)
    assert bubble_fraction("interleaved", p, m, virtual_stages=3) == pytest.approx((p - 1) / (3 * m))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_equal_stages_match_the_bubble_fraction(schedule):
    p, m, f, b = 4, 8, 1.0, 2.0
    v = 2 if schedule == "interleaved" else 1
    t = pipeline_time([f] * p, [b] * p, m, schedule, virtual_stages=v)
    assert t.busy_s == pytest.approx(m * (f + b))
    assert t.bubble_s / t.busy_s == pytest.approx(bubble_fraction(schedule, p, m, v))
    assert t.total_s == pytest.approx((m + (p - 1) / v) * (f + b))
    assert t.p2p_s == 0.0


def test_unequal_stages_the_slowest_dominates():
    fwd, bwd = [1.0, 2.0, 1.0], [2.0, 4.0, 2.0]
    t = pipeline_time(fwd, bwd, 4)
    assert t.total_s == pytest.approx(3 * 6 + (3 + 6 + 3))  # (m-1) * max + fill/drain of every stage
    assert t.busy_s == pytest.approx(4 * 6)
    gpipe = pipeline_time(fwd, bwd, 4, "gpipe")
    assert gpipe.total_s == pytest.approx(3 * (2 + 4) + 12)
    long = pipeline_time(fwd, bwd, 1000)
    assert long.total_s / 1000 == pytest.approx(6.0, rel=0.01)


def test_p2p_is_charged_per_micro_batch_and_kept_apart():
    fwd, bwd, m, c = [1.0, 1.0, 1.0, 1.0], [2.0] * 4, 8, 0.1
    t = pipeline_time(fwd, bwd, m, p2p_s=c)
    assert t.p2p_s == pytest.approx(2 * c * (m - 1 + 4))
    assert t.total_s == pytest.approx(t.busy_s + t.bubble_s + t.p2p_s)
    inter = pipeline_time(fwd, bwd, m, "interleaved", virtual_stages=2, p2p_s=c)
    assert inter.p2p_s == pytest.approx(2 * 2 * c * (m - 1 / 2 + 4 / 2))  # v sends each way per micro-batch
    assert pipeline_time([1.0], [2.0], m, p2p_s=c).p2p_s == 0.0  # one stage sends nothing


def test_one_stage_has_no_bubble():
    t = pipeline_time([1.5], [3.0], 16)
    assert t.total_s == pytest.approx(16 * 4.5) and t.bubble_s == pytest.approx(0.0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="divisible"):
        pipeline_time([1.0] * 4, [1.0] * 4, 6, "interleaved", virtual_stages=2)
    with pytest.raises(ValueError):
        pipeline_time([1.0, 1.0], [1.0], 4)
    with pytest.raises(ValueError):
        bubble_fraction("zigzag", 2, 2)
