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

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def balanced_split(layer_s: Sequence[float], n_chunks: int, first_extra_s: float = 0.0,
                   last_extra_s: float = 0.0, empty_ends: bool = False) -> tuple[int, ...]:
    """Layers per chunk minimising the largest chunk time; ties keep earlier chunks smaller.

    `layer_s` is each layer's time in order; `first_extra_s` and
    `last_extra_s` are the non-layer work of the first and last chunk.
    Every chunk holds a layer or more; with `empty_ends` the first and the
    last may hold none, only the embedding or the head (Megatron-Core's
    account_for_embedding/loss_in_pipeline_split).
    """
    n = len(layer_s)
    if n_chunks < 1:
        raise ValueError(f"cannot cut {n} layers into {n_chunks} chunks")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(layer_s, dtype=float))])
    inf = float("inf")
    # best[c][i]: least max time of cutting the first i layers into c chunks; cut[c][i]: start of chunk c-1
    best = np.full((n_chunks + 1, n + 1), inf)
    cut = np.zeros((n_chunks + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for c in range(1, n_chunks + 1):
        first, last = c == 1, c == n_chunks
        least = 0 if empty_ends and (first or last) else 1  # the fewest layers chunk c may hold
        extra = (first_extra_s if first else 0.0) + (last_extra_s if last else 0.0)
        for i in range(n if last else least, n + 1):
            j = np.arange(0, i - least + 1)  # previous cut positions
            cand = np.maximum(best[c - 1][j], prefix[i] - prefix[j] + extra)
            k = int(np.argmin(cand + 1e-12 * (i - j)))  # prefer the later cut on ties (smaller chunk c)
            best[c][i] = cand[k]
            cut[c][i] = j[k]
    if not np.isfinite(best[n_chunks][n]):
        raise ValueError(f"cannot cut {n} layers into {n_chunks} chunks")
    sizes = []
    i = n
    for c in range(n_chunks, 0, -1):
        j = int(cut[c][i])
        sizes.append(i - j)
        i = j
    return tuple(reversed(sizes))


@dataclass(frozen=True, slots=True)
class WidthCosts:
    """What a stage costs per layer when its tensor-parallel degree is `tp` (from a costing at that width)."""

    tp: int
    layer_s: Sequence[float]  # forward + backward per micro-batch, each layer in order
    layer_state_bytes: Sequence[float]  # parameters, gradients, optimizer states per device, each layer
    layer_act_bytes: Sequence[float]  # activations kept per micro-batch in flight, each layer
    first_s: float = 0.0  # non-layer work of the first stage (embedding)
    last_s: float = 0.0  # non-layer work of the last stage (final norm, logits)
    # (state, activations per micro-batch in flight, activations held once: the loss's) of the first stage's extras
    first_bytes: Sequence[float] = (0.0, 0.0, 0.0)
    last_bytes: Sequence[float] = (0.0, 0.0, 0.0)
    layer_once_bytes: Sequence[float] = ()  # activations held once per stage whatever is in flight, each layer


def unequal_split(widths: Sequence[WidthCosts], n_stages: int, tp_budget: int, held: Sequence[float],
                  hbm_bytes: float) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(layers per stage, tensor degree per stage) minimising the slowest stage, or None when nothing fits.

    The degrees add up to `tp_budget` (the tensor ranks of one pipeline replica), so a heavy stage may
    take more devices than a light one: the same linear partition as `balanced_split` with one more
    dimension, the devices spent so far (Alpa's stage-mesh DP, restricted to tensor widths). Stage c
    holds `held[c]` micro-batches' activations (the loss's once) and must fit in `hbm_bytes`.
    """
    n = len(widths[0].layer_s)
    if n < n_stages:
        return None
    unit = math.gcd(*(w.tp for w in widths))
    if tp_budget % unit:
        return None
    budget = tp_budget // unit
    inf = float("inf")
    pre = [(w, np.concatenate([[0.0], np.cumsum(w.layer_s)]), np.concatenate([[0.0], np.cumsum(w.layer_state_bytes)]),
            np.concatenate([[0.0], np.cumsum(w.layer_act_bytes)]),
            np.concatenate([[0.0], np.cumsum(list(w.layer_once_bytes) or [0.0] * n)])) for w in widths]
    # best[c][i, u]: least max stage time of the first i layers in c stages on u units; how: (previous cut, width)
    best = np.full((n_stages + 1, n + 1, budget + 1), inf)
    how = np.zeros((n_stages + 1, n + 1, budget + 1, 2), dtype=np.int64)
    best[0, 0, 0] = 0.0
    for c in range(1, n_stages + 1):
        first, last = c == 1, c == n_stages
        for i in range(c, n - (n_stages - c) + 1):
            j = np.arange(c - 1, i)
            for k, (w, t_pre, s_pre, a_pre, o_pre) in enumerate(pre):
                units = w.tp // unit
                if units > budget:
                    continue
                extra_s = (w.first_s if first else 0.0) + (w.last_s if last else 0.0)
                extra_state = (w.first_bytes[0] if first else 0.0) + (w.last_bytes[0] if last else 0.0)
                extra_act = (w.first_bytes[1] if first else 0.0) + (w.last_bytes[1] if last else 0.0)
                extra_once = (w.first_bytes[2] if first else 0.0) + (w.last_bytes[2] if last else 0.0)
                chunk = t_pre[i] - t_pre[j] + extra_s
                mem = (s_pre[i] - s_pre[j] + extra_state + held[c - 1] * (a_pre[i] - a_pre[j] + extra_act)
                       + o_pre[i] - o_pre[j] + extra_once)
                chunk = np.where(mem <= hbm_bytes, chunk, inf)
                cand = np.maximum(best[c - 1][j][:, : budget + 1 - units], chunk[:, None])  # (cut, units before)
                cand += 1e-12 * (i - j)[:, None]  # ties: the later cut (earlier stages smaller)
                arg = np.argmin(cand, axis=0)
                val = cand[arg, np.arange(cand.shape[1])]
                better = val < best[c, i, units:]
                best[c, i, units:] = np.where(better, val, best[c, i, units:])
                how[c, i, units:, 0] = np.where(better, j[arg], how[c, i, units:, 0])
                how[c, i, units:, 1] = np.where(better, k, how[c, i, units:, 1])
    if not math.isfinite(best[n_stages, n, budget]):
        return None
    sizes, tps = [], []
    i, u = n, budget
    for c in range(n_stages, 0, -1):
        j, k = int(how[c, i, u, 0]), int(how[c, i, u, 1])
        sizes.append(i - j)
        tps.append(widths[k].tp)
        i, u = j, u - widths[k].tp // unit
    return tuple(reversed(sizes)), tuple(reversed(tps))
