"""Bytes a device must hold: model states by ZeRO stage, activations by recompute policy, KV cache.

Model states follow Rajbhandari et al. 2020 (ZeRO, section 3.1, 5.1): mixed
precision Adam keeps 2 B of fp16/bf16 parameters, 2 B of gradients and K = 12 B
of fp32 master weights, momentum and variance per parameter; stage 1 shards
the optimizer states over the DP group, stage 2 also the gradients, stage 3
also the parameters. Megatron-LM accumulates gradients in fp32 (4 B), which
is why Korthikanti 2022 counts 18 B per parameter (see `MEGATRON_ADAM`).

Activations follow Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", sections 4-5 and Table 2, which
assume 16-bit activations and 1-byte dropout masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter of each model state."""

    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 12.0


MIXED_ADAM = StateBytes()  # ZeRO paper: 2 + 2 + K=12 = 16 B per parameter
MEGATRON_ADAM = StateBytes(grad_bytes=4.0)  # fp32 gradient accumulation: 18 B per parameter


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStateMemory:
    """Per-device bytes of parameters, gradients and optimizer states."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(
    n_params: float, *, zero_stage: int = 0, dp: int = 1, state: StateBytes = MIXED_ADAM
) -> ModelStateMemory:
    """Model states of `n_params` parameters (already split by TP/PP) on one device of a DP group of `dp`.

    ZeRO stage s shards over dp: optimizer states for s >= 1, gradients for s >= 2,
    parameters for s >= 3 (Rajbhandari 2020, Figure 1).
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if dp < 1 or n_params < 0:
        raise ValueError(f"need dp >= 1 and n_params >= 0, got dp={dp}, n_params={n_params}")
    return ModelStateMemory(
        params_bytes=n_params * state.param_bytes / (dp if zero_stage >= 3 else 1),
        grads_bytes=n_params * state.grad_bytes / (dp if zero_stage >= 2 else 1),
        optimizer_bytes=n_params * state.optimizer_bytes / (dp if zero_stage >= 1 else 1),
    )


def activation_bytes_per_layer(
    *, seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1, sp: bool = False, recompute: Recompute = "none"
) -> float:
    """Activation bytes one transformer layer keeps for its backward pass, per device (Korthikanti 2022).

    no recompute, TP without SP : s*b*h * (10 + 24/t + 5*a*s/(h*t))   (t = 1: s*b*h * (34 + 5as/h), section 4.1)
    no recompute, TP with SP    : s*b*h/t * (34 + 5*a*s/h)             (section 4.2.2)
    selective recompute         : the 5as/h attention term is recomputed, so it drops out (34 sbh/t with SP, section 5)
    full recompute              : only the layer input, 2*s*b*h (divided by t when SP shards it; Table 2)
    """
    if min(seq, micro_batch, hidden, heads, tp) < 1:
        raise ValueError("seq, micro_batch, hidden, heads and tp must all be >= 1")
    sbh = float(seq) * micro_batch * hidden
    attention = 5.0 * heads * seq / hidden
    if recompute == "full":
        return 2.0 * sbh / (tp if sp else 1)
    if recompute not in ("none", "selective"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    scores = attention if recompute == "none" else 0.0
    if sp:
        return sbh / tp * (34.0 + scores)
    return sbh * (10.0 + 24.0 / tp + scores / tp)


def inflight_microbatches(
    schedule: PipelineSchedule, *, pp: int, microbatches: int, stage: int = 0, virtual_stages: int = 1
) -> float:
    """Micro-batches whose activations stage `stage` (0 = first) holds at its peak, in units of its whole layers.

    GPipe keeps all m. 1F1B keeps min(p - i, m) (Narayanan 2021, section 2.2.1).
    Interleaved 1F1B with v chunks keeps 2(p-i-1) + (v-1)p + 1 chunks of 1/v of
    the stage (Megatron-LM's warm-up count), which for the first stage is
    p * (1 + (p-1)/(p*v)): Korthikanti 2022's factor (section 4.2.3).
    """
    if pp < 1 or microbatches < 1 or virtual_stages < 1 or not 0 <= stage < pp:
        raise ValueError(f"need pp, microbatches, virtual_stages >= 1 and 0 <= stage < pp; got {pp}, {microbatches}, "
                         f"{virtual_stages}, {stage}")
    if schedule == "gpipe":
        return float(microbatches)
    if schedule == "1f1b" or (schedule == "interleaved" and virtual_stages == 1):
        return float(min(pp - stage, microbatches))
    if schedule == "interleaved":
        chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, microbatches * virtual_stages)
        return chunks / virtual_stages
    raise ValueError(f"unknown pipeline schedule {schedule!r}; expected gpipe, 1f1b or interleaved")


def pipeline_activation_bytes(
    per_layer_bytes: float,
    layers_per_stage: float,
    schedule: PipelineSchedule,
    *,
    pp: int,
    microbatches: int,
    stage: int = 0,
    virtual_stages: int = 1,
) -> float:
    """Peak activation bytes of one pipeline stage: per-layer bytes x its layers x micro-batches in flight."""
    held = inflight_microbatches(schedule, pp=pp, microbatches=microbatches, stage=stage, virtual_stages=virtual_stages)
    return per_layer_bytes * layers_per_stage * held


def kv_cache_bytes(
    *, layers: int, kv_heads: int, head_dim: int, seq: int, batch: int, bytes_per_value: float = 2.0
) -> float:
    """Keys and values of every layer: 2 * layers * kv_heads * head_dim * seq * batch * bytes
    (GQA/MQA cache kv_heads < heads; Vaswani 2017, Ainslie 2023)."""
    return 2.0 * layers * kv_heads * head_dim * seq * batch * bytes_per_value


def mla_kv_cache_bytes(*, layers: int, kv_lora_rank: int, rope_dim: int, seq: int, batch: int,
                       bytes_per_value: float = 2.0) -> float:
    """Multi-head latent attention caches one compressed latent plus the shared RoPE key per token:
    (kv_lora_rank + rope_dim) * layers * seq * batch * bytes (DeepSeek-V2, Liu et al. 2024, section 2.1)."""
    return float(kv_lora_rank + rope_dim) * layers * seq * batch * bytes_per_value
