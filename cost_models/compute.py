"""Time of one operator on one device from its FLOPs and HBM bytes: a roofline with efficiency curves.

time = max(FLOPs / (peak * eff_flops(size)), bytes / (HBM bandwidth * eff_mem(bytes)))
(Williams, Waterman and Patterson 2009, "Roofline"; the size-dependent
efficiencies follow Calculon, Isaev et al. SC'23, which keeps matmul
efficiency by size as a table of the system). Matrix ops run on the
matrix units at the dtype's dense peak; elementwise ops (norms, softmax,
activations) run on the vector units, or are taken as bound by HBM when the
device's vector peak is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cost_models.spec import Cluster

OpKind = Literal["matmul", "elementwise"]
Phase = Literal["forward", "backward"]


def roofline_s(
    flops: float,
    bytes_moved: float,
    *,
    peak_flops_per_s: float | None,
    hbm_bytes_per_s: float,
    flops_efficiency: float = 1.0,
    memory_efficiency: float = 1.0,
) -> float:
    """max(compute time, memory time); `peak_flops_per_s=None` means the op is bound by memory only."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be >= 0, got {flops} and {bytes_moved}")
    compute = 0.0 if peak_flops_per_s is None else flops / (peak_flops_per_s * flops_efficiency)
    memory = bytes_moved / (hbm_bytes_per_s * memory_efficiency)
    return max(compute, memory)


