"""Lower bounds on the step time of a region of the strategy space, for branch and bound.

A region fixes some knobs (context degree, then tensor degree, micro-batch, expert degrees, then the
pipeline and data degrees and the interleaving); its bound must not exceed the estimate of any strategy
in it. Every bound here is built from one costing of a representative (`stage_costs` with one layer per
pipeline stage and no recompute) and keeps only what no choice left open can remove:

- per stage and micro-batch, the forward and backward compute (and the recomputed forward, for a region
  of one recompute policy), the context-parallel ring as exposed
  (already net of its overlap), and the tensor- and expert-parallel collectives less what their overlap
  can hide at most (a tensor collective only behind the GEMM it feeds, `tp_*_hidden`, `cost_models.overlap`;
  the expert exchange, under the 1F1B all-to-all overlap, all of it, `moe_pairing`): recompute, ZeRO-3's gathers, offload,
  the point-to-point sends, the data-parallel tail and the optimizer step only add to it;
- per pipeline: a 1F1B step of stages with those times is (m - 1/v) max_i t_i + sum_i t_i / v
  (`cost_models.schedule`); over every contiguous cut of the embedding, the layers and the head (a first
  stage of the embedding alone, a last of the head alone, are cuts too), the least max_i t_i is the bottleneck
  of the linear partition (`least_widest_stage`), interleaved chunks are cut as the search cuts them (evenly, or
  the layers, the embedding and the head evenly: `grid.chunk_cut`);
- above the pipeline (any pp and dp with pp x dp fixed), m max_i t_i >= m sum_i t_i / pp: the work of
  one step over the devices.

Two monotonicities carry a bound from one representative to a whole region (both hold for roofline
times with efficiency rising with op size and latencies amortised over bytes, the cost model's shape;
`tests/test_search_bnb.py` checks them against every strategy of small spaces): a sample costs no
more at the largest micro-batch than at a smaller one, and the work of a rank at tensor degree t is at
least 1/t of it at t = 1; for routed experts, the widest expert-parallel group runs the largest (most
efficient) expert GEMMs, so its compute, without the exchange (and the dispatcher's regrouping of what the
exchange brings), bounds every narrower one. A region of one expert degree is bounded that way too: the
compute of the widest group of its micro-batch and the exchange of its own degree, which needs no costing of
its own (`exchange_parts`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Mapping, Sequence

from planner.costing.block_costs import Parts
from planner.costing.exchange import add_expert_exchange
from planner.costing.execution import Execution
from planner.costing.node_times import DTYPE_WIDTH, activation_dtype
from planner.costing.stage_costs import StageCosts
from planner.strategy import Strategy, Workload


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Per layer, the seconds per micro-batch no choice in the region removes; the embedding's and the head's
    (the blocks before the first layer and after the last) apart, since a pipeline chunk may hold either alone."""

    per_layer_s: tuple[float, ...]
    micro_batch: int
    stem_s: float = 0.0
    head_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.stem_s + sum(self.per_layer_s) + self.head_s

    @property
    def per_sample_s(self) -> float:
        return self.total_s / self.micro_batch

    def folded(self) -> tuple[float, ...]:
        """Per layer, the embedding's seconds with the first and the head's with the last (an even cut's chunks)."""
        per = list(self.per_layer_s)
        per[0] += self.stem_s
        per[-1] += self.head_s
        return tuple(per)


def unavoidable_s(p: Parts, execution: Execution, sp: bool, count_ep: bool) -> float:
    """What no choice in the region removes from a block's (or stage's) seconds `p`: its compute, its context ring
    as exposed, its tensor collectives less what their overlap can hide and its expert exchange, hidden whole by
    the 1F1B overlap (see the module docstring)."""
    t = p.forward + p.backward + p.recompute + p.cp_fwd + p.cp_bwd + p.tp_fwd + p.tp_bwd
    if execution.overlap_tp_comm and sp:
        t -= p.tp_fwd_hidden + p.tp_bwd_hidden
    return t + ((p.ep_fwd + p.ep_bwd) * (0.0 if execution.overlap_ep_comm else 1.0) if count_ep else 0.0)


def layer_times(costs: StageCosts, execution: Execution, sp: bool, micro_batch: int, count_ep: bool,
                own: Mapping[str, Parts] | None = None, exchange: Mapping[str, Parts] | None = None,
                edges: tuple[Sequence[str], Sequence[str]] = ((), ())) -> LayerTimes:
    """The unavoidable seconds of each stage of a costing with one layer per stage (see the module docstring), the
    blocks `edges` (before the first layer, after the last: `stage_widths.edge_blocks`) apart from the layers.

    With `own`, the costing's own expert exchange (`exchange_parts` of its strategy) is taken out, the
    dispatcher's local regrouping with it, and `exchange` (another expert degree's, or none) counted instead."""
    out = []
    hide = 0.0 if execution.overlap_ep_comm else 1.0
    for st in costs.stages:
        t = unavoidable_s(st.parts, execution, sp, count_ep and own is None)
        if own is not None:
            t -= sum(own[n].forward + own[n].backward for n in st.layers if n in own)
            for x in (exchange[n] for n in st.layers if n in (exchange or {})):
                t += x.forward + x.backward + ((x.ep_fwd + x.ep_bwd) * hide if count_ep else 0.0)
        out.append(t)
    stem, head = (sum(unavoidable_s(costs.block_parts[n], execution, sp, count_ep) for n in names
                      if n in costs.block_parts) for names in edges)
    if out:
        out[0] -= stem
        out[-1] -= head
    return LayerTimes(tuple(out), micro_batch, stem, head)


