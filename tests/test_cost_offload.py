"""Transfers to memory tiers, the prefetch timeline, and overlap of communication with compute."""

from __future__ import annotations

import pytest

from cost_models import load_cluster
from cost_models.offload import exposed_transfer_s, prefetch_timeline, transfer_s
from cost_models.overlap import exposed_dp_reduction_s, exposed_s


def test_transfer_over_a_tier():
    tier = load_cluster("dgx-a100").tier("host")
    n = 1e9
    assert transfer_s(n, tier) == pytest.approx(tier.latency_s + n / (16e9 * 0.8))
    assert transfer_s(0, tier) == 0.0
    window = 0.05
    assert exposed_transfer_s(n, tier, window) == pytest.approx(transfer_s(n, tier) - window)
    assert exposed_transfer_s(n, tier, 1.0) == 0.0


def test_pooled_memory_on_a_supernode_is_faster_than_pcie():
    cm = load_cluster("cloudmatrix384").tier("pooled-dram")
    a100 = load_cluster("dgx-a100").tier("host")
    assert cm.pooled and transfer_s(1e9, cm) < transfer_s(1e9, a100)


def test_prefetch_depth_zero_is_serial():
    fetch, compute = [1.0, 2.0, 0.5], [3.0, 1.0, 2.0]
    t = prefetch_timeline(fetch, compute, depth=0)
    assert t.total_s == pytest.approx(sum(fetch) + sum(compute))
    assert t.exposed_s == pytest.approx(sum(fetch))


@pytest.mark.parametrize(("x", "c"), [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0)])
def test_prefetch_of_equal_layers(x, c):
    n = 10
    t = prefetch_timeline([x] * n, [c] * n, depth=1)
    assert t.total_s == pytest.approx(x + c + (n - 1) * max(x, c))
    assert t.exposed_s == pytest.approx(t.total_s - n * c)


def test_deeper_prefetch_absorbs_uneven_layers():
    fetch, compute = [1.0] * 4, [4.0, 0.1, 0.1, 0.1]
    assert prefetch_timeline(fetch, compute, depth=1).total_s == pytest.approx(7.1)  # worked by hand
    assert prefetch_timeline(fetch, compute, depth=3).total_s == pytest.approx(5.3)
    assert prefetch_timeline([], [], depth=2).total_s == 0.0
    with pytest.raises(ValueError):
        prefetch_timeline([1.0], [1.0, 2.0])


def test_exposed_communication():
    assert exposed_s(10.0, 4.0) == pytest.approx(6.0)
    assert exposed_s(3.0, 4.0) == 0.0
    assert exposed_s(3.0, 4.0, tail_s=0.5) == pytest.approx(0.5)
    assert exposed_s(3.0, 4.0, efficiency=0.5) == pytest.approx(1.0)
    assert exposed_s(1.0, 0.0, tail_s=5.0) == pytest.approx(1.0)  # never more than the transfer
    with pytest.raises(ValueError):
        exposed_s(1.0, 1.0, efficiency=1.5)


def test_dp_reduction_overlaps_backward_at_the_clusters_efficiency():
    c = load_cluster("dgx-a100")
    assert c.dp_overlap_efficiency == 0.8
    assert exposed_dp_reduction_s(c, 10.0, 10.0) == pytest.approx(2.0)
    assert exposed_dp_reduction_s(c, 1.0, 10.0, last_bucket_s=0.2) == pytest.approx(0.2)
