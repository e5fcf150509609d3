"""The caching allocator's reserve of a stack, fitted on the peak memory its published runs report.

PyTorch stacks report the caching allocator's reserved peak
(`torch.cuda.memory_stats()["reserved_bytes.all.peak"]`: torchtitan's
`memory:` log line, components/metrics.py), which is the tensors the
estimate counts plus blocks the allocator holds without a tensor in them
(fragmentation, cached free blocks). `Execution.allocator_reserve` is that
slack's share of the reserved memory, so a run whose tensors peak at T
reports T / (1 - reserve).

One number per stack, fitted on the runs with a measured peak that their
hardware's fit lists (`fitted_on`, the rule-chosen half of each
hardware's rows); the others are held out. Least squares of the log error,
which has a closed form: the reserve makes the fitted runs' mean log ratio
of measured to predicted tensors zero.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from planner.calibration.predict import GIB, Prediction
from planner.costing.stack_choices import MAX_ALLOCATOR_RESERVE
from planner.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class ReserveFit:
    """A stack's fitted reserve, the runs it was fitted on and the runs held out (ids)."""

    stack: str
    reserve: float
    fitted: tuple[str, ...]
    held_out: tuple[str, ...]


def tensor_gib(p: Prediction) -> float:
    """The worst stage's tensors at their peak, without the allocator's reserve."""
    return p.estimate.memory_bytes["peak"] / GIB


def fit_reserves(predictions: Sequence[Prediction]) -> list[ReserveFit]:
    """Per stack with a fitted run that measured its memory: the reserve that fits those runs (see the module
    docstring), at least 0 (a stack whose tensors are over-counted gets none, not a negative reserve); InvalidInput
    when the runs ask for `MAX_ALLOCATOR_RESERVE` or more."""
    by_stack: dict[str, list[Prediction]] = {}
    for p in predictions:
        if p.run.memory_gib is not None:
            by_stack.setdefault(p.run.execution.name, []).append(p)
    out = []
    for stack, preds in sorted(by_stack.items()):
        fitted = [p for p in preds if p.fitted]
        if not fitted:
            continue
        log_ratio = sum(math.log(p.run.memory_gib / tensor_gib(p)) for p in fitted) / len(fitted)
        reserve = max(0.0, 1.0 - math.exp(-log_ratio))
        if reserve >= MAX_ALLOCATOR_RESERVE:
            raise InvalidInput(f"the {stack} runs' measured peaks are {math.exp(log_ratio):.2f}x the tensors they are "
                               f"predicted to hold: a reserve of {reserve:.0%} would be no allocator's slack but a "
                               "model that misses memory; check the runs' layouts and stack")
        out.append(ReserveFit(stack, reserve, tuple(p.run.id for p in fitted),
                              tuple(p.run.id for p in preds if p.group == "held-out")))
    return out


def memory_error(p: Prediction, reserve: float) -> float:
    """Predicted over measured peak memory, minus one, with the allocator holding `reserve` of it."""
    execution = dataclasses.replace(p.run.execution, allocator_reserve=reserve)
    return execution.reserved_bytes(p.estimate.memory_bytes["peak"]) / GIB / p.run.memory_gib - 1.0


__all__ = ["ReserveFit", "fit_reserves", "memory_error", "tensor_gib"]
