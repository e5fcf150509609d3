"""Collective times over a group placed on the interconnect hierarchy (alpha-beta model).

Per level the cost is alpha per algorithm step plus bytes over the level's
bandwidth, scaled by its bus efficiency at that message size (Hockney's
alpha-beta model; the ring/tree step counts follow Thakur, Rabenseifner and
Gropp 2005, "Optimization of Collective Communication Operations in MPICH",
and NCCL's double binary trees, Sanders et al. 2009). `message_bytes` is
always the size of the full buffer on one device: the input of an
all-reduce or reduce-scatter, the output of an all-gather, what one device
holds before an all-to-all.

Across levels, "hierarchical" runs a reduce-scatter inside each inner level,
the collective across the outermost level on a 1/(inner participants) shard,
then an all-gather back (2D/hierarchical all-reduce, e.g. Jia et al. 2018,
Megatron's and HCCL's hierarchical algorithms); "flat" runs one ring through
all members, bottlenecked by the slowest level. "auto" takes the faster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from cost_models.placement import LevelSpan

Scheme = Literal["auto", "flat", "hierarchical"]
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


# --- one level, plain numbers -------------------------------------------------------------------

def ring_all_reduce_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce: 2(n-1) steps, each moving S/n: 2(n-1)/n * S/B + 2(n-1)*alpha (Thakur 2005)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * message_bytes / bandwidth_bytes_per_s + 2 * (n - 1) * latency_s


def ring_gather_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Ring all-gather or reduce-scatter of an S-byte buffer: (n-1)/n * S/B + (n-1)*alpha (Thakur 2005)."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * message_bytes / bandwidth_bytes_per_s + (n - 1) * latency_s


def tree_all_reduce_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Pipelined double binary tree: reduce up then broadcast down, 2*S/B + 2*ceil(log2 n)*alpha (Sanders 2009)."""
    if n <= 1:
        return 0.0
    return 2 * message_bytes / bandwidth_bytes_per_s + 2 * math.ceil(math.log2(n)) * latency_s


def direct_gather_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """One-shot all-gather / reduce-scatter: every device exchanges with all peers at once, (n-1)/n * S/B + alpha."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * message_bytes / bandwidth_bytes_per_s + latency_s


def in_network_all_reduce_s(
    message_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """Switch-side reduction: each device sends S up and receives the sum S down, S/B + 2*alpha
    (SHArP, Graham et al. 2016; NVLink SHARP in NCCL's NVLS algorithm)."""
    if n <= 1:
        return 0.0
    return message_bytes / bandwidth_bytes_per_s + 2 * latency_s


# --- one level of a placed group ------------------------------------------------------------------

def _level_s(kind: Collective, message_bytes: float, span: LevelSpan, n: int | None = None,
             bandwidth: float | None = None, latency_s: float | None = None) -> float:
    """One collective at one level with the level's algorithm. All-gather and reduce-scatter have no
    tree form (ring, as in NCCL); in-network levels run them one-shot, like direct."""
    n = span.participants if n is None else n
    bw = span.effective_bandwidth(message_bytes) if bandwidth is None else bandwidth
    alpha = span.level.latency_s if latency_s is None else latency_s
    algo = span.level.algorithm
    if kind == "all_reduce":
        if algo == "tree":
            return tree_all_reduce_s(message_bytes, n, bw, alpha)
        if algo == "direct":
            return 2 * direct_gather_s(message_bytes, n, bw, alpha)
        if algo == "in_network":
            return in_network_all_reduce_s(message_bytes, n, bw, alpha)
        return ring_all_reduce_s(message_bytes, n, bw, alpha)
    if algo in ("direct", "in_network"):
        return direct_gather_s(message_bytes, n, bw, alpha)
    return ring_gather_s(message_bytes, n, bw, alpha)


# --- a placed group -------------------------------------------------------------------------------

def _flat_s(kind: Collective, message_bytes: float, spans: Sequence[LevelSpan]) -> float:
    """One ring through all members: the slowest level's bandwidth, the largest alpha, the outer algorithm."""
    n = math.prod(s.participants for s in spans)
    bw = min(s.effective_bandwidth(message_bytes) for s in spans)
    alpha = max(s.level.latency_s for s in spans)
    return _level_s(kind, message_bytes, spans[-1], n=n, bandwidth=bw, latency_s=alpha)


def _hierarchical_s(kind: Collective, message_bytes: float, spans: Sequence[LevelSpan]) -> float:
    """Inner levels shard the buffer (reduce-scatter in, all-gather out); the outer level sees S / prod(inner)."""
    total = 0.0
    shard = message_bytes
    for span in spans[:-1]:
        phase = _level_s("reduce_scatter", shard, span)
        total += 2 * phase if kind == "all_reduce" else phase
        shard /= span.participants
    return total + _level_s(kind, shard, spans[-1])


def collective_s(kind: Collective, message_bytes: float, spans: Sequence[LevelSpan], scheme: Scheme = "auto") -> float:
    """Time of one collective of an S-byte buffer over a placed group; 0 for a group of one device."""
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")
    if not spans or message_bytes == 0:
        return 0.0
    if kind == "all_to_all":
        return all_to_all_s(message_bytes, spans)
    if scheme == "flat" or len(spans) == 1:
        return _flat_s(kind, message_bytes, spans)
    if scheme == "hierarchical":
        return _hierarchical_s(kind, message_bytes, spans)
    return min(_flat_s(kind, message_bytes, spans), _hierarchical_s(kind, message_bytes, spans))


def all_reduce_s(message_bytes: float, spans: Sequence[LevelSpan], scheme: Scheme = "auto") -> float:
    """All-reduce of an S-byte buffer (e.g. the DP gradient reduction)."""
    return collective_s("all_reduce", message_bytes, spans, scheme)


def all_gather_s(message_bytes: float, spans: Sequence[LevelSpan], scheme: Scheme = "auto") -> float:
    """All-gather whose output is S bytes per device (each contributes S/n)."""
    return collective_s("all_gather", message_bytes, spans, scheme)


def reduce_scatter_s(message_bytes: float, spans: Sequence[LevelSpan], scheme: Scheme = "auto") -> float:
    """Reduce-scatter of an S-byte input per device (each keeps S/n)."""
    return collective_s("reduce_scatter", message_bytes, spans, scheme)


def all_to_all_s(message_bytes: float, spans: Sequence[LevelSpan]) -> float:
    """All-to-all where each device holds S bytes and sends S/n to each of the n members.

    Traffic crossing level k is what goes to members outside one's own
    level-(k-1) group but inside one's level-k group: S*(M_k - M_{k-1})/M with
    M_k = prod of participants up to k. Levels are charged one after another
    because on a supernode they often share the same ports (UB, NVLink);
    where they do not (NVLink beside InfiniBand) the outer term dominates.
    """
    if not spans or message_bytes <= 0:
        return 0.0
    n = math.prod(s.participants for s in spans)
    per_peer = message_bytes / n
    total, reached = 0.0, 1
    for span in spans:
        crossing = reached * (span.participants - 1)
        reached *= span.participants
        total += span.level.latency_s + message_bytes * crossing / n / span.effective_bandwidth(per_peer)
    return total


def send_recv_s(message_bytes: float, spans: Sequence[LevelSpan]) -> float:
    """Point-to-point send of S bytes between the two devices of `spans` (place_group of size 2):
    alpha + S/B over the outermost level crossed (e.g. pipeline activations between stages)."""
    if not spans or message_bytes <= 0:
        return 0.0
    span = spans[-1]
    return span.level.latency_s + message_bytes / span.effective_bandwidth(message_bytes)
