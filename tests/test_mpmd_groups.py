"""How MPMD programs share a cluster: group granularity, uneven batches, the fill between two programs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import load_cluster, place_group
from cost_models.collectives import all_reduce_s
from planner.search.mpmd import balance_points
from planner.search.program_groups import (group_cluster, group_sizes, group_unit, group_workload,
                                           pipeline_fill_s)
from planner.strategy import Workload


@pytest.mark.parametrize("name, devices, unit", [
    ("cloudmatrix384", 64, 1),  # inter-node UB within 3% of intra-node: node boundaries are not group boundaries
    ("cloudmatrix384", 768, 384),  # RoCE between supernodes is
    ("cloudmatrix384-die", 128, 2),  # the two dies of a package share a faster link than UB
    ("dgx-h100", 64, 8),  # InfiniBand between NVLink nodes
    ("gb200-nvl72", 64, 1),
    ("gb200-nvl72", 144, 72),
])
def test_a_group_ends_where_the_fabric_gets_slower(name, devices, unit):
    cluster = load_cluster(name, devices=devices)
    assert group_unit(cluster) == unit
    sizes = group_sizes(cluster)
    assert sizes and all(c % unit == 0 and (devices - c) % unit == 0 for c in sizes)
    assert max(sizes) < devices and len(sizes) <= 47


def test_a_group_inside_a_node_is_costed_on_the_slower_merged_level():
    cm = load_cluster("cloudmatrix384", devices=64)
    g26 = group_cluster(cm, 26)
    assert g26.n_devices == 26 and [lvl.name for lvl in g26.levels] == ["supernode", "roce"]
    assert group_cluster(cm, 24) == cm.scaled(24)  # whole nodes: the cluster as it is
    # the merged level can only overcharge: an all-reduce over 24 devices costs more than on whole nodes
    merged = dataclasses.replace(cm, levels=g26.levels, n_devices=24)
    nbytes = 1e9
    assert all_reduce_s(nbytes, place_group(merged, 24)) >= all_reduce_s(nbytes, place_group(cm.scaled(24), 24))


def test_an_uneven_share_of_the_batch_is_timed_at_the_largest_replica():
    wl = Workload(global_batch=512, seq_len=1024)
    assert group_workload(wl, 64) is wl
    assert group_workload(wl, 48).global_batch == 528  # 11 samples on every replica (some have 10)
    assert group_workload(wl, 600).global_batch == 600  # more devices than samples: one each, some idle


def _simulate(a_f: float, a_b: float, b: float, m: int) -> float:
    """Makespan of m jobs: forward on A, forward + backward on B, backward on A (A runs a ready backward first)."""
    b_free = t_a = 0.0
    b_done: list[float] = []
    fwd_next, bwd_next = 0, 0
    while bwd_next < m:
        ready_b = bwd_next < len(b_done) and b_done[bwd_next] <= t_a
        if ready_b or fwd_next == m:
            t_a = max(t_a, b_done[bwd_next]) + a_b
            bwd_next += 1
        else:
            t_a += a_f
            start = max(b_free, t_a)
            b_free = start + b
            b_done.append(b_free)
            fwd_next += 1
    return t_a


@settings(max_examples=60, deadline=None)
@given(st.floats(0.1, 5.0), st.floats(0.1, 5.0), st.integers(1, 24))
def test_fill_is_the_faster_programs_unit_when_the_backbone_is_slower(a, b, m):
    """The two-program flow shop (Johnson 1954): m jobs through encoder forward, backbone, encoder backward."""
    a_f, a_b = a / 3, 2 * a / 3
    makespan = _simulate(a_f, a_b, b, m)
    fill = pipeline_fill_s(m * a, m, m * b, m)
    assert makespan <= m * max(a, b) + fill + 1e-9  # the formula never undercharges
    if b >= a:
        assert makespan == pytest.approx(m * b + fill)  # and is exact when the backbone sets the pace


def test_fill_counts_the_coarser_hand_over_unit():
    # 10 s and 12 s programs; 20 and 14 micro-batches: hand-over units are the 14 larger ones
    assert pipeline_fill_s(10.0, 20, 12.0, 14) == pytest.approx(10.0 / 14)


def test_balance_points_find_the_crossing_of_two_programs():
    n = 64
    sizes = list(range(2, 64, 2))

    def enc(c):  # 30% of the work, with a fixed cost that a purely inverse model misses
        return 0.3 * 100 / c + 0.02

    def llm(c):
        return 0.7 * 100 / c

    ks = balance_points(enc, lambda c: llm(n - c), sizes, n)
    best = min(range(len(sizes)), key=lambda k: max(enc(sizes[k]), llm(n - sizes[k])))
    assert best in ks and len(ks) <= 2
