"""Time `hyperplan plan` end to end (graph build, import, search, final estimate) on the issue's cases, with the
work it took (nodes: costings and scored strategies) and how close the plan is proven to be (gap to the bound).

Run: python benchmarks/bench_plan.py [--quick] [--mpmd] [--time-limit S] [--cluster NAME] [--stack NAME] [MODEL ...]
Wall time depends on the machine and what else runs on it (the header prints the load average, the cpu column
the process's own time); the nodes and the plan do not. `--time-limit` (default 600 s) stops a row's search,
which is then marked INCOMPLETE with the gap it had proven.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, installed or not

from planner.api import plan_model  # noqa: E402

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x22b", "deepseek-v3", "qwen3-235b-a22b")
SIZES = {"cloudmatrix384": (64, 384, 768), "dgx-h100": (64, 1024), "gb200-nvl72": (72, 576)}
SEQ = 4096


def cases(models):
    for model in models:
        for cluster, counts in SIZES.items():
            for n in counts:
                yield model, cluster, n, 4 * n


def _option(name: str, default: str | None) -> str | None:
    if name in sys.argv:
        i = sys.argv.index(name)
        value = sys.argv[i + 1]
        del sys.argv[i:i + 2]
        return value
    return default


def main() -> None:
    limit = float(_option("--time-limit", "600"))
    only = _option("--cluster", None)
    stack = _option("--stack", None)  # None: each preset's default
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    models = args or (MODELS[:1] if "--quick" in sys.argv else MODELS)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
          f"--time-limit {limit:g} s per row" + (f"; --stack {stack}" if stack else ""))
    print(f"{'model':<16}{'cluster':<16}{'devices':>8}{'wall s':>9}{'cpu s':>8}{'nodes':>7}{'gap':>8}  plan (step s, MFU)")
    for model, cluster, devices, batch in cases(models):
        if only and cluster != only:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            r = plan_model(model, cluster=cluster, devices=devices, global_batch=batch, seq_len=SEQ,
                           time_limit_s=limit, mpmd="--mpmd" in sys.argv, stack=stack)
        except Exception as exc:  # noqa: BLE001 - one case's failure is a row, not the end of the table
            print(f"{model:<16}{cluster:<16}{devices:>8}  {type(exc).__name__}: {exc}"[:160])
            continue
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        sr, est = r["search"], r["estimate"]
        gap = f"{100 * sr['gap']:.2f}%" if sr.get("gap") is not None else "-"
        print(f"{model:<16}{cluster:<16}{devices:>8}{wall:>9.2f}{cpu:>8.2f}{sr['nodes']:>7}{gap:>8}  "
              f"{r['strategy']['summary']} ({est['step_time_s']:.3g} s, MFU {est['mfu']:.1%})"
              + ("" if sr["complete"] else " INCOMPLETE"), flush=True)


if __name__ == "__main__":
    main()
