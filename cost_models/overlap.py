"""How much of a transfer stays on the critical path when it runs beside compute.

A transfer runs at full rate beside compute and slows it (its kernels take SMs
or AI cores and memory bandwidth): while it runs, the compute advances at
`efficiency` of its pace. So of a transfer of t seconds beside w seconds of
compute, (1 - efficiency) t shows, or t - w when the transfer outlasts even the
slowed compute: exposed = max((1 - efficiency) t, t - w) (`cost_models.streams`
runs the same two streams task by task). The DP gradient reduction overlaps with the backward pass:
buckets are reduced while later layers still compute their gradients (PyTorch
DDP, Li et al. VLDB 2020, section 3.2.3), but the last bucket can only start
when the backward ends (the `tail`), and runs alone. `efficiency` is the
hardware file's `overlap` (1 = perfect hiding), fitted where a hardware has
enough runs. It was a cap before (at most that share of the window could
hide anything), which fitted Grand Teton's H100s at 0.48, as if communication
could run beside only half of the compute; the cap left the FP8 405B rows
there, whose compute shrinks beside unchanged FSDP traffic, 18-21 % slow.
"""

from __future__ import annotations

from cost_models.spec import Cluster


def exposed_s(transfer_s: float, window_s: float, efficiency: float = 1.0, tail_s: float = 0.0) -> float:
    """Part of `transfer_s` not hidden behind `window_s` of compute (see the module docstring)."""
    if transfer_s < 0 or window_s < 0 or tail_s < 0:
        raise ValueError(f"times must be >= 0, got transfer {transfer_s}, window {window_s}, tail {tail_s}")
    if not 0.0 <= efficiency <= 1.0:
        raise ValueError(f"overlap efficiency must lie in [0, 1], got {efficiency}")
    tail = min(tail_s, transfer_s)  # runs alone, after the compute
    beside = transfer_s - tail
    return tail + max((1.0 - efficiency) * beside, beside - window_s)


def exposed_dp_reduction_s(
    cluster: Cluster, reduction_s: float, backward_s: float, last_bucket_s: float = 0.0
) -> float:
    """Exposed DP gradient reduction: hidden behind the backward pass at the cluster's overlap efficiency."""
    return exposed_s(reduction_s, backward_s, cluster.dp_overlap_efficiency, last_bucket_s)


def shared_window_exposed(transfers: list[tuple[float, float]], window_s: float, efficiency: float = 1.0) -> list[float]:
    """Exposed part of each of several transfers overlapped with one stretch of compute.

    `transfers` are (seconds, own window): each runs beside at most the compute it is issued with (its own
    window, at most `window_s`), and together they run beside no more than `window_s`, the compute they all
    share (overlaps share one window: what exceeds it is taken from each pro rata to what it ran beside).
    What runs beside compute shows as `exposed_s` says.
    """
    if window_s < 0 or not 0.0 <= efficiency <= 1.0:
        raise ValueError(f"need window >= 0 and efficiency in [0, 1], got {window_s} and {efficiency}")
    beside = [min(t, w) for t, w in transfers]  # beyond its own window a transfer runs alone, exposed
    total = sum(beside)
    if total <= 0:
        return [t for t, _ in transfers]
    shown = exposed_s(total, window_s, efficiency)  # of what runs beside the shared window, split pro rata
    return [t - b + shown * b / total for (t, _), b in zip(transfers, beside)]
