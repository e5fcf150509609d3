"""The shipped runs' step-time errors as last computed: what an estimate of the same model on the same hardware
cites.

`python benchmarks/published_errors.py` predicts every shipped run as `hyperplan calibrate` does and writes, per
run, its model, hardware, devices, group (fit or held-out) and error into `published_errors.json` beside this
module; tests/test_calibration.py recomputes them, so a change of the cost model without rewriting them fails.
An estimate of a zoo model on a preset then lists that model's runs there (`runs_of`): planning DeepSeek-V3 on
DGX H100, a user sees how far off the published DeepSeek-V3 runs on DGX H100 came out, not only the hardware's
average over every model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.calibration.layout_pairs import by_category, pairs

ERRORS = Path(__file__).parent / "published_errors.json"
#: Runs cited in one estimate at most (held-out ones first, then the largest errors).
CITED = 3


def errors_table(predictions: Iterable[Any]) -> dict[str, Any]:
    """What `ERRORS` holds for `predictions` (`planner.calibration.predict.Prediction`s), in their order, but for a
    run its publisher says a bug slowed (cited by no estimate); and, per category, the error of the estimated ratio
    between two layouts one table measured (`planner.calibration.layout_pairs`)."""
    predictions = list(predictions)
    return {"about": "step-time error (predicted / measured - 1) of each shipped run, as `hyperplan calibrate` "
                     "computes it; written by benchmarks/published_errors.py, read by estimates of the same model "
                     "on the same hardware (planner/calibration/published.py)",
            "runs": [{"id": p.run.id, "model": p.run.model, "as_shipped": not p.run.overrides, "hardware": p.cluster,
                      "devices": p.run.devices, "group": p.group,
                      "error": round(p.error, 4)} for p in predictions if p.group != "regression"],
            "layout_pairs": by_category(pairs(predictions))}


@lru_cache(maxsize=None)
def stored_rows(path: Path, key: str) -> tuple[dict[str, Any], ...]:
    """The list under `key` of a JSON file of errors as last computed (read once; none if the file is missing)."""
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text(encoding="utf-8")).get(key, ()))


def _runs() -> tuple[dict[str, Any], ...]:
    return stored_rows(ERRORS, "runs")


def runs_of(model: str, hardware: str) -> list[dict[str, Any]]:
    """The shipped runs of zoo model `model` as the zoo builds it (not a run that changes its size by overrides) on
    preset `hardware`: held-out ones first, then by |error|, at most `CITED`."""
    mine = [r for r in _runs() if r["model"] == model and r["as_shipped"] and r["hardware"] == hardware]
    mine.sort(key=lambda r: (r["group"] != "held-out", -abs(r["error"]), r["id"]))
    return mine[:CITED]


def ranking_error(category: str) -> dict[str, Any] | None:
    """How far off the estimated ratio between two layouts of a `category` job that one table measured came out, over
    the shipped runs' layout pairs as last computed ({"pairs", "median_error", "max_error"}); None without pairs."""
    return next((dict(r) for r in stored_rows(ERRORS, "layout_pairs") if r["category"] == category), None)


def error_of(run_id: str) -> float | None:
    """The step-time error of shipped run `run_id` as last computed (None if it is not shipped)."""
    return next((r["error"] for r in _runs() if r["id"] == run_id), None)


def cited(model: str, hardware: str, runs: list[dict[str, Any]]) -> str:
    """One sentence naming `runs` (from `runs_of`) and their errors."""
    said = ", ".join(f"{r['id']} {100 * r['error']:+.1f} % ({'held out' if r['group'] == 'held-out' else 'fitted'})"
                     for r in runs)
    return f"{model}'s published runs on {hardware}: {said}"


__all__ = ["CITED", "ERRORS", "cited", "error_of", "errors_table", "ranking_error", "runs_of", "stored_rows"]
