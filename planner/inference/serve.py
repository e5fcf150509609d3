"""`plan_inference`: a model (ONNX file or zoo name) served on a cluster, from the user's options to the report.

The graph is imported once at a short sequence (`PROFILE_SEQ`) and batch 1
and profiled per token (see `profile`); profiles are kept for the process so
that a what-if sweep profiles a model once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Mapping

from cost_models import Cluster

from planner.caveats import attention_assumptions, hardware_assumptions, head_dim_assumptions
from planner.errors import InvalidInput
from planner.model_source import content_file, display_name, kind_of
from planner.inference.deployments import serving_accuracy
from planner.inference.phase_cost import ENGINE_KERNELS, SERVING_DTYPES, Precision, serving_attention_kernel
from planner.inference.plan import ServingPlan, plan_dict, plan_serving
from planner.inference.profile import Profile, serving_profile
from planner.inference.search import Serving
from planner.costing.stage_costs import DTYPE_WIDTH

#: Sequence length an ONNX file's symbolic sequence dims are bound to for profiling: long enough that every
#: routed expert gets whole tokens under balanced routing (T*k/E >= 1 for E up to 256), short enough to import
#: fast. Zoo models are built at their own sequence length, which leaves multimodal models room for text.
PROFILE_SEQ = 256
_PROFILES: dict[tuple, Profile] = {}


def load_profile(model: str | os.PathLike, dims: Mapping[str, int] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Profile:
    """The serving profile of a model, remembered for the process (files keyed by size and mtime)."""
    from planner.api import _graph_for_costing
    from planner.graph.blocks import discover_blocks

    text = os.fspath(model)
    path = content_file(text)
    st = os.stat(path) if path else None
    stamp = (st.st_size, st.st_mtime_ns) if st is not None else None
    key = (text, stamp, tuple(sorted((dims or {}).items())), tuple(sorted((overrides or {}).items())))
    if key not in _PROFILES:
        graph = _graph_for_costing(model, profile_seq(model), dims, overrides)
        if len(_PROFILES) >= 4:
            _PROFILES.pop(next(iter(_PROFILES)))
        _PROFILES[key] = serving_profile(graph, discover_blocks(graph))
    return _PROFILES[key]


def profile_seq(model: str | os.PathLike) -> int | None:
    """The sequence length a model's graph is imported at for its profile (None: a zoo model's or a config.json's
    own)."""
    return PROFILE_SEQ if kind_of(model) == "onnx" else None


def serving_options(*, prompt_len: int, gen_len: int, batch: int | None, ttft_ms: float | None,
                    tpot_ms: float | None, dtype: str, kv_dtype: str, offload: bool,
                    even_experts: bool = True) -> Serving:
    """Check the user's serving options and bundle them (one clear sentence for each mistake)."""
    if batch is not None and (ttft_ms is not None or tpot_ms is not None):
        raise InvalidInput("give either --batch or the latency targets (--ttft-ms, --tpot-ms), not both: a fixed "
                           "batch sets the latencies, the targets set the batch")
    if kv_dtype not in SERVING_DTYPES:
        raise InvalidInput(f"--kv-dtype {kv_dtype}: the KV cache is kept in {', '.join(SERVING_DTYPES)}; pick one")
    prec = Precision(dtype=dtype, kv_bytes=DTYPE_WIDTH[kv_dtype])
    return Serving(prompt_len=prompt_len, gen_len=gen_len, precision=prec, batch=batch,
                   ttft_s=None if ttft_ms is None else ttft_ms / 1e3,
                   tpot_s=None if tpot_ms is None else tpot_ms / 1e3, offload=offload, even_experts=even_experts)