@dataclass(frozen=True, slots=True)
class OpTime:
    """An op's time and which roof bound it, so estimates can say why an op is slow."""

    time_s: float
    compute_s: float
    memory_s: float

    @property
    def bound(self) -> Literal["compute", "memory"]:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def op_time(cluster: Cluster, flops: float, bytes_moved: float, kind: OpKind = "matmul", dtype: str = "bf16") -> OpTime:
    """Roofline time of one op on one device of `cluster`, with the cluster's efficiency curves."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be >= 0, got {flops} and {bytes_moved}")
    device = cluster.device
    memory_s = bytes_moved / (device.hbm_bytes_per_s * cluster.memory_efficiency(bytes_moved))
    if kind == "matmul":
        peak = device.peak_flops(dtype)
        if dtype == "fp8" and cluster.fp8_matmul_efficiency is not None:  # measured FP8 GEMMs: their own curve
            compute_s = flops / (peak * cluster.fp8_matmul_efficiency(flops))
        else:
            # the matmul curve is sampled against the bf16 peak (the precision it was fitted at); a faster dtype
            # reaches the same efficiency at proportionally more FLOPs per op (a fixed per-kernel overhead,
            # Hockney's n-half: n_half = t0 * plateau * peak)
            ref = dict(device.peak_flops_per_s).get("bf16", peak)
            compute_s = flops / (peak * cluster.matmul_efficiency(flops * ref / peak))
    elif kind == "elementwise":
        vector = device.vector_flops_per_s
        compute_s = 0.0 if vector is None else flops / vector
    else:
        raise ValueError(f"unknown op kind {kind!r}; expected 'matmul' or 'elementwise'")
    return OpTime(time_s=max(compute_s, memory_s), compute_s=compute_s, memory_s=memory_s)


def op_time_s(
    cluster: Cluster, flops: float, bytes_moved: float, kind: OpKind = "matmul", dtype: str = "bf16"
) -> float:
    """Seconds for one op on one device (see `op_time`)."""
    return op_time(cluster, flops, bytes_moved, kind, dtype).time_s



def copy_s(cluster: Cluster, nbytes: float) -> float:
    """Seconds of one memory-bound pass that reads `nbytes` and writes them elsewhere (a layout copy, a regroup)."""
    return op_time_s(cluster, 0.0, 2.0 * nbytes, "elementwise") if nbytes > 0 else 0.0


#: Head dim at which the devices' flash-attention figures were measured (cuDNN's and FlashAttention-3's tables).
MEASURED_HEAD_DIM = 128.0


def head_dim_factor(cluster: Cluster, head_dim: float, phase: Phase, fp8: str = "") -> float:
    """Flash attention's rate at `head_dim` (the mean of the query-key and value head dims) over its rate at head
    dim 128, where the device's figures were measured: (d / (d + D)) / (128 / (128 + D)) below 128, the device's
    measured `attention_wide_heads` above it.

    Each (query, key) score costs 4d tensor-core FLOPs forward (QK^T and PV, 10d backward) beside a fixed
    amount of other work: the exponential (on the SFU, 16 per clock per SM on Hopper and Blackwell), the
    softmax's rescaling, the masking. Only the FLOPs count as useful work, so a narrow head spends a larger share
    of its time off the tensor cores; D, the device's `attention_half_dims` for the phase, is the head dim at
    which that other work takes as long as the matmuls. Fitted on cuDNN's head-dim-64 runs on H200 beside its
    head-dim-128 ones (benchmarks/fit_attention_head_dim.py; tests/test_attention_length.py checks it). Wider
    heads do not run at the higher rate this law would give them: cuDNN runs MLA's 192-wide query-key heads (128-
    wide values) forward at head dim 128's rate and backward 10-12 % slower (its H200 and GB200 benchmarks), the
    rate the device's `attention_wide_heads` carries, taken for every head wider than 128. In FP8 (`fp8`) they run
    faster a FLOP than head dim 128 does: the device's FP8 rate for them where measured (`Cluster.wide_heads`;
    cuDNN 9.22's FP8 and MXFP8 MLA rows on GB200 and GB300, benchmarks/fit_attention_fp8.py). D = 0: the device's
    figures for every narrower head dim."""
    index = 0 if phase == "forward" else 1
    if head_dim > MEASURED_HEAD_DIM:
        return cluster.wide_heads(fp8)[index]
    d0 = cluster.attention_half_dims[index]
    if d0 <= 0 or head_dim <= 0 or head_dim == MEASURED_HEAD_DIM:
        return 1.0
    return (head_dim / (head_dim + d0)) * ((MEASURED_HEAD_DIM + d0) / MEASURED_HEAD_DIM)


def attention_time_s(cluster: Cluster, flops: float, bytes_moved: float, phase: Phase, kernel: str,
                     keys: float = 0.0, head_dim: float = MEASURED_HEAD_DIM, fp8: str = "") -> float:
    """Seconds of one fused (flash) attention kernel on one device: its FLOPs at the kernel's efficiency, a
    fraction of the bf16 peak, paying the per-kernel overhead of the device's law (t0 + F / (eff * peak); under
    the length law below, which holds it, t0 is a floor), or
    the HBM time of its inputs and output if that is longer (Dao et al. 2022, FlashAttention: the scores never
    reach HBM, so Q, K, V, O and the softmax statistics are all it moves).

    The efficiency grows with the `keys` a query row's computed tiles cover (about S/2 causal, two 128-wide
    tiles for a 128-token window), plateau * keys / (keys + K), as each row block's fixed costs (loading Q, the
    softmax epilogue, writing O) are spread over more key tiles; K is the kernel's own where the file measures it
    (`Cluster.half_keys`: FlashAttention-2's on H100), else the device's `attention_half_keys` (0, or `keys` 0: the
    plateau). Fitted on cuDNN's causal SDPA at 2K-32K tokens, head dim 128
    (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training): H200 within 3 %, GB200 within 10 %. Its sliding-
    window runs (head dim 64) at the head-dim law's rate (`head_dim_factor`); its non-causal runs (not fitted)
    within 8 % (tests/test_attention_length.py).

    With `fp8` ("fp8" or "mxfp8": Transformer Engine's fp8_dot_product_attention under a per-tensor or an MXFP8
    recipe) the kernel runs at the device's FP8 plateaus (`Cluster.attention_fp8_plateau`), fractions of its fp8
    peak, on the same length and head-dim laws: fitted on cuDNN 9.22's FP8 and MXFP8 causal runs at head dim 128 on
    GB200 and GB300 (the MLA-shaped causal runs fit the wide-head rate); held out, the non-causal runs within 22 %
    and the head-dim-64 runs at a 128-token window, whose forward comes out 28-51 % fast
    (benchmarks/fit_attention_fp8.py)."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be >= 0, got {flops} and {bytes_moved}")
    if flops == 0 and bytes_moved == 0:
        return 0.0
    if fp8:  # Transformer Engine's FP8 attention is cuDNN's kernel: cuDNN's length law
        (forward, backward), used = cluster.attention_fp8_plateau(fp8), "cudnn"
    else:  # the plateaus and the length law of one kernel: the one named, or the file's default it falls back to
        forward, backward, used = cluster.attention_plateau(kernel)
    plateau = (forward if phase == "forward" else backward) * head_dim_factor(cluster, head_dim, phase, fp8)
    half = cluster.half_keys(used)[0 if phase == "forward" else 1]
    peak = cluster.device.peak_flops("fp8" if fp8 else "bf16")
    if keys > 0 and half > 0:  # the law's K holds the kernel's fixed costs, as the benchmarks timed them: t0 a floor
        compute_s = max(cluster.kernel_overhead_s, flops / (plateau * keys / (keys + half) * peak))
    else:
        compute_s = cluster.kernel_overhead_s + flops / (plateau * peak)
    memory_s = bytes_moved / (cluster.device.hbm_bytes_per_s * cluster.memory_efficiency(bytes_moved))
    return max(compute_s, memory_s)
