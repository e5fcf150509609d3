"""The Adam step moves the bytes of the stack's own state widths: the gradient read, the optimizer states (master
weights and moments) read and written, the model weights read and written. Hand counts for each shipped stack,
and the step's time on an H100 following those bytes where it is bound by HBM.
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from planner.costing.execution import load_execution
from planner.costing.node_times import adam_bytes_per_param, optimizer_step_s
from planner.strategy import Workload


@pytest.mark.parametrize("stack, expected", [
    ("megatron-2021", 2 * 2 + 4 + 2 * 12),  # bf16 weights, fp32 gradients, fp32 master + m + v: 32 bytes
    ("megatron-core", 2 * 2 + 2 + 2 * 12),  # bf16 gradients (NeMo's grad_reduce_in_fp32 = False): 30
    ("torchtitan", 2 * 4 + 4 + 2 * 8),  # FSDP2's fp32 sharded weights are the master copy; m and v: 28
    ("automodel", 2 * 2 + 2 + 2 * 4),  # bf16 weights, gradients and moments: 14
])
def test_adam_bytes_follow_the_stack_state_widths(stack, expected):
    assert adam_bytes_per_param(load_execution(stack)) == expected


def test_bf16_moments_shorten_the_step_by_their_bytes():
    """A precision-aware optimizer (bf16 moments: 8 bytes of state, DeepSeek-V3's Megatron-Bridge recipe) moves
    24 bytes a parameter where fp32 moments move 32 (Megatron-LM's fp32 gradients): on 1e9 parameters the step is
    bound by HBM, so it takes three quarters of the time, to within the kernels' fixed overhead."""
    cluster = load_cluster("dgx-h100")
    fp32 = dataclasses.replace(load_execution("megatron-core"), grad_bytes=4.0, optimizer_bytes=12.0)
    bf16 = dataclasses.replace(fp32, optimizer_bytes=8.0)
    t32 = optimizer_step_s(cluster, Workload(global_batch=8, seq_len=4096, dtype="bf16", execution=fp32), 1e9)
    t24 = optimizer_step_s(cluster, Workload(global_batch=8, seq_len=4096, dtype="bf16", execution=bf16), 1e9)
    assert t24 / t32 == pytest.approx(24 / 32, rel=0.01)
    # 32 GB at H100's 3.35 TB/s is 9.6 ms before the memory efficiency; the step takes no less
    assert 0.0096 < t32 < 0.02
