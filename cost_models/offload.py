"""Offload to a memory tier (host or pooled DRAM) and prefetch back, overlapped with compute.

A transfer of S bytes over a tier's link takes latency + S / (bandwidth *
efficiency(S)). Layer-by-layer prefetch (ZeRO-Offload/Infinity, Ren et al.
2021 and Rajbhandari et al. 2021; MindSpore's swap, HyperOffload) is a
two-stage pipeline: one copy engine fetches layer i while the device
computes an earlier layer, and at most `depth` layers are fetched ahead of the
one computing, so a fetch must wait for its buffer slot. The exact timeline
of that pipeline is a linear recurrence, computed here in O(layers):

  fetch_start[i]   = max(fetch_end[i-1], compute_end[i-1-depth])
  compute_start[i] = max(compute_end[i-1], fetch_end[i])

depth 0 is no prefetch (fetch, then compute, in turn); with equal layers
and depth >= 1 the total is fetch + compute + (n-1) * max(fetch, compute).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.overlap import exposed_s
from cost_models.spec import Cluster, MemoryTier


def offload_tier(cluster: Cluster) -> MemoryTier | None:
    """The tier what is offloaded goes to: the first pooled one, else the first at all (None: none)."""
    pooled = [t for t in cluster.memory_tiers if t.pooled]
    tiers = pooled or list(cluster.memory_tiers)
    return tiers[0] if tiers else None


def transfer_s(n_bytes: float, tier: MemoryTier) -> float:
    """One copy of `n_bytes` between HBM and `tier`, one direction."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
    if n_bytes == 0:
        return 0.0
    return tier.latency_s + n_bytes / (tier.bandwidth_bytes_per_s * tier.efficiency(n_bytes))


def exposed_transfer_s(n_bytes: float, tier: MemoryTier, overlap_window_s: float) -> float:
    """What a copy adds to the critical path when `overlap_window_s` of compute runs beside it."""
    return exposed_s(transfer_s(n_bytes, tier), overlap_window_s)


@dataclass(frozen=True, slots=True)
class PrefetchTimeline:
    """Total time of a fetch-and-compute sequence; exposed_s = total_s - compute_s."""

    total_s: float
    compute_s: float
    transfer_s: float

    @property
    def exposed_s(self) -> float:
        return self.total_s - self.compute_s


def prefetch_timeline(fetch_s: Sequence[float], compute_s: Sequence[float], depth: int = 1) -> PrefetchTimeline:
    """Timeline of layers that each fetch their data (fetch_s[i]) and then compute (compute_s[i])."""
    if len(fetch_s) != len(compute_s):
        raise ValueError(f"need one fetch time per layer: {len(fetch_s)} fetches, {len(compute_s)} layers")
    if depth < 0:
        raise ValueError(f"prefetch depth must be >= 0, got {depth}")
    if any(t < 0 for t in fetch_s) or any(t < 0 for t in compute_s):
        raise ValueError("fetch and compute times must be >= 0")
    fetch_end = 0.0
    compute_end: list[float] = []
    for i, (fetch, compute) in enumerate(zip(fetch_s, compute_s)):
        slot_free = compute_end[i - 1 - depth] if i - 1 - depth >= 0 else 0.0
        fetch_end = max(fetch_end, slot_free) + fetch
        start = max(compute_end[-1] if compute_end else 0.0, fetch_end)
        compute_end.append(start + compute)
    total = compute_end[-1] if compute_end else 0.0
    return PrefetchTimeline(total_s=total, compute_s=float(sum(compute_s)), transfer_s=float(sum(fetch_s)))
