"""Time `hyperplan plan` end to end (graph build, import, search, final estimate) on the issue's cases, with the
work it took (nodes: costings and scored strategies) and how close the plan is proven to be (gap to the bound).

Run: python benchmarks/bench_plan.py [--quick] [--mpmd] [MODEL ...]
Wall time depends on the machine and what else runs on it; the nodes and the plan do not.
"""

from __future__ import annotations

import sys
import time

from planner.api import plan_model

MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x22b", "deepseek-v3", "qwen3-235b-a22b")
SIZES = {"cloudmatrix384": (64, 384, 768), "dgx-h100": (64, 1024), "gb200-nvl72": (72, 576)}
SEQ = 4096


def cases(models):
    for model in models:
        for cluster, counts in SIZES.items():
            for n in counts:
                yield model, cluster, n, 4 * n


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    models = args or (MODELS[:1] if "--quick" in sys.argv else MODELS)
    print(f"{'model':<16}{'cluster':<16}{'devices':>8}{'wall s':>9}{'cpu s':>8}{'nodes':>7}{'gap':>8}  plan (step s, MFU)")
    for model, cluster, devices, batch in cases(models):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            r = plan_model(model, cluster=cluster, devices=devices, global_batch=batch, seq_len=SEQ,
                           time_limit_s=600, mpmd="--mpmd" in sys.argv)
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
