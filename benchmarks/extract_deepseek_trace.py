"""Summarise DeepSeek's published H800 training trace into tests/data/deepseek_profile_train.json.

    python benchmarks/extract_deepseek_trace.py path/to/train.json [-o tests/data/deepseek_profile_train.json]

The trace (deepseek-ai/profile-data, train.json: PyTorch profiler, Chrome trace format) holds one DualPipe step
of a forward chunk and a backward chunk of 4 DeepSeek-V3 MoE layers each (EP64, TP1, 4K sequences, balanced
routing) on an H800. Its compute kernels run on one stream; DeepEP's dispatch and combine run on others, on SMs
the compute kernels leave free (the persistent GEMMs launch one block per SM on 112 of the 132). The summary
gives, per layer (forward + backward), what the compute stream was busy with: the attention kernels, the FP8
casts, everything, and everything with the persistent GEMMs scaled to all 132 SMs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LAYERS = 4  # MoE layers per chunk; the trace holds one forward and one backward chunk
SMS = 132  # H800 SXM5


def blocks(event: dict) -> int:
    x, y, z = (event.get("args", {}).get("grid") or [1, 1, 1])[:3]
    return x * y * z


def summarise(trace: dict) -> dict:
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    streams: dict[int, float] = {}
    for e in kernels:
        streams[e["tid"]] = streams.get(e["tid"], 0.0) + e["dur"]
    compute = max(streams, key=streams.get)  # the stream with the most kernel time: the compute stream
    mine = [e for e in kernels if e["tid"] == compute]
    gemm_blocks = max((blocks(e) for e in mine if "grouped_gemm" in e["name"]), default=SMS)
    busy = sum(e["dur"] for e in mine)
    persistent = sum(e["dur"] for e in mine if blocks(e) == gemm_blocks)
    attn_fwd = [e["dur"] for e in mine if "compute_attn_ws" in e["name"]]
    attn_bwd = sum(e["dur"] for e in mine if "FlashAttnBwd" in e["name"])  # main kernel, pre- and post-process
    casts = sum(e["dur"] for e in mine if "cast" in e["name"])
    ms = 1e-3 / LAYERS
    return {
        "device": trace["deviceProperties"][0]["name"],
        "sms": SMS,
        "gemm_sms": gemm_blocks,
        "per_layer_ms": {
            "attention_forward": round(sum(attn_fwd) * ms, 3),
            "attention_backward": round(attn_bwd * ms, 3),
            "fp8_casts": round(casts * ms, 3),
            "compute_stream_busy": round(busy * ms, 3),
            "compute_stream_busy_full_sms": round((busy - persistent + persistent * gemm_blocks / SMS) * ms, 3),
        },
        "attention_calls": len(attn_fwd),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=None, help="write the summary here (default: print it)")
    args = ap.parse_args(argv)
    summary = summarise(json.loads(args.trace.read_text(encoding="utf-8")))
    text = json.dumps(summary, indent=1) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
