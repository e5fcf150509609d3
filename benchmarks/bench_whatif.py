"""Time a what-if sweep: llama3-70b on cloudmatrix384 at 8 device counts, cold (no cache) and then cached.

Goal (issue 8): under 30 s cold on a 2-core machine. Points run in a process
pool with one worker per core; `--time-limit` caps each point's search.

Run: python benchmarks/bench_whatif.py [--time-limit S] [--workers N] [--devices LIST]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, installed or not

from planner.whatif import parse_devices, run_sweep  # noqa: E402

MODEL, CLUSTER, BATCH, SEQ = "llama3-70b", "cloudmatrix384", 256, 4096
DEVICES = "64,96,128,160,192,256,320,384"  # 8 counts that are whole nodes of the supernode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per point's search")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    ap.add_argument("--devices", default=DEVICES)
    args = ap.parse_args()
    counts = parse_devices(args.devices)
    with tempfile.TemporaryDirectory() as cache:
        kw = dict(clusters=(CLUSTER,), devices=counts, global_batch=BATCH, seq_len=SEQ,
                  time_limit_s=args.time_limit, cache=cache, workers=args.workers)
        t0 = time.perf_counter()
        cold = run_sweep(MODEL, **kw)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = run_sweep(MODEL, **kw)
        warm_s = time.perf_counter() - t0
    assert warm.doc == cold.doc and warm.computed == 0
    print(f"{MODEL} on {CLUSTER}, global batch {BATCH} x {SEQ}, {len(counts)} points, "
          f"{args.workers or os.cpu_count()} workers, time limit {args.time_limit:g} s per point, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'devices':>8} {'status':<10} {'tokens/s':>10} {'scaling':>8} {'MFU':>6}  plan")
    for p in cold.doc["points"]:
        if p["status"] == "ok":
            flag = "" if p["search_complete"] else " (search cut by the time limit)"
            print(f"{p['devices']:>8} {p['status']:<10} {p['tokens_per_s']:>10.0f} {p['scaling_efficiency']:>8.1%} "
                  f"{p['mfu']:>6.1%}  {p['plan']}{flag}")
        else:
            print(f"{p['devices']:>8} {p['status']:<10} {p['reason']}")
    print(f"wall: cold {cold_s:.1f} s ({cold.computed} points planned), cached {warm_s:.2f} s; goal < 30 s cold")


if __name__ == "__main__":
    main()
