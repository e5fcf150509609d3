"""Exporter of a serving declaration to SGLang: `python -m sglang.launch_server` command lines, one per server.

Flags are ServerArgs' (python/sglang/srt/server_args.py at sgl-project/sglang@001067f;
pinned in tests/data/sglang_server_args.json). A dense phase is --tp-size tp with
--dp-size dp whole replicas (SGLang's data-parallel controller) and --pp-size; a MoE
phase whose experts span its tp x dp ranks is --tp-size tp x dp --dp-size dp
--enable-dp-attention --ep-size tp x dp: attention data-parallel in groups of tp,
the experts over all the phase's ranks, as the declaration folds them.
--max-running-requests is a replica's batch (with DP attention the DP workers share
it: dp times that). Disaggregated phases are --disaggregation-mode prefill and
decode servers (their KV transfer backend is SGLang's default, Mooncake), behind
SGLang's router (sglang_router.launch_router --pd-disaggregation). SGLang's
expert-parallel MoE needs the experts to divide by the EP size, so a phase with
uneven expert ranges is refused.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import launch, serving_launch as sl

SUFFIX = ".sh"
SOURCE = "sgl-project/sglang@001067f python/sglang/srt/server_args.py"
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16", "int8": "bfloat16", "fp32": "float32"}
_QUANT = {"fp8": "fp8", "int8": "w8a8_int8"}


def _argv(sv: sl.Serving, p: sl.Phase, node: int | None) -> list[str]:
    attention_dp = bool(p.experts) and p.dp > 1
    words = ["python", "-m", "sglang.launch_server", "--model-path", '"$MODEL"',
             "--tp-size", str(p.tp * p.dp if attention_dp else p.tp), "--pp-size", str(p.pp),
             "--dp-size", str(p.dp)]
    if attention_dp:
        words.append("--enable-dp-attention")
    if p.experts:
        words += ["--ep-size", str(p.ep)]
    words += ["--max-running-requests", str(p.batch * (p.dp if attention_dp else 1)),
              "--context-length", str(sv.prompt_len + sv.gen_len), "--dtype", _DTYPES[sv.dtype]]
    if sv.dtype in _QUANT:
        words += ["--quantization", _QUANT[sv.dtype]]
    if sv.kv_dtype == "fp8":
        words += ["--kv-cache-dtype", "fp8_e4m3"]
    per_server = p.devices // p.dp if not attention_dp else p.devices
    if node and per_server > node:
        words += ["--nnodes", str(per_server // node)]
    if not sv.colocated:
        words += ["--disaggregation-mode", p.name]
    return words


def written(doc: Mapping[str, Any], base_dir: str | None = None) -> launch.Written:
    """The SGLang commands (one per server) as data; InvalidInput, one sentence, for what SGLang cannot serve."""
    sv = sl.serving(doc, "sglang")
    problems = sl.common_problems(sv)
    problems += [(f"{p.experts} experts over {p.name}'s EP {p.ep} (SGLang's EP MoE needs them to divide)",
                  "plan without --uneven-experts") for p in sv.phases if p.experts and p.experts % p.ep]
    launch.refuse("sglang", problems)
    node = launch.node_size(doc, base_dir)
    notes = sl.override_notes(doc)
    if any(p.experts and p.dp > 1 for p in sv.servers):
        notes.append("DP attention is SGLang's for DeepSeek and Qwen MoE models")
    if any("--nnodes" in _argv(sv, p, node) for p in sv.servers):
        notes.append("a server on several nodes runs once per node with --node-rank k and --dist-init-addr of node 0")
    if not sv.colocated:
        notes.append("put SGLang's router in front: python -m sglang_router.launch_router --pd-disaggregation "
                     "--prefill http://PREFILL:PORT --decode http://DECODE:PORT")
    commands = [{"phase": "both" if sv.colocated else p.name, "ranks": [p.first, p.first + p.devices - 1],
                 "argv": _argv(sv, p, node)} for p in sv.servers]
    return launch.Written(config={"mode": "co-located" if sv.colocated else "disaggregated", "commands": commands},
                          notes=tuple(notes))


def render(doc: Mapping[str, Any], base_dir: str | None = None) -> str:
    w = written(doc, base_dir)
    return sl.render(sl.serving(doc, "sglang"), f"SGLang servers ({SOURCE} flags)", w.config["commands"],
                     list(w.notes))
