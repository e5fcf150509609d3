"""Import a Llama-70B-shaped graph exported dynamo-style (~15k nodes) and report wall time and peak memory.

The graph is built in memory by `tests.graphs.llama_like` (80 layers, hidden 8192, 64 heads, 8 KV heads,
FFN 28672, vocab 128256, bf16 weights as external data that is never written) and saved to a temp dir;
then `import_model(path, seq_len=4096, batch=1)` is timed, with block discovery when it exists.
Goal on the 2-core dev box: < 3 s and < 1 GiB.

    python benchmarks/bench_import.py [--layers 80] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

from planner.graph.onnx_import import import_model  # noqa: E402
from tests.graphs import llama_like, llama_like_params  # noqa: E402

LLAMA_70B = dict(hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build-into", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    args = ap.parse_args()

    if args.build_into:  # child process: build and save only, so the parent's peak RSS is the import's
        onnx.save_model(llama_like(layers=args.layers, **LLAMA_70B), args.build_into)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "llama70b_dynamo.onnx")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--layers", str(args.layers), "--build-into", path],
                       check=True)
        build_s = time.perf_counter() - t0
        size_mib = os.path.getsize(path) / 2**20
        rss_before = _rss_mib()
        try:
            from planner.graph.blocks import discover_blocks  # another engineer's; optional
        except ImportError:
            discover_blocks = None
        times, block_times = [], []
        for _ in range(args.repeat):
            if args.tracemalloc:
                tracemalloc.start()
            t0 = time.perf_counter()
            graph = import_model(path, seq_len=4096, batch=1)
            times.append(time.perf_counter() - t0)
            if discover_blocks is not None:
                t1 = time.perf_counter()
                discover_blocks(graph)
                block_times.append(time.perf_counter() - t1)
            if args.tracemalloc:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                print(f"  tracemalloc peak (Python heap): {peak / 2**20:.0f} MiB")
        expected = llama_like_params(args.layers, **LLAMA_70B)
        print(f"graph: {len(graph.nodes)} nodes, {len(graph.tensors)} tensors, file {size_mib:.1f} MiB "
              f"(built in {build_s:.1f} s), weights external and absent")
        print(f"params: {graph.param_count / 1e9:.2f} B (analytic {expected / 1e9:.2f} B), "
              f"{graph.param_bytes / 2**30:.1f} GiB bf16; forward {graph.flops / 1e12:.1f} TFLOPs at 1x4096; "
              f"unknown ops: {dict(graph.unknown_ops()) or 'none'}")
        print(f"import_model: best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s "
              f"over {len(times)} runs")
        if block_times:
            print(f"discover_blocks: best {min(block_times):.2f} s")
        print(f"peak RSS: {_rss_mib():.0f} MiB (before importing: {rss_before:.0f} MiB)")


if __name__ == "__main__":
    main()
