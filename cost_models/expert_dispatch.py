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
Each device streams its whole share as one pipelined transfer, so the bus
efficiency is that of its total bytes at a level, not of one peer's slice
(DeepEP reports 39-46 GB/s of a 50 GB/s NIC at 128 tokens per GPU; its README).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.placement import LevelSpan


def expected_touched(n_tokens: float, top_k: int, experts: int) -> float:
    """Expected distinct experts (of `experts`) that `n_tokens` tokens with `top_k` picks each reach."""
    if experts <= 0 or top_k <= 0 or n_tokens <= 0:
        return 0.0
    miss = max(0.0, 1.0 - min(top_k, experts) / experts)
    return experts * (1.0 - miss**n_tokens)


def expected_groups(top_k: int, groups: int) -> float:
    """Expected distinct groups (of `groups` equal groups of experts) one token's `top_k` picks land in."""
    if groups <= 1:
        return 1.0
    return groups * (1.0 - (1.0 - 1.0 / groups) ** top_k)


def exchange_s(tokens: float, top_k: int, token_bytes: float, spans: Sequence[LevelSpan],
               hierarchical: bool = False) -> float:
    """Seconds for one device to send its `tokens` to their experts (or get them back) over the EP group `spans`.

    Members of the group hold the experts evenly; level k of `spans` joins
    `participants` groups of the level below. Direct: the pairs bound for
    members outside one's level-(k-1) group but inside one's level-k group
    cross level k. Hierarchical: at the outermost level a token crosses once
    per remote destination group; inner levels carry the pairs as direct.
    """
    if not spans or tokens <= 0 or token_bytes <= 0:
        return 0.0
    n = math.prod(s.participants for s in spans)
    total, reached = 0.0, 1
    for depth, span in enumerate(spans):
        inside = reached * span.participants
        if hierarchical and depth == len(spans) - 1 and len(spans) > 1:
            g = span.participants
            copies = expected_groups(top_k, g) * (g - 1) / g  # remote destination groups per token
        else:
            copies = top_k * (inside - reached) / n
        reached = inside
        volume = tokens * copies * token_bytes
        if volume <= 0:
            continue
        total += span.level.latency_s + volume / span.effective_bandwidth(volume)
    return total
