"""How right a hardware file's figures are: the errors of its held-out runs, per kind of job.

A fit matches the runs it was fitted on by construction; only the runs it was not fitted on say how right
the model is. So `hyperplan calibrate --fit` (and `benchmarks/fit_presets.py` for the presets) writes into
the file's [efficiency], beside the fitted parameters, the other runs of that hardware by category: how many,
and the mean and the largest |predicted / measured - 1| of their step times, in percent,

    held_out = { dense_training = [8, 3.5, 8.7], moe_training = [7, 7.8, 15.7] }

and every estimate on the hardware repeats the figures of its kind of job, or says that no run checked it.
The figures hold for the code that computed them: `tests/test_calibration.py` recomputes the presets'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cost_models.errors import SpecError

#: The kinds of job a runs file tells apart (`planner.calibration.runs`), as an estimate names them.
CATEGORIES = {"dense_training": "dense training", "moe_training": "MoE training"}
#: What runs that state no category are called (`planner.calibration.runs`: a user's runs file may leave it out).
WORDS = CATEGORIES | {"training": "training"}


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The held-out runs of one category on one hardware: how many, and their mean and largest |error|."""

    category: str
    runs: int
    mean: float  # fractions of the measured step time
    max: float

    def sentence(self, hardware: str, shipped: bool = False) -> str:
        """One line for an estimate on `hardware`; with `shipped` (a preset, whose runs hyperplan ships), the
        command that lists the runs."""
        what = WORDS.get(self.category, self.category)
        where = f" (hyperplan calibrate --hardware {hardware})" if shipped else ""
        return (f"{self.runs} held-out {what} run{'' if self.runs == 1 else 's'} on {hardware}: "
                f"mean |error| {100 * self.mean:.1f} %, max {100 * self.max:.1f} %{where}")


def unchecked(hardware: str, category: str) -> str:
    """The sentence for a hardware and kind of job that no held-out run checks."""
    what = WORDS.get(category, category)
    return f"no held-out {what} run on {hardware}: how far off its estimates are is unchecked"


def parse_held_out(value: object, where: str) -> tuple[HeldOut, ...]:
    """The `held_out` table of a hardware file (SpecError naming `where` when malformed), in category order."""
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: expected a table of category = [runs, mean %, max %], got {value!r}.")
    out = []
    for category, row in sorted(value.items()):
        ok = (isinstance(row, list) and len(row) == 3 and isinstance(row[0], int) and not isinstance(row[0], bool)
              and row[0] >= 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      for v in row[1:]) and 0 <= row[1] <= row[2])
        if not ok:
            raise SpecError(f"{where}.{category}: expected [runs >= 1, mean %, max %] with 0 <= mean <= max, "
                            f"got {row!r}.")
        out.append(HeldOut(str(category), int(row[0]), row[1] / 100.0, row[2] / 100.0))
    return tuple(out)


def held_out_dicts(rows: Iterable[HeldOut]) -> dict[str, dict[str, float]]:
    """The held-out rows as JSON gives them: category -> runs, mean and max |error| (fractions)."""
    return {r.category: {"runs": r.runs, "mean_abs_error": r.mean, "max_abs_error": r.max} for r in rows}


def held_out_toml(rows: Iterable[HeldOut]) -> str:
    """The `held_out` value as a TOML inline table, percent to one decimal (what `parse_held_out` reads)."""
    items = [f"{r.category} = [{r.runs}, {100 * r.mean:.1f}, {100 * r.max:.1f}]"
             for r in sorted(rows, key=lambda r: r.category)]
    return "{ " + ", ".join(items) + " }" if items else "{}"


__all__ = ["CATEGORIES", "WORDS", "HeldOut", "held_out_dicts", "held_out_toml", "parse_held_out", "unchecked"]
