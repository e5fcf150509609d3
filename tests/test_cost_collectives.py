"""Collectives over placed groups: the alpha-beta formulas by hand, and hierarchy beating a flat ring."""

from __future__ import annotations

import math

import pytest

from cost_models import load_cluster, place_group
from cost_models.collectives import (
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    collective_s,
    reduce_scatter_s,
    ring_all_reduce_s,
    send_recv_s,
    tree_all_reduce_s,
)
from cost_models.loader import parse_cluster

B1, B2 = 200e9, 20e9  # bytes/s per device per direction
A1, A2 = 2e-6, 10e-6  # seconds per step


def _cluster(levels: list[dict], devices: int):
    """A test cluster with bus efficiency 1 unless a level says otherwise."""
    return parse_cluster({
        "cluster": {"devices": devices},
        "device": {"name": "d", "hbm_gib": 64, "hbm_bandwidth_gb_s": 1000, "peak_tflops": {"bf16": 100}},
        "levels": levels,
        "efficiency": {"matmul": 1.0, "memory": 1.0},  # stated: these tests time collectives alone
    }, source="test.toml", default_name="test")


def _level(name, bw, lat, algorithm="ring", size=None, **extra):
    lvl = {"name": name, "bandwidth_gb_s": bw / 1e9, "latency_us": lat * 1e6, "algorithm": algorithm, **extra}
    if size is not None:
        lvl["group_size"] = size
    return lvl


FLAT = _cluster([_level("flat", B1, A1)], devices=16)
TWO = _cluster([_level("node", B1, A1, size=8), _level("net", B2, A2)], devices=128)


@pytest.mark.parametrize("n", [2, 4, 16])
@pytest.mark.parametrize("size_bytes", [1e3, 1e6, 3.3e8])
def test_ring_all_reduce_on_one_flat_level(n, size_bytes):
    spans = place_group(FLAT, n)
    expected = 2 * (n - 1) / n * size_bytes / B1 + 2 * (n - 1) * A1
    assert all_reduce_s(size_bytes, spans) == pytest.approx(expected, rel=1e-12)
    gather = (n - 1) / n * size_bytes / B1 + (n - 1) * A1
    assert all_gather_s(size_bytes, spans) == pytest.approx(gather, rel=1e-12)
    assert reduce_scatter_s(size_bytes, spans) == pytest.approx(gather, rel=1e-12)


def test_hierarchical_all_reduce_by_hand_and_beating_the_flat_ring():
    spans = place_group(TWO, 64)  # 8 in a node x 8 nodes
    s = 1e9
    rs_node = 7 / 8 * s / B1 + 7 * A1
    ar_net = 2 * 7 / 8 * (s / 8) / B2 + 2 * 7 * A2
    assert all_reduce_s(s, spans, "hierarchical") == pytest.approx(2 * rs_node + ar_net, rel=1e-12)
    flat = 2 * 63 / 64 * s / B2 + 2 * 63 * A2  # one ring, held to the slow level
    assert all_reduce_s(s, spans, "flat") == pytest.approx(flat, rel=1e-12)
    assert all_reduce_s(s, spans, "hierarchical") < 0.25 * flat
    assert all_reduce_s(s, spans) == min(flat, all_reduce_s(s, spans, "hierarchical"))


def test_hierarchical_gather_moves_only_a_shard_across_the_slow_level():
    spans = place_group(TWO, 64)
    s = 1e9
    expected = (7 / 8 * s / B1 + 7 * A1) + (7 / 8 * s / 8 / B2 + 7 * A2)
    assert all_gather_s(s, spans, "hierarchical") == pytest.approx(expected, rel=1e-12)
    assert reduce_scatter_s(s, spans, "hierarchical") == pytest.approx(expected, rel=1e-12)


def test_inside_one_fast_level_all_schemes_agree():
    spans = place_group(TWO, 8)
    assert [s.level.name for s in spans] == ["node"]
    values = {all_reduce_s(5e7, spans, scheme) for scheme in ("auto", "flat", "hierarchical")}
    assert len(values) == 1


def test_presets_prefer_hierarchy_for_data_parallel_across_nodes():
    c = load_cluster("dgx-a100", devices=1024)
    spans = place_group(c, 1024)
    assert all_reduce_s(2e9, spans, "hierarchical") < 0.5 * all_reduce_s(2e9, spans, "flat")


