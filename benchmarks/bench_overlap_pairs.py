"""What the expert all-to-all overlap is worth: the estimate's saving against published A/B pairs.

    python benchmarks/bench_overlap_pairs.py

Megatron-Core's 1F1B all-to-all overlap (`Execution.overlap_ep_comm`, costed by `planner.costing.moe_pairing`)
is a stack knob a user's stack file can set. tests/data/overlap_pairs.json holds jobs NVIDIA timed with it off
and on, nothing else changed (sources there and in tests/data/SOURCES.md). For each pair this prints the measured
saving (1 - on / off), the estimated one from the same two runs, and each row's error (predicted / measured - 1);
the ratio is what is checked (`tests/test_overlap_pairs.py`), not either row, which newer containers than the
shipped releases' timed.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration import read_runs  # noqa: E402
from planner.calibration.predict import Predictor  # noqa: E402
from planner.calibration.runs import Run, parse_run  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "overlap_pairs.json"


@dataclass(frozen=True, slots=True)
class OverlapPair:
    """One job timed with the overlap off and on: its two runs (`off`, `on`), measured step seconds in them."""

    id: str
    label: str
    source: str
    off: Run
    on: Run
    notes: tuple[str, ...]


def load_pairs(path: Path = DATA) -> list[OverlapPair]:
    """The pairs of `path`: a shipped pair by its runs' ids, any other from its run and its two measured times."""
    shipped = {r.id: r for r in read_runs()}
    out = []
    for row in json.loads(path.read_text(encoding="utf-8"))["pairs"]:
        if "shipped" in row:
            off, on = shipped[row["shipped"]["off"]], shipped[row["shipped"]["on"]]
        else:
            off, on = (_run(row, side, path.name) for side in ("off", "on"))
        if off.execution.overlap_ep_comm or not on.execution.overlap_ep_comm:
            raise ValueError(f"{row['id']}: its 'off' run must not overlap and its 'on' run must")
        out.append(OverlapPair(row["id"], row["label"], row["source"], off, on, tuple(row.get("notes", ()))))
    return out


def _run(row: dict, side: str, where: str) -> Run:
    """One side of a pair given by its run: the run with the overlap off or on and that side's measured time."""
    spec = copy.deepcopy(row["run"])
    if "overlap_ep_comm" in spec.get("execution", {}):
        raise ValueError(f"{where} pair {row['id']!r}: its run sets overlap_ep_comm, which each side sets itself")
    spec.update(id=f"{row['id']}-{side}", source=f"{where}#{row['id']}", measured={"step_s": row["measured_s"][side]})
    spec.setdefault("execution", {})["overlap_ep_comm"] = side == "on"
    return parse_run(spec, where=f"{where} pair {row['id']!r}")


def savings(pair: OverlapPair, predictor: Predictor) -> tuple[float, float, float, float]:
    """(measured saving, estimated saving, error of the 'off' row, error of the 'on' row); a saving is 1 - on/off,
    negative where the overlap made the step slower."""
    off, on = predictor.predict(pair.off), predictor.predict(pair.on)
    return (1.0 - on.measured_s / off.measured_s, 1.0 - on.predicted_s / off.predicted_s, off.error, on.error)


def table(predictor: Predictor | None = None) -> list[str]:
    """The README's table: per pair, the measured and estimated savings and each row's error."""
    predictor = predictor or Predictor()
    lines = ["| pair | hardware | measured saving | estimated | off-row error | on-row error |",
             "|---|---|---:|---:|---:|---:|"]
    for pair in load_pairs():
        m, e, err_off, err_on = savings(pair, predictor)
        lines.append(f"| {pair.label} | {pair.on.hardware} | {100 * m:+.1f}% | {100 * e:+.1f}% | {100 * err_off:+.1f}% | "
                     f"{100 * err_on:+.1f}% |")
    return lines


def main() -> None:
    print("\n".join(table()))


if __name__ == "__main__":
    main()
