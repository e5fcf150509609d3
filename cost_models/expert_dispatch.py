"""Mixture-of-experts traffic: which experts a batch touches, and the dispatch/combine exchange over the fabric.

Routing is taken as uniform and independent per token (what load balancing
aims for; DeepSeek-V3 section 2.1.2, auxiliary-loss-free balancing). Then
the experts a batch of N tokens touches follow the occupancy law: a given
expert is missed by one token's k picks with probability 1 - k/E, so
E * (1 - (1 - k/E)^N) experts are touched in expectation (Feller, An
Introduction to Probability Theory, vol. 1, section II.5: occupancy).

Dispatch sends each (token, expert) pair's hidden vector to the expert's
device and combine sends the result back (Lepikhin et al. 2021, GShard;
DeepSeek's DeepEP). Two kernel styles are modelled:
- direct (DeepEP's low-latency kernels, used in decode): every pair whose
  expert is on another device crosses the fabric on its own;
- hierarchical (DeepEP's normal kernels, used in prefill): a token crosses
  each outer level once per destination group, then is forwarded inside it.
DeepEP's kernels stream a device's whole share as one pipelined transfer, so
the bus efficiency is that of its total bytes at a level, not of one peer's
slice (DeepEP reports 39-46 GB/s of a 50 GB/s NIC at 128 tokens per GPU; its
README). A collective library's all-to-all (`per_peer`: NCCL's, which
Megatron's alltoall dispatcher reaches through torch's all_to_all_single)
is one message to each peer: torch issues an ncclSend and an ncclRecv per
rank inside one NCCL group (torch/csrc/cuda/nccl.cpp,
all2all_single_unequal_split), as NCCL's own ncclAlltoAll appends a send and
a receive task per rank (src/enqueue.cc, NVIDIA/nccl at 5067397c); each
transfer pays the level's bus efficiency at its own size, which is
`cost_models.collectives.all_to_all_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.collectives import all_to_all_s
from cost_models.placement import LevelSpan


def expected_touched(n_tokens: float, top_k: int, experts: int) -> float:
    """Expected distinct experts (of `experts`) that `n_tokens` tokens with `top_k` picks each reach."""
    if experts <= 0 or top_k <= 0 or n_tokens <= 0:
        return 0.0
    miss = max(0.0, 1.0 - min(top_k, experts) / experts)
    return experts * (1.0 - miss**n_tokens)


def expected_groups(top_k: int, groups: float) -> float:
    """Expected distinct groups (of `groups` equal groups of experts) one token's `top_k` picks land in."""
    if groups <= 1:
        return 1.0
    return groups * (1.0 - (1.0 - 1.0 / groups) ** top_k)


def limited_groups(top_k: int, groups: int, limit: int) -> float:
    """Expected distinct groups a token's `top_k` picks land in when routing first picks `limit` of the `groups`
    and then its experts among theirs (DeepSeek-V3's node-limited routing, section 2.1.2: at most 4 nodes)."""
    if limit <= 0 or limit >= groups:
        return expected_groups(top_k, groups)
    return expected_groups(top_k, limit)


def limited_members(top_k: int, members: float, groups: int, limit: int) -> float:
    """Expected distinct members (of `members` equal members holding the experts in order: EP ranks, or nodes)
    one token's `top_k` picks reach when routing first picks `limit` of `groups` equal groups of consecutive
    experts and then its experts among theirs (DeepSeek-V3 section 2.1.2, group-limited routing: n_group = 8,
    topk_group = 4; Megatron-Core's moe_router_num_groups and moe_router_group_topk). A group spans
    members / groups members when there are at least as many members, and the picks spread over the chosen
    groups' members; else each member holds groups / members whole groups and a token reaches the members of
    its chosen groups (each chosen group taking at least one of the picks)."""
    if groups <= 1 or limit <= 0 or limit >= groups or members <= 1:
        return expected_groups(top_k, int(members)) if members >= 1 else 1.0
    if members >= groups:
        return expected_groups(top_k, limit * members / groups)
    per = round(groups / members)  # groups a member holds (the nearest whole number where they do not divide)
    chosen = min(limit, top_k)
    missed = math.comb(max(0, groups - per), chosen) / math.comb(groups, chosen)  # a member none of them is on
    return members * (1.0 - missed)