def plan_inference(
    model: str | os.PathLike,
    *,
    cluster: str,
    prompt_len: int,
    gen_len: int,
    devices: int | None = None,
    batch: int | None = None,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    overrides: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    memory_gib: float | None = None,
    offload: bool = True,
    disaggregate: bool = True,
    even_experts: bool = True,
) -> dict[str, Any]:
    """Plan prefill and decode of `model` on `cluster`: the dict `hyperplan plan --mode infer --json` prints.

    `batch` (sequences per data-parallel replica per step) or the targets `ttft_ms`/`tpot_ms` set the batches;
    `offload=False` keeps the KV cache in HBM; `disaggregate=False` co-locates prefill and decode;
    `even_experts=False` lets a MoE phase spread its experts over any stage width (`Serving.even_experts`).
    """
    serving = serving_options(prompt_len=prompt_len, gen_len=gen_len, batch=batch, ttft_ms=ttft_ms,
                              tpot_ms=tpot_ms, dtype=dtype, kv_dtype=kv_dtype, offload=offload,
                              even_experts=even_experts)
    hw = serving_cluster(cluster, devices, memory_gib, dtype)
    profile = load_profile(model, dims, overrides)
    plan, others = plan_serving(profile, hw, serving, disaggregate=disaggregate)
    workload = {"mode": "infer", "prompt_len": prompt_len, "gen_len": gen_len, "batch": batch,
                "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "dtype": dtype, "kv_dtype": kv_dtype}
    return serving_report(plan, others, serving, profile, model, hw, workload)


def serving_cluster(cluster: str, devices: int | None, memory_gib: float | None, dtype: str) -> Cluster:
    """The cluster to serve on (HBM capped at `memory_gib`), checked to list the peaks serving runs at."""
    from cost_models import load_cluster

    from planner.api import with_memory_cap

    hw = with_memory_cap(load_cluster(cluster, devices=devices), memory_gib)
    peaks = dict(hw.device.peak_flops_per_s)
    if dtype not in peaks:
        raise InvalidInput(f"--dtype {dtype}: {hw.device.name} lists no {dtype} peak; use one of "
                           f"{', '.join(d for d in SERVING_DTYPES if d in peaks)}")
    if "bf16" not in peaks:
        raise InvalidInput(f"{hw.device.name} lists no bf16 peak, which the attention core runs at; "
                           "add one to the hardware file")
    serving_attention_kernel(hw)  # the attention core's figures: refused here, in one sentence, if there are none
    return hw


def serving_report(plan: ServingPlan, others: list[ServingPlan], serving: Serving, profile: Profile,
                   model: str | os.PathLike, hw: Cluster, workload: Mapping[str, Any]) -> dict[str, Any]:
    """The dict `plan --mode infer --json` prints, for a plan found by the search or one re-scored from a file."""
    out = plan_dict(plan, others, serving, profile)
    out["model"] = {"name": display_name(model), "params": int(round(profile.params)),
                    "layers": len(profile.layers), "moe": profile.is_moe}
    out["cluster"] = {"name": hw.name, "devices": hw.n_devices}
    out["workload"] = dict(workload)
    dims = {(a.key_dim + a.value_dim) / 2 for part in profile.parts for a in part.attention}
    out["notes"] = serving_assumptions(hw, serving.precision.dtype, dims) + out["notes"]
    out["accuracy"] = serving_accuracy(hw)
    return out


def serving_assumptions(hw: Cluster, dtype: str, head_dims: Iterable[float] = ()) -> list[str]:
    """What a serving estimate on `hw` assumes: the hardware's unfitted parameters, and the attention figures (a
    kernel other than the engine's own standing in, what the preset says of that kernel's figures, and of heads
    narrower than 128 among `head_dims`)."""
    kernel = serving_attention_kernel(hw)
    stand_in = [] if kernel in ENGINE_KERNELS else [
        f"{hw.name}'s {kernel} figures stand in for the serving engine's own attention kernel (FlashInfer in vLLM "
        "on Blackwell, a fused inference attention op on Ascend), of which no preset has figures"]
    return (hardware_assumptions(hw, dtype, serving=True) + stand_in + attention_assumptions(hw, kernel)
            + head_dim_assumptions(hw, head_dims))
