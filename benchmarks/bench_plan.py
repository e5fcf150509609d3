"""Time `hyperplan plan` end to end (graph build, import, search, final estimate) on the issue's cases.

Run: python benchmarks/bench_plan.py [--quick]
"""

from __future__ import annotations

import sys
import time

from planner.api import plan_model

CASES = [
    ("llama3-70b", "cloudmatrix384", 64, 256, 4096),
    ("llama3-405b", "cloudmatrix384", 384, 1536, 4096),
    ("deepseek-v3", "cloudmatrix384", 384, 1536, 4096),
]


def main() -> None:
    cases = CASES[:1] if "--quick" in sys.argv else CASES
    print(f"{'model':<14}{'cluster':<16}{'devices':>8}{'wall s':>9}{'evaluated':>11}  plan (step s, MFU)")
    for model, cluster, devices, batch, seq in cases:
        t0 = time.perf_counter()
        r = plan_model(model, cluster=cluster, devices=devices, global_batch=batch, seq_len=seq, time_limit_s=120)
        wall = time.perf_counter() - t0
        est = r["estimate"]
        print(f"{model:<14}{cluster:<16}{devices:>8}{wall:>9.2f}{r['search']['evaluated']:>11}  "
              f"{r['strategy']['summary']} ({est['step_time_s']:.2f} s, MFU {est['mfu']:.1%}); "
              f"layout gap {r['search']['layout_solver_gap']:.2%}")


if __name__ == "__main__":
    main()