def contiguous_groups(top_k: int, experts: int, ep: int, group_ranks: int) -> float:
    """Expected distinct groups of `group_ranks` consecutive ranks (a node) that a token reaches when its
    `top_k` experts are consecutive (NeMo Automodel's FakeBalancedGate: token i takes experts
    i*k .. i*k+k-1 mod E), the experts laid out in order over the `ep` ranks."""
    per_rank = max(1.0, experts / ep)
    ranks = (top_k + per_rank - 1.0) / per_rank  # ranks a block of k consecutive experts spans, on average
    return min(ep / group_ranks, 1.0 + (ranks - 1.0) / group_ranks)


def exchange_s(tokens: float, top_k: int, token_bytes: float, spans: Sequence[LevelSpan],
               hierarchical: bool = False, outer_groups: float | None = None, ranks: float | None = None,
               per_peer: bool = False) -> float:
    """Seconds for one device to send its `tokens` to their experts (or get them back) over the EP group `spans`.

    Members of the group hold the experts evenly; level k of `spans` joins
    `participants` groups of the level below.

    Direct (an all-to-all of (token, expert) pairs: DeepEP's low-latency
    kernels, or with `per_peer` a collective library's all-to-all, Megatron's
    alltoall dispatcher): the pairs bound for members outside one's
    level-(k-1) group but inside one's level-k group cross level k, level
    after level; streamed whole, or (`per_peer`) as the all-to-all of the
    rank's pairs that `cost_models.collectives.all_to_all_s` costs, each
    peer's 1/n of them a message of its own. A hierarchical exchange streams
    by construction: `per_peer` with it is refused.

    Hierarchical (DeepEP's normal kernels): a token crosses the outermost
    level once per remote destination group (`outer_groups` distinct groups
    per token; by default its top-k picks drawn uniformly) and is forwarded
    inside each group once per destination member (`ranks` distinct members
    per token over the whole group; by default uniform picks), the two
    levels working at once (RDMA and NVLink forwarding run concurrently).
    """
    if hierarchical and per_peer:
        raise ValueError("a hierarchical exchange streams each level's share whole: per_peer is for a direct one")
    if not spans or tokens <= 0 or token_bytes <= 0:
        return 0.0
    if per_peer:
        return all_to_all_s(tokens * top_k * token_bytes, spans)
    n = math.prod(s.participants for s in spans)
    if hierarchical:
        touched = expected_groups(top_k, n) if ranks is None else min(float(n), ranks)
        inner_copies = touched * (n - 1) / n  # every destination member but oneself gets the token once
        if len(spans) == 1:
            return _crossing_s(spans[0], tokens * inner_copies * token_bytes)
        g = spans[-1].participants
        groups = expected_groups(top_k, g) if outer_groups is None else min(float(g), outer_groups)
        outer_copies = groups * (g - 1) / g
        outer = _crossing_s(spans[-1], tokens * outer_copies * token_bytes)
        inner = max((_crossing_s(s, tokens * max(0.0, inner_copies - outer_copies) * token_bytes)
                     for s in spans[:-1]), default=0.0)
        return max(outer, inner)
    total, reached = 0.0, 1
    for span in spans:
        inside = reached * span.participants
        copies = top_k * (inside - reached) / n
        reached = inside
        total += _crossing_s(span, tokens * copies * token_bytes)
    return total


def _crossing_s(span: LevelSpan, volume: float) -> float:
    """One device's `volume` bytes across one level, streamed as one pipelined transfer."""
    if volume <= 0:
        return 0.0
    return span.level.latency_s + volume / span.effective_bandwidth(volume)
