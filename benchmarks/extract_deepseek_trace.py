"""Summarise DeepSeek's published H800 training trace into tests/data/deepseek_profile_train.json.

    python benchmarks/extract_deepseek_trace.py path/to/train.json [-o tests/data/deepseek_profile_train.json]

The trace (deepseek-ai/profile-data, train.json: PyTorch profiler, Chrome trace format) holds one DualPipe step
of a forward chunk and a backward chunk of 4 DeepSeek-V3 MoE layers each (EP64, TP1, 4K sequences, balanced
routing) on an H800. DeepEP's dispatch and combine kernels (dpsk::ep::) run on their own stream, on SMs the
persistent grouped GEMMs leave (those launch one block per SM on 112 of the 132); everything else is compute,
mostly on one stream (its weight-gradient GEMMs on another). The summary gives, per layer (forward + backward):
the flash-attention kernels, the FP8 quantisation kernels (casts to FP8 and FP8 transposes; not the
dequantising cast-backs, not the SwiGLU fused with a cast), and all compute kernels, also with the grouped
GEMMs scaled to all 132 SMs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LAYERS = 4  # MoE layers per chunk; the trace holds one forward and one backward chunk
SMS = 132  # H800 SXM5
SOURCE = {"repo": "deepseek-ai/profile-data", "path": "train.json",
          "commit": "449602428a1b023acb8a505d4f34fef536535db6", "date": "2025-03-21"}
CONFIG = {"model": "deepseek-v3", "tp": 1, "ep": 64, "seq_len": 4096, "micro_batch": 1, "layers_per_chunk": LAYERS,
          "routing": "balanced"}


def blocks(event: dict) -> int:
    x, y, z = (event.get("args", {}).get("grid") or [1, 1, 1])[:3]
    return x * y * z


def is_quantise(name: str) -> bool:
    """A kernel that writes FP8 copies of a 16-bit tensor, or transposes an FP8 one."""
    if "swiglu" in name or "cast_back" in name:
        return False
    return "cast_to_fp8" in name or "cast_and_transpose" in name or "transpose<" in name


def summarise(trace: dict) -> dict:
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "dpsk::ep::" not in e["name"]]
    grouped = [e for e in kernels if "grouped_gemm" in e["name"] and "transpose" not in e["name"]]
    gemm_blocks = max(blocks(e) for e in grouped)
    busy = sum(e["dur"] for e in kernels)
    persistent = sum(e["dur"] for e in grouped if blocks(e) == gemm_blocks)
    attn_fwd = [e["dur"] for e in kernels if "compute_attn_ws" in e["name"]]
    attn_bwd = sum(e["dur"] for e in kernels if "FlashAttnBwd" in e["name"])  # main kernel, pre- and post-process
    per_layer = 1e-3 / LAYERS  # us in the trace -> ms per layer
    return {
        "about": "DeepSeek's published H800 training trace, summarised per DeepSeek-V3 layer (forward + backward) "
                 "by benchmarks/extract_deepseek_trace.py: DeepSeek's own kernels (FP8 GEMMs with 1x128 and "
                 "128x128 scaling, FlashAttention-3-style MLA kernels), DeepEP's left out. Read by "
                 "tests/test_deepseek_trace.py.",
        "source": SOURCE,
        "config": CONFIG,
        "device": trace["deviceProperties"][0]["name"],
        "sms": SMS,
        "gemm_sms": gemm_blocks,
        "attention_calls": len(attn_fwd),
        "per_layer_ms": {
            "attention_forward": round(sum(attn_fwd) * per_layer, 3),
            "attention_backward": round(attn_bwd * per_layer, 3),
            "fp8_quantise": round(sum(e["dur"] for e in kernels if is_quantise(e["name"])) * per_layer, 3),
            "compute": round(busy * per_layer, 3),
            "compute_full_sms": round((busy - persistent * (1 - gemm_blocks / SMS)) * per_layer, 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=None, help="write the summary here (default: print it)")
    args = ap.parse_args(argv)
    text = json.dumps(summarise(json.loads(args.trace.read_text(encoding="utf-8"))), indent=1) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
