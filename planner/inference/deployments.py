"""How far off a serving estimate may be: the published deployments costed at their own configuration.

Training estimates cite their hardware's held-out runs (`cost_models.accuracy`); serving has no fit of its own
(its step is costed with the training fit's curves, without host overhead or overlap credit), so what checks it
is the published serving deployments (published_deployments.json, `planner.inference.validation`):
`python benchmarks/published_errors.py` estimates every one and writes, per deployment, its cluster, the preset
whose efficiency fit that cluster uses, whether it is compared (a deployment whose configuration is not fully
published is listed, not compared) and its tokens/s error into `deployment_errors.json` beside this module;
tests/test_inference_deployments.py recomputes them. A serving plan on a cluster then says how its own
deployments came out, and those of clusters that share its efficiency fit (DeepSeek's H800 nodes run DGX
H100's curves), or that none checks it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from cost_models.loader import carries_preset_fit, preset_names

ERRORS = Path(__file__).parent / "deployment_errors.json"


def fit_of(cluster: str, inline: Mapping[str, Any], transferred_from: str = "") -> str:
    """The preset whose efficiency fit `cluster` uses: the one an inline hardware table names as its `efficiency`,
    the fit a preset's figures are transferred from, or the cluster's own."""
    shared = inline.get(cluster, {}).get("efficiency")
    return shared if isinstance(shared, str) else (transferred_from or cluster)


def errors_table(doc: Mapping[str, Any], results: Iterable[Mapping[str, Any]], fits: Mapping[str, str]) -> dict:
    """What `ERRORS` holds for the deployments file `doc` and their estimates `results` (`validation.check_all`,
    in the file's order); `fits`: each row's cluster -> `fit_of` it."""
    rows = {r["id"]: r for r in doc["rows"]}
    return {"about": "tokens/s per device error (estimate / measured - 1) of each published serving deployment at "
                     "its own configuration; written by benchmarks/published_errors.py, read by serving plans "
                     "(planner/inference/deployments.py)",
            "rows": [{"id": r["id"], "model": rows[r["id"]]["model"], "cluster": rows[r["id"]]["cluster"],
                      "fit_of": fits[rows[r["id"]]["cluster"]], "phase": rows[r["id"]]["phase"],
                      "compared": bool(r["compared"]), "error": round(r["error"], 4)} for r in results]}


@lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, Any], ...]:
    if not ERRORS.is_file():
        return ()
    return tuple(json.loads(ERRORS.read_text(encoding="utf-8"))["rows"])


def _figures(rows: list[dict[str, Any]]) -> tuple[float, float]:
    errors = [abs(r["error"]) for r in rows]
    return sum(errors) / len(errors), max(errors)


def summary(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per cluster, in name order: its compared deployments' mean and largest |error| of tokens/s per device, and
    how many more are listed but not compared (`results`: `validation.estimate_row`s)."""
    results = list(results)
    out = []
    for cluster in sorted({r["cluster"] for r in results}):
        mine = [r for r in results if r["cluster"] == cluster]
        compared = [r for r in mine if r["compared"]]
        row: dict[str, Any] = {"cluster": cluster, "compared": len(compared), "listed": len(mine) - len(compared)}
        if compared:
            row["mean_abs_error"], row["max_abs_error"] = _figures(compared)
        out.append(row)
    return out


def _of(rows: list[dict[str, Any]]) -> str:
    """The models the deployments served, so that a plan of another model knows what checked it: " of deepseek-v3"."""
    return f" of {', '.join(sorted({r['model'] for r in rows}))}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def serving_accuracy(hw: Any) -> dict[str, Any]:
    """How far off a serving estimate on `hw` may be, by the published deployments: the ones on `hw` that are
    compared, then those on clusters that share its efficiency fit; or that none checks it. The dict an estimate
    carries as `accuracy` (`sentence`: one line)."""
    if hw.name in preset_names() and not carries_preset_fit(hw):  # a user's fit under a preset's name
        return {"category": "serving", "deployments": 0, "compared": [], "sentence": (
            f"this file's efficiency is not the shipped {hw.name}'s: the published serving deployments were compared "
            "with the shipped fit, and none checks this one")}
    fit = fit_of(hw.name, {}, hw.transferred_from)
    own = [r for r in _rows() if r["cluster"] == hw.name]
    kin = [r for r in _rows() if r["cluster"] != hw.name and r["fit_of"] == fit]
    mine, theirs = [r for r in own if r["compared"]], [r for r in kin if r["compared"]]
    out: dict[str, Any] = {"category": "serving", "deployments": len(mine), "compared": [
        {k: r[k] for k in ("id", "model", "cluster", "phase", "error")} for r in mine + theirs]}
    others = sorted({r["cluster"] for r in theirs})
    shared = f"{', '.join(others)}, which share{'s' if len(others) == 1 else ''} its efficiency fit ({fit}'s)"
    if mine:
        out["mean_abs_error"], out["max_abs_error"] = _figures(mine)
        said = (f"{_plural(len(mine), 'published serving deployment')}{_of(mine)} on {hw.name}: tokens/s per device "
                f"within mean |error| {100 * out['mean_abs_error']:.1f} %, max {100 * out['max_abs_error']:.1f} %")
        if theirs:
            mean, worst = _figures(theirs)
            said += f"; {len(theirs)} more{_of(theirs)} on {shared}: mean {100 * mean:.1f} %, max {100 * worst:.1f} %"
    elif theirs:
        mean, worst = _figures(theirs)
        said = (f"no published serving deployment on {hw.name} is compared; "
                f"{_plural(len(theirs), 'deployment')}{_of(theirs)} on {shared}: tokens/s per device within mean "
                f"|error| {100 * mean:.1f} %, max {100 * worst:.1f} %")
    else:
        said = (f"no published serving deployment on {hw.name} is compared: how far off its serving estimates are "
                "is unchecked")
        listed = [r for r in own + kin if not r["compared"]]
        if listed:
            where = ", ".join(sorted({r["cluster"] for r in listed}))
            said += (f" ({_plural(len(listed), 'deployment')} on {where} published but not compared: their "
                     "configurations are not fully published)")
    out["sentence"] = said
    return out


__all__ = ["ERRORS", "errors_table", "fit_of", "serving_accuracy", "summary"]