def test_tree_wins_small_messages_on_many_devices_and_loses_large_ones():
    n, b, a = 256, 25e9, 5e-6
    assert tree_all_reduce_s(1e4, n, b, a) < ring_all_reduce_s(1e4, n, b, a)
    assert tree_all_reduce_s(1e9, 16, b, a) > ring_all_reduce_s(1e9, 16, b, a)
    assert tree_all_reduce_s(1e6, n, b, a) == pytest.approx(2 * 1e6 / b + 2 * 8 * a)
    tree = _cluster([_level("net", b, a, algorithm="tree")], devices=n)
    assert all_reduce_s(1e6, place_group(tree, n)) == pytest.approx(2 * 1e6 / b + 2 * 8 * a)


def test_in_network_and_direct_levels():
    s, n = 1e8, 8
    nvls = _cluster([_level("sw", B1, A1, algorithm="in_network")], devices=n)
    assert all_reduce_s(s, place_group(nvls, n)) == pytest.approx(s / B1 + 2 * A1)
    assert all_gather_s(s, place_group(nvls, n)) == pytest.approx(7 / 8 * s / B1 + A1)
    direct = _cluster([_level("mesh", B1, A1, algorithm="direct")], devices=n)
    assert all_reduce_s(s, place_group(direct, n)) == pytest.approx(2 * (7 / 8 * s / B1 + A1))


def test_bus_efficiency_slows_small_messages():
    curve = [[1e4, 0.25], [1e8, 1.0]]
    c = _cluster([_level("flat", B1, 0.0, bus_efficiency=curve)], devices=8)
    spans = place_group(c, 8)
    assert all_reduce_s(1e4, spans) == pytest.approx(2 * 7 / 8 * 1e4 / (0.25 * B1))
    assert all_reduce_s(1e8, spans) == pytest.approx(2 * 7 / 8 * 1e8 / B1)
    mid = all_reduce_s(1e6, spans) / (2 * 7 / 8 * 1e6 / B1)
    assert mid == pytest.approx(1 / 0.625)  # efficiency halfway in log space


def test_full_mesh_splits_bandwidth_over_peer_links():
    c = load_cluster("ascend-910b")
    hccs = c.level("hccs")
    pair = place_group(c, 2)
    assert pair[0].bandwidth_bytes_per_s == pytest.approx(hccs.bandwidth_bytes_per_s / 7)
    assert place_group(c, 8)[0].bandwidth_bytes_per_s == hccs.bandwidth_bytes_per_s
    s = 1e9
    expected = hccs.latency_s + s / (hccs.bandwidth_bytes_per_s / 7 * hccs.bus_efficiency(s))
    assert send_recv_s(s, pair) == pytest.approx(expected)


def test_all_to_all_charges_each_level_its_share():
    s = 1e9
    one = place_group(FLAT, 16)
    assert all_to_all_s(s, one) == pytest.approx(15 / 16 * s / B1 + A1)
    spans = place_group(TWO, 32)  # 8 per node x 4 nodes
    expected = (A1 + s * 7 / 32 / B1) + (A2 + s * 24 / 32 / B2)
    assert all_to_all_s(s, spans) == pytest.approx(expected)
    assert collective_s("all_to_all", s, spans) == all_to_all_s(s, spans)


def test_send_recv_uses_the_outermost_level_crossed():
    s = 5e7
    assert send_recv_s(s, place_group(TWO, 2, stride=1)) == pytest.approx(A1 + s / B1)
    assert send_recv_s(s, place_group(TWO, 2, stride=8)) == pytest.approx(A2 + s / B2)


def test_degenerate_cases_cost_nothing_and_bad_sizes_are_refused():
    assert all_reduce_s(1e9, ()) == 0.0
    assert all_reduce_s(0.0, place_group(TWO, 64)) == 0.0
    assert all_to_all_s(1e9, ()) == 0.0 and send_recv_s(1e9, ()) == 0.0
    with pytest.raises(ValueError):
        all_reduce_s(-1.0, place_group(TWO, 8))


def test_times_grow_with_message_size_and_are_deterministic():
    c = load_cluster("cloudmatrix384", devices=1536)
    spans = place_group(c, 128, stride=12)
    sizes = [10.0 ** k for k in range(3, 11)]
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        times = [collective_s(kind, s, spans) for s in sizes]
        assert all(math.isfinite(t) and t > 0 for t in times)
        assert times == sorted(times)
        assert times == [collective_s(kind, s, place_group(c, 128, stride=12)) for s in sizes]