def exchange_parts(facts, cluster, workload: Workload, strategy: Strategy) -> dict[str, Parts]:
    """Per MoE block, one micro-batch's expert exchange under `strategy` without recompute, as a costing of it
    holds it (`planner.costing.exchange`), without costing the rest: dispatch and combine (`ep_fwd`, `ep_bwd`)
    and the all-to-all dispatcher's regrouping of what it received (`forward`, `backward`)."""
    parts = {name: Parts() for name in facts.moe}
    width = DTYPE_WIDTH.get(activation_dtype(workload), 2.0)
    add_expert_exchange(facts, cluster, strategy, workload.execution, width, strategy.micro_batch / facts.work.batch,
                        {}, parts)
    return parts


def mesh_bound_s(per_sample_s: float, global_batch: int, ranks_per_replica: int, devices: int) -> float:
    """Any pipeline over any data-parallel degree: the step's samples at `per_sample_s` each (the time of
    one replica of `ranks_per_replica` = tp x cp x pp ranks... of one stage), spread over every device.

    m max_i t_i >= m sum_i t_i / pp with m = B / (dp mb): B x per-sample x tp x cp / devices."""
    return global_batch * per_sample_s * ranks_per_replica / devices


def pipeline_bound_s(lt: LayerTimes, pp: int, microbatches: int, vpp: int, spread_s: float = 0.0) -> float:
    """A 1F1B (interleaved when vpp > 1) step of pp stages of these layers, m micro-batches, at the best cut
    (vpp 1: the exact linear partition of the embedding, the layers and the head, so a first stage of the
    embedding alone or a last of the head alone is among the cuts) or the even cut of pp x vpp chunks.

    `spread_s`: seconds per micro-batch the stages add over these, in all at least that much whatever the cut
    (`dp_floor`): the slowest stage then takes at least a pp-th of the layers' and those seconds."""
    total = lt.total_s + spread_s
    if pp == 1:
        return microbatches * total
    if vpp == 1:
        widest = least_widest_stage((lt.stem_s, *lt.per_layer_s, lt.head_s), pp)
        return (microbatches - 1) * max(widest, total / pp) + total
    from planner.costing.pipeline_cut import even_split
    from planner.search.grid import chunk_cut

    n = len(lt.per_layer_s)
    cut = chunk_cut(n, pp, vpp)
    if cut:  # the accounted split: its chunks over the embedding, the layers and the head
        units = (lt.stem_s, *lt.per_layer_s, lt.head_s)
        widest = _max_stage(units, (cut[0] + 1, *cut[1:-1], cut[-1] + 1), pp)
    else:
        widest = _max_stage(lt.folded(), even_split(n, pp * vpp), pp)
    return (microbatches - 1.0 / vpp) * max(widest, total / pp) + total / vpp


def least_widest_stage(per: Sequence[float], pp: int) -> float:
    """The least slowest-stage time over every cut of `per` into pp contiguous stages, from below: the
    bottleneck of the linear partition, bisected on the greedy test (a cap is feasible iff filling each stage
    up to it takes at most pp stages) to 1e-9 of it; the value returned is never above the exact one."""
    lo, hi = max(max(per), sum(per) / pp), sum(per)
    if hi <= 0:
        return 0.0
    lo *= 1 - 1e-12  # max(per) and the mean are themselves lower bounds of the answer
    prefix = list(accumulate(per))
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        if _fits(prefix, mid, pp):
            hi = mid
        else:
            lo = mid
    return lo


def _fits(prefix: list[float], cap: float, pp: int) -> bool:
    """Whether filling stages greedily up to `cap` covers every unit (`prefix`: their running sums) in at most pp
    stages: each stage ends at the last unit whose running sum is within its start's plus the cap."""
    i, base, n = 0, 0.0, len(prefix)
    for _ in range(pp):
        start, i = i, bisect_right(prefix, base + cap, i)
        if i >= n:
            return True
        if i == start:  # the next unit alone is over the cap
            return False
        base = prefix[i - 1]
    return False


def _max_stage(per: Sequence[float], chunk_sizes: Sequence[int], pp: int) -> float:
    stage = [0.0] * pp
    i = 0
    for c, n in enumerate(chunk_sizes):
        stage[c % pp] += sum(per[i:i + n])
        i += n
    return max(stage)
