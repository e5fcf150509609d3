"""How much of a transfer stays on the critical path when it runs beside compute.

exposed = max(tail, transfer - efficiency * window), never more than the transfer
itself. The DP gradient reduction overlaps with the backward pass: buckets are
reduced while later layers still compute their gradients (PyTorch DDP, Li et
al. VLDB 2020, section 3.2.3), but the last bucket can only start when the
backward ends (the `tail`), and overlapped communication slows compute
(shared memory bandwidth, SM/AI-core contention), which the `efficiency` knob
from the hardware file stands for (1 = perfect hiding).
"""

from __future__ import annotations

from cost_models.spec import Cluster


def exposed_s(transfer_s: float, window_s: float, efficiency: float = 1.0, tail_s: float = 0.0) -> float:
    """Part of `transfer_s` not hidden behind `window_s` of compute (see the module docstring)."""
    if transfer_s < 0 or window_s < 0 or tail_s < 0:
        raise ValueError(f"times must be >= 0, got transfer {transfer_s}, window {window_s}, tail {tail_s}")
    if not 0.0 <= efficiency <= 1.0:
        raise ValueError(f"overlap efficiency must lie in [0, 1], got {efficiency}")
    return min(transfer_s, max(tail_s, transfer_s - efficiency * window_s))


def exposed_dp_reduction_s(
    cluster: Cluster, reduction_s: float, backward_s: float, last_bucket_s: float = 0.0
) -> float:
    """Exposed DP gradient reduction: hidden behind the backward pass at the cluster's overlap efficiency."""
    return exposed_s(reduction_s, backward_s, cluster.dp_overlap_efficiency, last_bucket_s)


def shared_window_exposed(transfers: list[tuple[float, float]], window_s: float, efficiency: float = 1.0) -> list[float]:
    """Exposed part of each of several transfers overlapped with one stretch of compute.

    `transfers` are (seconds, own window): each can hide only behind the compute it runs beside (its own
    window, at most `window_s`), and together they can hide no more than `efficiency * window_s`, the
    compute they all run beside: overlaps share one window. What exceeds the shared window is exposed,
    split over the transfers pro rata to what each hid.
    """
    if window_s < 0 or not 0.0 <= efficiency <= 1.0:
        raise ValueError(f"need window >= 0 and efficiency in [0, 1], got {window_s} and {efficiency}")
    own = [exposed_s(t, min(w, window_s), efficiency) for t, w in transfers]
    hidden = [t - e for (t, _), e in zip(transfers, own)]
    total = sum(hidden)
    room = efficiency * window_s
    if total <= room or total <= 0:
        return own
    excess = total - room
    return [e + excess * h / total for e, h in zip(own, hidden)]
