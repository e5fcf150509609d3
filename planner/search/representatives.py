"""The representatives' costings behind the search's bounds: one layer per stage, each costed once.

A region of the search (`plan_search`) is bounded from the per-layer times of one representative strategy
(`bounds.layer_times`); this keeps those costings, and derives from them, without costing anything more,
the bound of a region of one expert degree (the widest expert group's compute and the degree's own exchange,
`bounds.exchange_parts`) and the least per-sample time of a region of several degrees.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from planner.costing.block_costs import Parts
from planner.costing.node_times import LOW_PRECISION_GEMMS
from planner.errors import HyperplanError
from planner.search.bounds import LayerTimes, exchange_parts, layer_times
from planner.search.budget import Budget
from planner.strategy import Strategy, Workload


#: Micro-batches a representative's step is spread over when the stack caches FP8 weights: its weight casts then
#: cost a millionth of one micro-batch's (`Representatives._spread`).
CAST_SPREAD = 1 << 20


class Representatives:
    """Costings of the search's region representatives, and the per-layer times bounds read from them."""

    def __init__(self, scorer, workload: Workload, layers: int, layouts: str, budget: Budget, sp: bool = True) -> None:
        self.scorer, self.workload, self.layers, self.layouts, self.budget = scorer, workload, layers, layouts, budget
        self.sp = sp  # tensor parallelism with sequence parallelism (what the stack and the launcher run)
        self.costings: dict[tuple, Any] = {}  # (tp, cp, mb, ep, etp, recompute) -> StageCosts (None: not costable)
        self.exchanges: dict[tuple, Any] = {}  # (tp, cp, mb, ep, etp) -> its expert exchange per MoE block

    def representative(self, tp: int, cp: int, mb: int, ep: int, etp: int,
                       recompute: str = "none") -> tuple[Strategy, Workload]:
        """A region's representative: one layer per stage, one micro-batch per replica, and the data degree
        the expert folding needs (any data degree the folding allows: it changes no per-layer time)."""
        dp = ep * etp
        s = Strategy(tp=tp, cp=cp, pp=max(1, self.layers), dp=dp, ep=ep, etp=0 if etp == tp else etp,
                     micro_batch=mb, recompute=recompute, sp=tp > 1 and self.sp, layouts=self.layouts)
        if self._spread() == 1:
            return s, replace(self.workload, global_batch=dp * mb)
        # the cast spread over so many micro-batches that it is the least any strategy pays: a cache's share, or
        # under ZeRO-3 gathers in FP8 each rank's data-parallel slice (`node_times.weight_cast_shares`)
        ex = replace(self.workload.execution, fp8_weight_cache=True)
        return s, replace(self.workload, global_batch=dp * mb * CAST_SPREAD, execution=ex)

    def _spread(self) -> int:
        """Micro-batches the representative's step is taken to have: one, unless some strategy of the region casts
        its FP8 weights less than once per micro-batch: cached once per step (`Execution.fp8_weight_cache`), or
        sharded before ZeRO-3 gathers them in FP8 (`Execution.fp8_all_gather`), a choice left open in the
        region; then so many that the cast it pays is the least any strategy pays."""
        ex = self.workload.execution
        fewer = (ex.fp8_weight_cache or ex.fp8_all_gather) and not ex.fp8_params
        return CAST_SPREAD if self.workload.mode == "train" and fewer and self.workload.dtype in LOW_PRECISION_GEMMS \
            else 1

    def times(self, tp: int, cp: int, mb: int, ep: int, etp: int, recompute: str = "none") -> LayerTimes:
        """Per-layer unavoidable seconds of one representative (one layer per stage), costed once."""
        key = (tp, cp, mb, ep, etp, recompute)
        if key not in self.costings:
            self.budget.spend()
            try:
                self.costings[key] = self.scorer.costs(*self.representative(tp, cp, mb, ep, etp, recompute))
            except HyperplanError:
                self.costings[key] = None  # no bound: the strategies will say why
        costs = self.costings[key]
        if costs is None:
            return LayerTimes((0.0,), mb)
        return layer_times(costs, self.workload.execution, tp > 1, mb, True, edges=self.scorer.edges)

    def exchange(self, tp: int, cp: int, mb: int, ep: int, etp: int) -> dict:
        """The expert exchange of one representative per MoE block (`bounds.exchange_parts`), once."""
        key = (tp, cp, mb, ep, etp)
        if key not in self.exchanges:
            s, workload = self.representative(tp, cp, mb, ep, etp)
            self.exchanges[key] = exchange_parts(self.scorer.facts, self.scorer.cluster, workload, s)
        return self.exchanges[key]

    def times_with(self, tp: int, cp: int, mb: int, ep: int, etp: int, others: tuple[int, ...],
                   count_ep: bool) -> LayerTimes:
        """Per-layer seconds of the representative at expert degree `ep` with its own expert exchange (and the
        dispatcher's regrouping of what it brings) taken out, and the least any expert degree of `others` pays
        put back: its regrouping, and its exchange when `count_ep` (then `others` is one degree)."""
        self.times(tp, cp, mb, ep, etp)
        costs = self.costings[(tp, cp, mb, ep, etp, "none")]
        if costs is None:
            return LayerTimes((0.0,), mb)
        least = self.exchange(tp, cp, mb, others[0], etp)
        if len(others) > 1:
            each = [self.exchange(tp, cp, mb, e, etp) for e in others]
            least = {b: Parts(forward=min(x[b].forward for x in each), backward=min(x[b].backward for x in each))
                     for b in least}
        own = self.exchange(tp, cp, mb, ep, etp)
        return layer_times(costs, self.workload.execution, tp > 1, mb, count_ep, own=own, exchange=least,
                           edges=self.scorer.edges)

    def ep_times(self, tp: int, cp: int, mb: int, ep: int, etp: int, widest: int) -> LayerTimes:
        """Per-layer unavoidable seconds of a region of one expert degree, costed once per micro-batch: the
        compute of `widest`, the widest expert group of the micro-batch's region (no narrower one computes
        less: `bounds`), and the exchange of this degree, which needs no costing of its own."""
        if widest == ep:
            return self.times(tp, cp, mb, ep, etp)
        return self.times_with(tp, cp, mb, widest, etp, (ep,), True)

    def per_sample(self, tp: int, cp: int, mb: int, region: list[tuple[int, ...]],
                   eps: tuple[int, ...] = ()) -> float:
        """Least per-sample time over the region's expert degrees (`eps`: those of the region the representative
        `region` stands for, when it is not the region itself): for each etp the widest expert group (the
        largest expert GEMMs), its exchange left out and the least regrouping of the region's degrees put in."""
        best = math.inf
        for etp in sorted({m[5] for m in region}):
            ep = max(m[4] for m in region if m[5] == etp)
            others = eps or tuple(sorted({m[4] for m in region if m[5] == etp}))
            best = min(best, self.times_with(tp, cp, mb, ep, etp, others, False).per_sample_s)
        return best if math.isfinite(best) else 0.0


__all__ = ["Representatives"]
