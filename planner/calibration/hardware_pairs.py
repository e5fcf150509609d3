"""The estimated speedup from one preset to another against the published one, on the same job, as last computed.

Megatron-Bridge's performance summaries sometimes list one release running one model at one precision and layout
on two systems (tests/data/bridge_sweep.json). The ratio of the two rows' step times is what a what-if across the
two clusters should give; `benchmarks/bench_bridge_sweep.py --write` estimates both rows of every such pair and
writes, per pair of hardware, how far the estimated ratio was from the measured one into `hardware_pairs.json`
beside this module, which a what-if sweep over those clusters cites (tests/test_bridge_sweep.py recomputes it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from itertools import combinations
from pathlib import Path
from typing import Any

from planner.calibration.published import stored_rows

PAIRS = Path(__file__).with_name("hardware_pairs.json")


def job(run: Any) -> tuple:
    """What makes two sweep rows one job on two hardware: release, model, precision and the layout the row states
    (GPUs, TP, PP, CP, VP, EP, micro and global batch)."""
    s = run.strategy
    layout = (run.devices, s.get("tp", 1), s.get("pp", 1), s.get("cp", 1), s.get("vpp", 1), s.get("ep", 1),
              s.get("micro_batch"), run.global_batch)
    return run.id.split("-", 1)[0], run.model, run.dtype, run.execution.fp8_recipe if run.dtype == "fp8" else "", layout


def pairs(predictions: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Every two predictions of one job on two hardware, (first, second) in hardware-name order."""
    by_job: dict[tuple, dict[str, Any]] = defaultdict(dict)
    for p in predictions:
        by_job[job(p.run)][p.run.hardware] = p
    return [(rows[a], rows[b]) for rows in by_job.values() for a, b in combinations(sorted(rows), 2)]


def speedups(a: Any, b: Any) -> tuple[float, float]:
    """(measured, estimated) speedup of b's hardware over a's: a's step time over b's."""
    return a.measured_s / b.measured_s, a.predicted_s / b.predicted_s


def pairs_table(found: Iterable[tuple[Any, Any]]) -> dict[str, Any]:
    """What `PAIRS` holds: per pair of hardware, the pairs of rows, the geometric-mean measured and estimated
    speedups, and the mean and max |error| of the estimated speedup (estimated / measured - 1), with the worst row."""
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for a, b in found:
        groups[(a.run.hardware, b.run.hardware)].append((a.run.id, *speedups(a, b)))
    out = []
    for (ha, hb), rows in sorted(groups.items()):
        gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
        errors = [(e / m - 1.0, rid) for rid, m, e in rows]
        worst = max(errors, key=lambda t: abs(t[0]))
        out.append({"from": ha, "to": hb, "pairs": len(rows), "measured": round(gm([m for _, m, _ in rows]), 4),
                    "estimated": round(gm([e for _, _, e in rows]), 4),
                    "mean_abs_error": round(sum(abs(x) for x, _ in errors) / len(errors), 4),
                    "max_abs_error": round(abs(worst[0]), 4), "worst": worst[1]})
    return {"about": "estimated against measured speedup between two hardware where a Megatron-Bridge release ran "
                     "one job on both (tests/data/bridge_sweep.json); written by benchmarks/bench_bridge_sweep.py "
                     "--write, cited by what-if sweeps over both (planner/calibration/hardware_pairs.py)",
            "pairs": out}


def checked(a: str, b: str) -> str | None:
    """One sentence on how far the estimated speedup between presets `a` and `b` was from the published one on
    the same jobs, or None where no release ran a job on both."""
    if a == b:
        return None
    e = next((e for e in stored_rows(PAIRS, "pairs") if {e["from"], e["to"]} == {a, b}), None)
    if e is None:
        return None
    return (f"speedup {e['from']} -> {e['to']} on {e['pairs']} published pair{'s' if e['pairs'] > 1 else ''} of runs "
            f"(one release, model and layout on both): {e['estimated']:.2f}x estimated, {e['measured']:.2f}x "
            f"measured; |error| mean {100 * e['mean_abs_error']:.1f} %, max {100 * e['max_abs_error']:.1f} % "
            "(benchmarks/bench_hardware_pairs.py)")


__all__ = ["PAIRS", "checked", "job", "pairs", "pairs_table", "speedups"]
