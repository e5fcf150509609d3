"""Fit each stack's caching-allocator reserve on the published peak memory of half its runs; write it to the stack.

    python benchmarks/fit_allocator_reserve.py            # fit and write planner/costing/stacks/<stack>.toml
    python benchmarks/fit_allocator_reserve.py --dry-run  # fit and print, write nothing

Runs with a measured peak (torchtitan's tables log the allocator's
reserved peak) are split as the hardware fits split them (`fitted_on`);
`planner.calibration.reserve_fit` fits one reserve per stack on the fitted
ones. Prints the memory error of every such run before (no reserve) and
after, and the held-out mean and max.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calibration import read_runs  # noqa: E402
from planner.calibration.predict import predict_all  # noqa: E402
from planner.calibration.reserve_fit import fit_reserves, memory_error  # noqa: E402
from planner.costing.execution import STACK_DIR  # noqa: E402


def write_reserve(stack: str, value: float, rows: int) -> Path:
    """Set `allocator_reserve` in the stack's [memory] table (made when missing), saying where it was fitted."""
    path = STACK_DIR / f"{stack}.toml"
    lines = path.read_text(encoding="utf-8").splitlines()
    line = (f"allocator_reserve = {value:.3f}  # fitted on the reserved peak of {rows} published runs "
            "(benchmarks/fit_allocator_reserve.py)")
    hit = [i for i, text in enumerate(lines) if text.startswith("allocator_reserve")]
    if hit:
        lines[hit[0]] = line
    elif "[memory]" in lines:
        lines.insert(lines.index("[memory]") + 1, line)
    else:
        lines += ["", "[memory]", line]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="fit and print; write no stack")
    args = ap.parse_args(argv)
    runs = [r for r in read_runs() if r.memory_gib is not None]
    preds, skipped = predict_all(runs)
    for line in skipped:
        print(f"skipped {line}")
    for fit in fit_reserves(preds):
        print(f"{fit.stack}: allocator_reserve {fit.reserve:.3f}, fitted on {len(fit.fitted)} runs, "
              f"{len(fit.held_out)} held out")
        held = []
        for p in preds:
            if p.run.execution.name != fit.stack:
                continue
            before, after = memory_error(p, 0.0), memory_error(p, fit.reserve)
            group = "fit " if p.fitted else "held"
            if not p.fitted:
                held.append(abs(after))
            print(f"  {group} {p.run.id:55s} {100 * before:+6.1f}% -> {100 * after:+6.1f}%")
        if held:
            print(f"  held-out mean {100 * sum(held) / len(held):.1f}%, max {100 * max(held):.1f}%")
        if not args.dry_run:
            print(f"  wrote {write_reserve(fit.stack, fit.reserve, len(fit.fitted))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
