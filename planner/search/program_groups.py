"""How HyperMPMD programs share a cluster: group sizes, each group's share of the batch, and the
pipeline between two programs.

Three rules, each a physical fact rather than a tuning knob:

- **Granularity.** A group may end anywhere the fabric does not get slower. On
  CloudMatrix384 the UB fabric is a non-blocking two-tier Clos whose
  inter-node bandwidth is within 3% of the intra-node one, with under 1 us of
  added latency (Zuo et al., arXiv 2506.12708, section 3): a group of 12 NPUs
  costs what a group of 16 does, so node boundaries are not group boundaries
  there. Where the next level is materially slower (NVLink inside a DGX,
  InfiniBand between them) groups stay whole inner groups.
- **Uneven batches.** A group whose data-parallel degree does not divide the
  global batch gives some replicas one sample more; the slowest replica sets
  the pace, so the program is timed on the batch rounded up to a multiple of
  its group (pessimistic: a replica with fewer samples is charged as full).
- **Two-program pipeline.** The programs hand micro-batches to each other:
  a two-machine flow shop of identical jobs, whose makespan is
  m * max(a, b) + min(a, b) for per-job times a, b (Johnson 1954, Naval
  Research Logistics Quarterly 1(1)). In training each job is forward then,
  in reverse order, backward, so the non-bottleneck program's time for one
  hand-over unit is exposed once (its forward at the start, its backward at
  the end): fill = min(T_a, T_b) / units. The hand-over unit is the coarser
  of the two programs' micro-batches: a program cannot start a micro-batch
  before all its samples arrived.
"""

from __future__ import annotations

import math
from dataclasses import replace

from cost_models import Cluster
from cost_models.spec import fits_hierarchy

from planner.strategy import Workload

#: A level at least this fast as the one inside it is the same fabric: crossing it costs no more.
FLAT_FABRIC = 0.95
#: Group sizes finer than this fraction of the cluster move the balance by a few percent at most.
FINEST_SHARE = 1 / 32


def group_unit(cluster: Cluster) -> int:
    """Devices a program group is made of whole multiples of: the largest inner group a slower level joins."""
    unit = 1
    levels = cluster.levels
    for inner, outer in zip(levels, levels[1:]):
        size = inner.group_size
        if size is None or size >= cluster.n_devices:
            break
        if outer.bandwidth_bytes_per_s < FLAT_FABRIC * inner.bandwidth_bytes_per_s:
            unit = size
    return unit


def group_cluster(cluster: Cluster, n_devices: int) -> Cluster:
    """The cluster a program sees on its group of `n_devices`.

    A count the hierarchy takes as it is (whole nodes) is the cluster scaled; a count that ends inside a
    node is valid only where that node's level is as fast as the next one (see `group_unit`): the two
    levels are merged into one with the outer level's figures (the slower bandwidth, the longer latency),
    which can only overcharge the group's collectives."""
    if fits_hierarchy(cluster.levels, n_devices):
        return cluster.scaled(n_devices)
    levels = list(cluster.levels)
    merged = [lvl for lvl, nxt in zip(levels, levels[1:]) if lvl.group_size is None
              or nxt.bandwidth_bytes_per_s < FLAT_FABRIC * lvl.bandwidth_bytes_per_s]
    merged.append(levels[-1])
    return replace(cluster, levels=tuple(merged), n_devices=n_devices)


def group_sizes(cluster: Cluster) -> list[int]:
    """Device counts the first of two programs may take (the second takes the rest).

    Multiples of `group_unit`, no finer than 1/32 of the cluster (rounded to a power-of-two multiple of
    the unit, so the counts keep the factors of two batches usually have)."""
    n = cluster.n_devices
    unit = group_unit(cluster)
    if n % unit:
        return []
    step = unit * 2 ** max(0, math.floor(math.log2(max(1.0, n * FINEST_SHARE / unit))))
    return [c for c in range(step, n, step) if (n - c) % unit == 0]


def group_workload(workload: Workload, n_devices: int) -> Workload:
    """The workload a group of `n_devices` is timed on: the global batch rounded up to a multiple of the group.

    Rounding up to the group (not to its data-parallel degree) keeps every mesh of the group valid: all
    divisors of n divide a multiple of n. A degree that divides the batch loses nothing."""
    gb = workload.global_batch
    if gb % n_devices == 0:
        return workload
    return replace(workload, global_batch=n_devices * math.ceil(gb / n_devices))


def pipeline_fill_s(time_a_s: float, units_a: int, time_b_s: float, units_b: int) -> float:
    """Exposed time of a two-program pipeline beyond the slower program (see the module docstring)."""
    units = max(1, min(units_a, units_b))
    return min(time_a_s, time_b_s) / units
