"""Pipeline schedules: the bubble and the step time of p stages over m micro-batches.

Equal stages (Narayanan et al. 2021, section 2.2): GPipe and 1F1B idle for a
fraction (p-1)/m of the ideal time, interleaved 1F1B with v chunks per stage
for (p-1)/(v*m). Unequal stages: after the fill, the steady state advances at
the pace of the slowest stage, and the fill and drain cost each stage once:

  1F1B / interleaved: T = (m - 1/v) * max_i t_i + sum_i t_i / v,   t_i = f_i + b_i (+ 2 p2p)
  GPipe:              T = (m - 1) * (max_i f_i + max_i b_i) + sum_i (f_i + b_i)

which reduce to (m + (p-1)/v) * t for equal stages. A stack that runs a
forward and a backward of two micro-batches together in the steady state
(Megatron-Core's 1F1B all-to-all overlap) takes `steady_i` <= t_i for each
such pair, except for the chunk steps the first stage runs alone: its
warm-up forwards and as many cool-down backwards, w = 2(p-1) + (v-1)p + 1
chunk steps interleaved, p in plain 1F1B (Megatron-LM schedules.py
get_pp_rank_microbatches, one more than without the overlap, so that a
stage without a pipeline runs its first forward and last backward alone):

  paired: T = (m - w/v) * max_i steady_i + (w - 1)/v * max_i t_i + sum_i t_i / v

which is the formula above when steady = t, and (m-1) steady + t for one
stage. `unpaired_s` is what the steps run alone add over the paired pace.
Each micro-batch's
activation send after the forward and gradient send after the backward are
charged on the critical path (blocking p2p, as in Megatron-LM's default;
v sends each way per micro-batch when interleaved, the extra traffic
Narayanan 2021 notes);
the breakdown keeps them apart so an estimate can show what they cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.memory import PipelineSchedule


@dataclass(frozen=True, slots=True)
class PipelineTime:
    """Step time of a pipeline and its parts: busy (the slowest stage's work) + bubble + p2p = total."""

    total_s: float
    busy_s: float
    bubble_s: float
    p2p_s: float
    unpaired_s: float = 0.0  # of bubble_s: the paired schedule's steps run alone, over the paired pace

    def repeated(self, times: int) -> PipelineTime:
        """`times` such schedules one after another, each filling and draining the pipeline."""
        return PipelineTime(total_s=times * self.total_s, busy_s=times * self.busy_s, bubble_s=times * self.bubble_s,
                            p2p_s=times * self.p2p_s, unpaired_s=times * self.unpaired_s)


def bubble_fraction(schedule: PipelineSchedule, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle time over ideal time for equal stages: (p-1)/m, or (p-1)/(v*m) interleaved (Narayanan 2021)."""
    _check(schedule, pp, microbatches, virtual_stages)
    v = virtual_stages if schedule == "interleaved" else 1
    return (pp - 1) / (v * microbatches)


def pipeline_time(
    stage_forward_s: Sequence[float],
    stage_backward_s: Sequence[float],
    microbatches: int,
    schedule: PipelineSchedule = "1f1b",
    virtual_stages: int = 1,
    p2p_s: float = 0.0,
    stage_steady_s: Sequence[float] | None = None,
) -> PipelineTime:
    """Step time of one pipeline from per-stage forward/backward times of one micro-batch (whole stage, all chunks)
    and, for 1F1B schedules that pair them, the seconds of a steady-state forward-backward pair (see above)."""
    if len(stage_forward_s) != len(stage_backward_s) or not stage_forward_s:
        raise ValueError("need one forward and one backward time per stage")
    if min(stage_forward_s) < 0 or min(stage_backward_s) < 0 or p2p_s < 0:
        raise ValueError("stage and p2p times must be >= 0")
    pp = len(stage_forward_s)
    _check(schedule, pp, microbatches, virtual_stages)
    alone = [f + b for f, b in zip(stage_forward_s, stage_backward_s)]
    steady = alone if stage_steady_s is None or schedule == "gpipe" else list(stage_steady_s)
    if len(steady) != pp or any(not 0 <= x <= y * (1 + 1e-12) for x, y in zip(steady, alone)):
        raise ValueError("need one steady-state time per stage, between 0 and its forward plus backward")
    busy = microbatches * max(steady)
    v = virtual_stages if schedule == "interleaved" else 1
    bare = _span_s(stage_forward_s, stage_backward_s, steady, microbatches, schedule, v, 0.0)
    total = _span_s(stage_forward_s, stage_backward_s, steady, microbatches, schedule, v, p2p_s if pp > 1 else 0.0)
    unpaired = 0.0 if steady is alone else bare - _one_f_one_b_s(steady, steady, microbatches, schedule, v)
    return PipelineTime(total_s=total, busy_s=busy, bubble_s=bare - busy, p2p_s=total - bare,
                        unpaired_s=max(0.0, unpaired))


def paired_alone_steps(schedule: PipelineSchedule, pp: int, microbatches: int, virtual_stages: int = 1) -> int:
    """Chunk steps the first stage runs alone, forward and backward each, under a schedule that pairs a forward
    with a backward (see the module docstring), at most all of its m x v."""
    v = virtual_stages if schedule == "interleaved" else 1
    w = 2 * (pp - 1) + (v - 1) * pp + 1 if schedule == "interleaved" else pp
    return min(w, microbatches * v)


def _span_s(fwd: Sequence[float], bwd: Sequence[float], steady: Sequence[float], m: int, schedule: PipelineSchedule,
            v: int, p2p: float) -> float:
    f = [x + v * p2p for x in fwd]  # each of the v chunks sends its output on
    b = [x + v * p2p for x in bwd]
    if schedule == "gpipe":
        return (m - 1) * (max(f) + max(b)) + sum(f) + sum(b)
    return _one_f_one_b_s([x + y for x, y in zip(f, b)], [x + 2 * v * p2p for x in steady], m, schedule, v)


def _one_f_one_b_s(t: Sequence[float], steady: Sequence[float], m: int, schedule: PipelineSchedule, v: int) -> float:
    """1F1B and interleaved: (m - w/v) max steady + (w-1)/v max t + sum t / v, which is
    (m - 1/v) max t + sum t / v when nothing pairs (steady = t)."""
    w = paired_alone_steps(schedule, len(t), m, v)
    return (m - w / v) * max(steady) + (w - 1) / v * max(t) + sum(t) / v


def _check(schedule: PipelineSchedule, pp: int, microbatches: int, virtual_stages: int) -> None:
    if schedule not in ("gpipe", "1f1b", "interleaved"):
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected gpipe, 1f1b or interleaved")
    if pp < 1 or microbatches < 1 or virtual_stages < 1:
        raise ValueError(f"need pp, microbatches and virtual_stages >= 1, got {pp}, {microbatches}, {virtual_stages}")
    if schedule == "interleaved" and virtual_stages > 1 and microbatches % pp:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({microbatches}) divisible by the stages ({pp})")
