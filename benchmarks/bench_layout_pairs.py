"""How well the estimate ranks layouts: pairs of shipped runs one source measured of the same job in two layouts.

    python benchmarks/bench_layout_pairs.py     # the table as Markdown (the README's), then every pair

A plan is chosen by comparing estimates of layouts against each other, so what a user needs to trust is the
estimated ratio between two layouts, not each estimate alone. A pair here is two shipped runs of one table (the
same document of the same publisher, and of a Megatron-Bridge performance summary the same release), the same
model, hardware, sequence length and precision, that differ in their strategy (parallel degrees, micro-batch,
recompute, pipeline split): the publisher's measured throughput ratio against the estimate's. The pair's error is
symmetric, the estimated ratio over the measured one or its inverse, whichever is above 1, minus 1; a pair is
flipped when the two ratios name different winners. `plan` takes a runner-up within the hardware's held-out mean
|error| of its step as a close call (`planner.plan.close_calls`); this table is what that assumption is checked
against. Takes about a minute (every shipped run is estimated).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calibration.predict import Prediction  # noqa: E402


@dataclass(frozen=True, slots=True)
class Pair:
    a: Prediction
    b: Prediction
    measured: float  # a's tokens/s per device over b's, as published
    estimated: float  # the same ratio, as estimated

    @property
    def error(self) -> float:
        """The estimated ratio over the measured one, or its inverse, whichever is at least 1, minus 1."""
        return math.exp(abs(math.log(self.estimated / self.measured))) - 1.0

    @property
    def settings(self) -> str:
        """"layout" when the two runs' stack settings are the same but for the recompute modules that come with the
        recompute policy a plan picks; "layout + stack" when the publisher also changed a setting no plan chooses
        (the dispatcher, an overlap, the FP8 recipe, the gradients' width, compiled or eager kernels)."""
        a, b = self.a.run.execution, self.b.run.execution
        return "layout" if dataclasses.replace(a, recompute_modules=b.recompute_modules) == b else "layout + stack"

    @property
    def flipped(self) -> bool:
        return (self.measured > 1.0) != (self.estimated > 1.0) and abs(math.log(self.measured)) > 1e-9


def table_of(source: str, rows: dict[str, dict]) -> str:
    """The table a run was read from: its published row's document (repository and path, with the release for a
    Megatron-Bridge summary), or, for a paper's row without one, the paper (its id before the first dash)."""
    file, _, rest = source.partition("#")
    key = rest.split(" ")[0]
    if key.startswith("rows["):  # the Megatron-Bridge sweep: rows[i] of its file
        row = rows[file][int(key[5:key.index("]")])]
        return f"Megatron-Bridge performance summary, NeMo {row['release']}"
    row = rows[file].get(key, {})
    src = row.get("source")
    if isinstance(src, dict) and src.get("path"):
        return f"{src.get('repo', '')}/{src['path']}"
    return key.split("-")[0]


def _rows() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted((ROOT / "tests" / "data").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = (data.get("rows") or data.get("runs")) if isinstance(data, dict) else None
        if not isinstance(rows, list):
            continue
        name = f"tests/data/{path.name}"
        out[name] = rows if path.name == "bridge_sweep.json" else {r["id"]: r for r in rows if "id" in r}
    return out


def pairs(predictions) -> list[Pair]:
    """Every pair of scored runs (fitted or held out) of one table and job in two strategies."""
    rows = _rows()
    groups: dict[tuple, list[Prediction]] = {}
    for p in predictions:
        r = p.run
        if p.group == "regression":
            continue
        key = (table_of(r.source, rows), r.model, json.dumps(r.overrides, sort_keys=True), p.cluster, r.seq_len,
               r.dtype, r.category)
        groups.setdefault(key, []).append(p)
    out = []
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            if a.run.strategy == b.run.strategy:
                continue  # the same layout under two settings of the stack: not a choice a plan makes
            ma, pa = a.tokens_per_s_per_device
            mb, pb = b.tokens_per_s_per_device
            out.append(Pair(a, b, ma / mb, pa / pb))
    return out


def table(predictions) -> list[str]:
    """Per category: pairs, their median, mean and largest error, and how many name the other winner."""
    found, rows = pairs(predictions), _rows()
    lines = ["| category | what differs | pairs | tables | median error | mean error | max error | winner flipped | "
             "worst pair |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for cat, what in sorted({(p.a.run.category, p.settings) for p in found}):
        mine = sorted((p for p in found if (p.a.run.category, p.settings) == (cat, what)), key=lambda p: p.error)
        errs = [p.error for p in mine]
        n = len(errs)
        median = errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2
        tables = len({table_of(p.a.run.source, rows) for p in mine})
        worst = mine[-1]
        lines.append(f"| {cat.replace('_training', '')} | {what} | {n} | {tables} | {100 * median:.1f}% | "
                     f"{100 * sum(errs) / n:.1f}% | {100 * errs[-1]:.1f}% | {sum(p.flipped for p in mine)} | "
                     f"{worst.a.run.id} / {worst.b.run.id} |")
    return lines


def main() -> int:
    from planner.api import calibrate

    result = calibrate()
    print("\n".join(table(result.predictions)))
    print()
    for p in sorted(pairs(result.predictions), key=lambda p: -p.error):
        print(f"{100 * p.error:5.1f}% {'flipped' if p.flipped else '       '} measured {p.measured:6.3f} "
              f"estimated {p.estimated:6.3f} {p.settings:14} {p.a.run.id} / {p.b.run.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
