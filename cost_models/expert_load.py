"""How much more routed work the busiest expert-parallel rank gets than the average one.

A dropless MoE layer waits for its slowest rank: the dispatch and combine
are collectives over the expert-parallel group and the next layer needs
every token back, so the rank whose experts drew the most tokens sets the
pace of the routed part (its grouped GEMMs, its activation, its share of
the exchange). With a router forced to balance (Megatron-Core's
--moe-router-force-load-balancing, the benchmarks' setting) every rank
gets the mean; with a learned router (an auxiliary loss or a bias that only
pulls towards balance) expert loads spread.

Model: each expert's share of the routed tokens has a coefficient of
variation `cv` across experts; a rank holds `experts / ep` of them, drawn
independently, so its load varies by cv * sqrt(ep / experts) around the
mean; the busiest of `ep` ranks sits at the expected maximum of `ep`
standard normals above it. That maximum is taken by Blom's formula,
Phi^-1((n - 0.375) / (n + 0.25)) (G. Blom, Statistical Estimates and
Transformed Beta-Variables, 1958; within 0.03 of the exact expectation for
n = 2..64: 0.589 against 0.564 at n = 2, 1.434 against 1.424 at n = 8).
One rank (ep = 1) holds every expert: no spread.

Token dropping caps it: a layer with capacity factor c keeps at most c
times the mean on any expert, so no rank does more than c times its mean
(Lepikhin et al. 2021, GShard, section 2.2; Megatron-Core's
--moe-expert-capacity-factor).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist


def expected_max_normal(n: int) -> float:
    """Expected maximum of `n` independent standard normals (Blom's approximation; 0 for n = 1)."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    if n == 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


@functools.lru_cache(maxsize=None)  # a costing asks it per routed op and kept tensor: a few (ep, E) pairs
def load_imbalance(ep: int, experts: int, cv: float, capacity_factor: float = 0.0) -> float:
    """Busiest rank's routed load over the mean, for `experts` experts spread over `ep` ranks whose per-expert
    loads vary with coefficient of variation `cv` (0: balanced); capped at `capacity_factor` when tokens beyond
    it are dropped (0: dropless)."""
    if cv < 0 or not math.isfinite(cv):
        raise ValueError(f"an expert-load coefficient of variation must be >= 0, got {cv!r}")
    if capacity_factor < 0 or not math.isfinite(capacity_factor):
        raise ValueError(f"a capacity factor must be >= 0 (0: dropless), got {capacity_factor!r}")
    ranks = max(1, min(int(ep), int(experts))) if experts > 0 else 1
    spread = cv * math.sqrt(ranks / experts) if experts > 0 else 0.0
    factor = 1.0 + spread * expected_max_normal(ranks)
    return min(factor, capacity_factor) if capacity_factor > 0 else factor


__all__ = ["expected_max_normal", "load_imbalance"]
