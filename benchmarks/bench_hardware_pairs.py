"""How far the estimate's speedup from one hardware to another is from the published one, on the same job.

    python benchmarks/bench_hardware_pairs.py          # per pair of hardware: pairs, measured and estimated speedup
    python benchmarks/bench_hardware_pairs.py --rows   # and every pair of rows

A what-if across clusters (`hyperplan whatif`, or planning one job on two presets) answers "how much faster is it
there"; the Megatron-Bridge performance summaries answer it too, where one release ran one model at one precision
and layout (GPUs, TP, PP, CP, VP, EP, micro and global batch) on two systems. For each such pair of rows in
tests/data/bridge_sweep.json that both match a preset of their release (`bench_bridge_sweep.run_of`) and that no
footnote says a bug slowed, the measured speedup is the ratio of their tokens/s per GPU and the estimated one the
ratio of the estimated step times. The two presets' own fits saw some of these rows (the sweep marks them); the
ratio, not either row, is what is checked here.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_bridge_sweep import scored, sweep  # noqa: E402

def job(run) -> tuple:
    """What makes two sweep rows the same job on different hardware: release, model, precision and layout."""
    release = run.id.split("-", 1)[0]
    s = run.strategy
    layout = (run.devices, s.get("tp", 1), s.get("pp", 1), s.get("cp", 1), s.get("vpp", 1), s.get("ep", 1),
              s.get("micro_batch"), run.global_batch)
    return release, run.model, run.dtype, run.execution.fp8_recipe if run.dtype == "fp8" else "", layout


def pairs(predictions) -> list[tuple]:
    """(slower-listed hardware's prediction, other's) for every two rows of one job on two hardware, hardware in
    name order."""
    by_job = defaultdict(dict)
    for p in predictions:
        by_job[job(p.run)][p.run.hardware] = p
    out = []
    for rows in by_job.values():
        for a, b in combinations(sorted(rows), 2):
            out.append((rows[a], rows[b]))
    return out


def speedups(a, b) -> tuple[float, float]:
    """(measured, estimated) speedup of b's hardware over a's: step time on a over step time on b."""
    return a.measured_s / b.measured_s, a.predicted_s / b.predicted_s


def table(found: list[tuple]) -> list[str]:
    """Per pair of hardware: pairs of rows, geometric mean measured and estimated speedup, mean and max |error|
    of the estimated speedup."""
    groups = defaultdict(list)
    for a, b in found:
        groups[(a.run.hardware, b.run.hardware)].append(speedups(a, b))
    lines = ["| from | to | pairs | measured speedup | estimated | mean abs error | max abs error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (ha, hb), ratios in sorted(groups.items()):
        gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
        errors = [e / m - 1.0 for m, e in ratios]
        lines.append(f"| {ha} | {hb} | {len(ratios)} | {gm([m for m, _ in ratios]):.2f}x | "
                     f"{gm([e for _, e in ratios]):.2f}x | {100 * sum(map(abs, errors)) / len(errors):.1f}% | "
                     f"{100 * max(map(abs, errors)):.1f}% |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every pair of rows")
    args = ap.parse_args()
    items, _, _, _ = sweep()
    found = pairs(p for p, _ in scored(items))
    print("\n".join(table(found)))
    if args.rows:
        print()
        for a, b in found:
            m, e = speedups(a, b)
            print(f"{a.run.id:50} -> {b.run.hardware:12} measured {m:5.2f}x  estimated {e:5.2f}x  {100 * (e / m - 1):+6.1f}%")


if __name__ == "__main__":
    main()
