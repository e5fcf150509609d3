"""Cutting layers into pipeline stages: contiguous chunks whose slowest one is as fast as possible.

The embedding rides with the first chunk and the head (final norm, logits)
with the last, so an even split by layer count leaves those two stages
slower than the rest; a 1F1B pipeline runs at the pace of its slowest
stage (Narayanan 2021), so moving a layer or two off them pays. This is the
classic linear-partition problem, solved exactly by dynamic programming
over prefix sums (the inter-operator pass of Alpa, Zheng et al. OSDI'22,
restricted to one layer order).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def balanced_split(layer_s: Sequence[float], n_chunks: int, first_extra_s: float = 0.0,
                   last_extra_s: float = 0.0) -> tuple[int, ...]:
    """Layers per chunk (each >= 1) minimising the largest chunk time; ties keep earlier chunks smaller.

    `layer_s` is each layer's time in order; `first_extra_s` and
    `last_extra_s` are the non-layer work of the first and last chunk.
    """
    n = len(layer_s)
    if n_chunks < 1 or n < n_chunks:
        raise ValueError(f"cannot cut {n} layers into {n_chunks} chunks")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(layer_s, dtype=float))])
    inf = float("inf")
    # best[c][i]: least max time of cutting the first i layers into c chunks; cut[c][i]: start of chunk c-1
    best = np.full((n_chunks + 1, n + 1), inf)
    cut = np.zeros((n_chunks + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for c in range(1, n_chunks + 1):
        extra_first = first_extra_s if c == 1 else 0.0
        for i in range(c, n - (n_chunks - c) + 1):
            j = np.arange(c - 1, i)  # previous cut positions
            chunk = prefix[i] - prefix[j] + extra_first + (last_extra_s if c == n_chunks else 0.0)
            cand = np.maximum(best[c - 1][j], chunk)
            k = int(np.argmin(cand + 1e-12 * (i - j)))  # prefer the later cut on ties (smaller chunk c)
            best[c][i] = cand[k]
            cut[c][i] = j[k]
    sizes = []
    i = n
    for c in range(n_chunks, 0, -1):
        j = int(cut[c][i])
        sizes.append(i - j)
        i = j
    return tuple(reversed(sizes))
