"""How far the estimate's speedup from one hardware to another is from the published one, on the same job.

    python benchmarks/bench_hardware_pairs.py          # per pair of hardware: pairs, measured and estimated speedup
    python benchmarks/bench_hardware_pairs.py --rows   # and every pair of rows

(`benchmarks/bench_bridge_sweep.py --write` writes planner/calibration/hardware_pairs.json from the same estimates.)

A what-if across clusters (`hyperplan whatif` over two presets, or planning one job on both) answers "how much
faster is it there"; the Megatron-Bridge performance summaries answer it too, where one release ran one model at
one precision and layout (GPUs, TP, PP, CP, VP, EP, micro and global batch) on two systems. For each such pair of
rows in tests/data/bridge_sweep.json that both match a preset of their release (`bench_bridge_sweep.run_of`) and
that no footnote says a bug slowed, the measured speedup is the ratio of their tokens/s per GPU and the estimated
one the ratio of the estimated step times (`planner.calibration.hardware_pairs`). The presets' own fits saw some
of these rows (the sweep marks them); the ratio, not either row, is what is checked here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_bridge_sweep import scored, sweep  # noqa: E402
from planner.calibration.hardware_pairs import pairs, pairs_table, speedups  # noqa: E402


def table(summary: dict) -> list[str]:
    """The README's table of `pairs_table`'s summary."""
    lines = ["| from | to | pairs | measured speedup | estimated | mean abs error | max abs error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for e in summary["pairs"]:
        lines.append(f"| {e['from']} | {e['to']} | {e['pairs']} | {e['measured']:.2f}x | {e['estimated']:.2f}x | "
                     f"{100 * e['mean_abs_error']:.1f}% | {100 * e['max_abs_error']:.1f}% |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every pair of rows")
    args = ap.parse_args()
    items, _, _, _ = sweep()
    found = pairs(p for p, _ in scored(items))
    print("\n".join(table(pairs_table(found))))
    if args.rows:
        print()
        for a, b in found:
            m, e = speedups(a, b)
            print(f"{a.run.id:50} -> {b.run.hardware:12} measured {m:5.2f}x  estimated {e:5.2f}x  "
                  f"{100 * (e / m - 1):+6.1f}%")


if __name__ == "__main__":
    main()
