"""Exporter of a serving declaration to vLLM: `vllm serve` command lines, one per server.

Flags are EngineArgs' (vllm/engine/arg_utils.py at vllm-project/vllm@99d7eb5; pinned in
tests/data/vllm_engine_args.json): --tensor-parallel-size, --pipeline-parallel-size,
--data-parallel-size, and for a MoE model --enable-expert-parallel, which puts the
experts over EP = TP x DP ranks, the ranks the declaration folds them over (vLLM's
linear placement gives the first E mod EP ranks one expert more, as the declaration
does, so uneven ranges are written as they are); --max-num-seqs (a replica's batch:
each data-parallel rank schedules its own), --max-num-batched-tokens for a prefill
batch, --max-model-len, --dtype, --kv-cache-dtype fp8, --quantization fp8 for FP8
weights. Disaggregated phases are two servers joined by vLLM's NIXL connector
(--kv-transfer-config, kv_role kv_producer on prefill and kv_consumer on decode);
a proxy in front sends each request to both (vLLM's disaggregated-prefill examples).
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import launch, serving_launch as sl

SUFFIX = ".sh"
SOURCE = "vllm-project/vllm@99d7eb5 vllm/engine/arg_utils.py"
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16", "int8": "bfloat16", "fp32": "float32"}
_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


def _argv(sv: sl.Serving, p: sl.Phase) -> list[str]:
    words = ["vllm", "serve", '"$MODEL"', "--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp),
             "--data-parallel-size", str(p.dp)]
    if p.experts:
        words.append("--enable-expert-parallel")
    words += ["--max-num-seqs", str(p.batch), "--max-model-len", str(sv.prompt_len + sv.gen_len)]
    if p.name == "prefill" or sv.colocated:
        prefill = next(q for q in sv.phases if q.name == "prefill")
        words += ["--max-num-batched-tokens", str(max(prefill.batch * sv.prompt_len, sv.prompt_len))]
    words += ["--dtype", _DTYPES[sv.dtype]]
    if sv.dtype == "fp8":
        words += ["--quantization", "fp8"]
    if sv.kv_dtype == "fp8":
        words += ["--kv-cache-dtype", "fp8"]
    if not sv.colocated:
        words += ["--kv-transfer-config", sl.as_json({"kv_connector": "NixlConnector", "kv_role": _ROLES[p.name]})]
    return words


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The vLLM commands (one per server) as data; InvalidInput, one sentence, for what vLLM cannot serve."""
    sv = sl.serving(doc, "vllm")
    launch.refuse("vllm", sl.common_problems(sv))
    notes = sl.override_notes(doc)
    if sv.dtype == "int8":
        notes.append("int8 weights: serve an int8 (w8a8) checkpoint; vLLM reads its quantization from the "
                     "checkpoint's config")
    node = launch.node_size(doc, base_dir)
    if node and any(p.devices > node for p in sv.servers):
        notes.append(f"a server of more than {node} devices spans nodes: vLLM runs it over Ray "
                     "(--distributed-executor-backend ray), or one launch per node with --data-parallel-size-local")
    if not sv.colocated:
        notes.append("give each server its own --port and put a proxy in front that sends a request to prefill, "
                     "then decode (vLLM's disaggregated-prefill examples)")
    commands = [{"phase": "both" if sv.colocated else p.name, "ranks": [p.first, p.first + p.devices - 1],
                 "argv": _argv(sv, p)} for p in sv.servers]
    return launch.Written(config={"mode": "co-located" if sv.colocated else "disaggregated", "commands": commands},
                          notes=tuple(notes))


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    w = written(doc, base_dir)
    return sl.render(sl.serving(doc, "vllm"), f"vLLM servers ({SOURCE} flags)", w.config["commands"], list(w.notes))
