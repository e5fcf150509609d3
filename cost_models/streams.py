"""Two streams, one computing and one communicating, and the tasks issued to them: when the last one ends.

A GPU runs the kernels of one stream in the order they were issued; a
kernel on the other stream may run beside it, and a task may also wait
for tasks of the other stream (CUDA events). This is how Megatron-Core's
1F1B expert all-to-all overlap runs a forward and a backward layer of two
micro-batches (`planner.costing.moe_pairing` lays the tasks out).

Overlapped communication is slowed as in `cost_models.overlap`: while a
compute task runs beside it, a transfer advances at `efficiency` (its
kernels share the compute units and memory bandwidth), alone at full
rate. So a transfer of t seconds beside a long enough compute task hides
entirely when t <= efficiency x that task, and what outlasts the compute
shows at full rate: `exposed_s` for one transfer and one window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COMPUTE, COMM = 0, 1


@dataclass(frozen=True, slots=True)
class Task:
    """One kernel (or run of kernels) on a stream: its seconds alone, and the tasks (by index) it waits for."""

    stream: int  # COMPUTE or COMM
    seconds: float
    after: tuple[int, ...] = ()


def run_streams(tasks: Sequence[Task], efficiency: float = 1.0, compute_pace: float = 1.0) -> list[float]:
    """End time of each task, issued in the order given (each stream runs its own tasks in that order); beside
    each other a transfer advances at `efficiency` of its pace and a compute task at `compute_pace` of its own
    (the share of the compute units the transfer's kernels leave it)."""
    if not 0.0 <= efficiency <= 1.0 or not 0.0 < compute_pace <= 1.0:
        raise ValueError(f"overlap efficiency must lie in [0, 1] and compute pace in (0, 1], got {efficiency} and "
                         f"{compute_pace}")
    for i, t in enumerate(tasks):
        if t.seconds < 0 or t.stream not in (COMPUTE, COMM) or any(not 0 <= j < i for j in t.after):
            raise ValueError(f"task {i}: needs seconds >= 0, a known stream and waits on earlier tasks only")
    queues = ([i for i, t in enumerate(tasks) if t.stream == COMPUTE], [i for i, t in enumerate(tasks) if t.stream == COMM])
    head = [0, 0]
    end: list[float | None] = [None] * len(tasks)
    left = [t.seconds for t in tasks]
    now = 0.0
    while head[0] < len(queues[0]) or head[1] < len(queues[1]):
        ready = [q[h] if h < len(q) and all(end[j] is not None for j in tasks[q[h]].after) else None
                 for q, h in zip(queues, head)]
        comp, comm = ready
        if comp is None and comm is None:
            raise ValueError("the tasks wait on each other in a cycle")
        rate = efficiency if comp is not None else 1.0  # the transfer's pace beside compute, or alone
        pace = compute_pace if comm is not None else 1.0  # the compute's pace beside a transfer, or alone
        if comm is not None and left[comm] <= 0.0:  # an empty transfer ends at once, whatever its pace
            step = 0.0
        elif comm is None:
            step = left[comp]
        elif comp is None or rate > 0 and left[comm] / rate < left[comp] / pace:
            step = left[comm] / rate
        else:  # the compute ends first (or efficiency 0: the transfer waits for it)
            step = left[comp] / pace
        now += step
        if comp is not None:
            left[comp] -= step * pace
            if left[comp] <= 1e-15 * max(1.0, tasks[comp].seconds):
                end[comp], left[comp] = now, 0.0
                head[COMPUTE] += 1
        if comm is not None:
            left[comm] -= step * rate
            if left[comm] <= 1e-15 * max(1.0, tasks[comm].seconds):
                end[comm], left[comm] = now, 0.0
                head[COMM] += 1
    return [e if e is not None else 0.0 for e in end]


__all__ = ["COMM", "COMPUTE", "Task", "run_streams"]
