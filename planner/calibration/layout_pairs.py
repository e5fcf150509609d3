"""How well the estimate ranks layouts: pairs of runs one table measured of the same job in two strategies.

A plan is chosen by comparing estimates of layouts against each other, so
what a user needs to trust is the estimated ratio between two layouts, not
each estimate alone. A pair is two scored runs (fitted or held out) of one
table (`Run.table`: one published table, one campaign on a cluster; a runs
file without it is one table), the same model with the same overrides, on
the same hardware, at the same sequence length, precision and kind of job,
whose strategies differ (parallel degrees, micro-batch, recompute, pipeline
split). Its error is symmetric: the estimated throughput ratio over the
measured one, or its inverse, whichever is at least 1, minus 1; it is
flipped when the two ratios name different winners. A pair whose stack
settings also differ (the dispatcher, an overlap, the FP8 recipe, compiled
kernels: what no plan chooses) is reported apart from one that differs in
the layout alone, the recompute modules a recompute policy brings aside.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # annotations only: estimates read ranking errors through `published` without the predictor
    from planner.calibration.predict import Prediction

LAYOUT = "layout"
LAYOUT_AND_STACK = "layout + stack"


@dataclass(frozen=True, slots=True)
class Pair:
    a: Prediction
    b: Prediction
    measured: float  # a's tokens/s per device over b's, as measured
    estimated: float  # the same ratio, as estimated

    @property
    def error(self) -> float:
        """The estimated ratio over the measured one, or its inverse, whichever is at least 1, minus 1."""
        return ratio_error(self.measured, self.estimated)

    @property
    def flipped(self) -> bool:
        """The estimate names the other run the faster one (a measured tie flips nothing)."""
        return (self.measured > 1.0) != (self.estimated > 1.0) and self.measured != 1.0

    @property
    def differs(self) -> str:
        """`LAYOUT` when the two runs' stack settings are the same but for the recompute modules, else
        `LAYOUT_AND_STACK`."""
        a, b = self.a.run.execution, self.b.run.execution
        return LAYOUT if dataclasses.replace(a, recompute_modules=b.recompute_modules) == b else LAYOUT_AND_STACK


def ratio_error(measured: float, estimated: float) -> float:
    """exp(|log(estimated / measured)|) - 1: how far an estimated ratio is off a measured one, either way."""
    return math.exp(abs(math.log(estimated / measured))) - 1.0


def table_of(p: Prediction) -> str:
    """The table a run was measured in: its `table`, else the file it was read from."""
    return p.run.table or p.run.origin


def pairs(predictions: Iterable[Prediction]) -> list[Pair]:
    """Every pair of scored runs of one table and one job in two strategies, in the runs' order."""
    groups: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        r = p.run
        if p.group == "regression":
            continue
        key = (table_of(p), r.model, json.dumps(dict(r.overrides), sort_keys=True), p.cluster, r.seq_len, r.dtype,
               r.category)
        groups.setdefault(key, []).append(p)
    out = []
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            if dict(a.run.strategy) == dict(b.run.strategy):
                continue  # one layout under two settings of the stack: not a choice a plan makes
            (ma, pa), (mb, pb) = a.tokens_per_s_per_device, b.tokens_per_s_per_device
            out.append(Pair(a, b, float(ma / mb), float(pa / pb)))
    return out


def summary(found: Iterable[Pair]) -> list[dict]:
    """Per category and what differs: pairs, tables, the median, mean and largest error, flipped winners, and the
    worst pair."""
    out = []
    for (category, differs), mine in _by(found, lambda p: (p.a.run.category, p.differs)):
        errs = [p.error for p in mine]
        out.append({"category": category, "differs": differs, "pairs": len(mine),
                    "tables": len({table_of(p.a) for p in mine}), "median_error": median(errs),
                    "mean_error": sum(errs) / len(errs), "max_error": errs[-1],
                    "flipped": sum(p.flipped for p in mine), "worst": [mine[-1].a.run.id, mine[-1].b.run.id]})
    return out


def by_category(found: Iterable[Pair]) -> list[dict]:
    """Per category, every pair whatever differs: how many, the median and the largest error (what `plan`'s close
    calls read, `planner.calibration.published.ranking_error`)."""
    out = []
    for category, mine in _by(found, lambda p: p.a.run.category):
        errs = [p.error for p in mine]
        out.append({"category": category, "pairs": len(mine), "median_error": round(median(errs), 4),
                    "max_error": round(errs[-1], 4)})
    return out


def _by(found: Iterable[Pair], key) -> list[tuple]:
    """The pairs grouped by `key`, groups in key order, each group's pairs by ascending error."""
    groups: dict = {}
    for p in found:
        groups.setdefault(key(p), []).append(p)
    return [(k, sorted(mine, key=lambda p: p.error)) for k, mine in sorted(groups.items())]


def to_dicts(found: Iterable[Pair]) -> list[dict]:
    """Every pair, for `calibrate --json`."""
    return [{"a": p.a.run.id, "b": p.b.run.id, "table": table_of(p.a), "differs": p.differs,
             "measured_ratio": p.measured, "estimated_ratio": p.estimated, "error": p.error, "flipped": p.flipped}
            for p in found]


__all__ = ["LAYOUT", "LAYOUT_AND_STACK", "Pair", "by_category", "pairs", "ratio_error", "summary", "table_of",
           "to_dicts"]
