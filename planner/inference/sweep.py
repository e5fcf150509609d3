"""What-if sweeps of serving: the best serving plan of a model at each (cluster, device count).

The machinery is the training sweep's (`planner.whatif`): points planned in
worker processes, cached on disk by a hash of every input; only the record
kept per point and the figures derived across points differ.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from planner.errors import HyperplanError, Infeasible
from planner.model_source import display_name
from planner.whatif import Progress, Sweep, sweep_points

_INFER_NUMBERS = ("requests_per_s", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device",
                  "output_tokens_per_s_per_device", "ttft_ms", "tpot_ms", "prefill_devices", "decode_devices")


def infer_point(task: Mapping[str, Any]) -> dict[str, Any]:
    """Plan serving at one point (in a worker process): the record `whatif --mode infer` keeps."""
    from planner.api import plan_inference

    try:
        r = plan_inference(task["model"], cluster=task["cluster"], devices=task["devices"],
                           prompt_len=task["prompt_len"], gen_len=task["gen_len"], batch=task["batch"],
                           ttft_ms=task["ttft_ms"], tpot_ms=task["tpot_ms"], dtype=task["dtype"],
                           kv_dtype=task["kv_dtype"], overrides=task["overrides"], dims=task["dims"],
                           memory_gib=task["memory_gib"])
    except Infeasible as exc:
        return _empty_infer("infeasible", str(exc))
    except HyperplanError as exc:
        return _empty_infer("raise", str(exc))
    except Exception as exc:  # noqa: BLE001 - a planner bug at one point must not lose the others
        return _empty_infer("error", f"the planner failed: {type(exc).__name__}: {exc}")
    pre, dec = r["prefill"], r["decode"]
    plan = (f"P{pre['devices']} {pre['strategy']['summary']} / D{dec['devices']} {dec['strategy']['summary']}"
            if r["serving"] == "disaggregated" else f"co-located {dec['strategy']['summary']}")
    return {**_empty_infer("ok", None), "plan": plan, "serving": r["serving"], "params": r["model"]["params"],
            "prefill_devices": pre["devices"], "decode_devices": dec["devices"],
            **{k: r[k] for k in ("requests_per_s", "prefill_tokens_per_s_per_device", "decode_tokens_per_s_per_device",
                                 "output_tokens_per_s_per_device", "ttft_ms", "tpot_ms")}}


def run_infer_sweep(
    model: str | os.PathLike,
    *,
    clusters: Sequence[str],
    devices: Sequence[int],
    prompt_len: int,
    gen_len: int,
    batch: int | None = None,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    overrides: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    memory_gib: float | None = None,
    use_cache: bool = True,
    cache: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Sweep:
    """Plan serving of `model` at every (cluster, device count); `.doc` is what `whatif --mode infer --json`
    prints. Scaling compares output tokens/s per device with the smallest point that serves."""
    from planner.inference.serve import serving_options

    serving_options(prompt_len=prompt_len, gen_len=gen_len, batch=batch, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                    dtype=dtype, kv_dtype=kv_dtype, offload=True)  # checks the options once, before any work
    clusters = tuple(dict.fromkeys(clusters))
    base = {"mode": "infer", "prompt_len": prompt_len, "gen_len": gen_len, "batch": batch, "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms, "dtype": dtype, "kv_dtype": kv_dtype, "memory_gib": memory_gib,
            "overrides": dict(sorted((overrides or {}).items())), "dims": dict(sorted((dims or {}).items()))}
    points, computed = sweep_points(model, clusters, devices, base, _empty_infer, use_cache=use_cache, cache=cache,
                                    workers=workers, progress=progress)
    return Sweep(doc=_summarise_infer(model, clusters, points, base), computed=computed)


def _empty_infer(status: str, reason: str | None) -> dict[str, Any]:
    """A point's record before (or without) a plan: every figure None."""
    return {"status": status, "reason": reason, "plan": None, "serving": None, "params": None,
            **dict.fromkeys(_INFER_NUMBERS)}


def _checked(cluster: str) -> str | None:
    """How far off serving estimates on `cluster` may be (`planner.inference.deployments`), one sentence."""
    from cost_models import load_cluster

    from planner.inference.deployments import serving_accuracy

    return serving_accuracy(load_cluster(cluster))["sentence"]


def _summarise_infer(model: Any, clusters: Sequence[str], points: list[dict[str, Any]],
                     base: Mapping[str, Any]) -> dict[str, Any]:
    params = next((p["params"] for p in points if p["params"] is not None), None)
    header = []
    for name in clusters:
        mine = [p for p in points if p["cluster"] == name]
        ok = [p for p in mine if p["status"] == "ok"]
        for p in mine:
            p.pop("params", None)
            # Scaling: output tokens/s per device against the smallest point that serves (1.0 = linear).
            p["scaling_efficiency"] = (p["output_tokens_per_s_per_device"] / ok[0]["output_tokens_per_s_per_device"]
                                       if p["status"] == "ok" else None)
        header.append({"name": name, "baseline_devices": ok[0]["devices"] if ok else None,
                       "checked": _checked(name) if ok else None})
    workload = {k: base[k] for k in ("mode", "prompt_len", "gen_len", "batch", "ttft_ms", "tpot_ms", "dtype",
                                     "kv_dtype")}
    return {"model": {"name": display_name(model), "params": params, "overrides": base["overrides"]},
            "workload": workload, "memory_gib": base["memory_gib"], "clusters": header, "points": points}
