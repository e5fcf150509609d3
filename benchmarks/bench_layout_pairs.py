"""How well the estimate ranks layouts, on the shipped runs: the README's table of layout pairs.

    python benchmarks/bench_layout_pairs.py     # the table as Markdown (the README's), then every pair

A pair is two shipped runs one table measured of the same job in two strategies
(`planner.calibration.layout_pairs`: the tables are `Run.table`, a Megatron-Bridge summary's release or the
document that published the rows); its error is the estimated throughput ratio against the measured one. `plan`
names a runner-up within the larger of the hardware's held-out mean |error| and the median pair error of the kind of
job (published_errors.json, which benchmarks/published_errors.py writes) as a close call
(`planner.plan.close_calls`). `hyperplan calibrate` prints the pairs of any runs file. Takes about a minute (every
shipped run is estimated).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration.layout_pairs import pairs, summary  # noqa: E402


def table(predictions) -> list[str]:
    """Per category and what differs: pairs, tables, median, mean and largest error, flipped winners, worst pair."""
    lines = ["| category | what differs | pairs | tables | median error | mean error | max error | winner flipped | "
             "worst pair |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in summary(pairs(predictions)):
        lines.append(f"| {s['category'].replace('_training', '')} | {s['differs']} | {s['pairs']} | {s['tables']} | "
                     f"{100 * s['median_error']:.1f}% | {100 * s['mean_error']:.1f}% | {100 * s['max_error']:.1f}% | "
                     f"{s['flipped']} | {' / '.join(s['worst'])} |")
    return lines


def main() -> int:
    from planner.api import calibrate

    result = calibrate()
    print("\n".join(table(result.predictions)))
    print()
    for p in sorted(pairs(result.predictions), key=lambda p: -p.error):
        print(f"{100 * p.error:5.1f}% {'flipped' if p.flipped else '       '} measured {p.measured:6.3f} "
              f"estimated {p.estimated:6.3f} {p.differs:14} {p.a.run.id} / {p.b.run.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
