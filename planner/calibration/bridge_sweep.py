"""The Megatron-Bridge sweep's step-time errors as last computed: what an estimate of the same model on the same
hardware cites beside the shipped runs.

`python benchmarks/bench_bridge_sweep.py --write` estimates every Megatron-Bridge pre-training row on DGX H100,
B200 and B300, GB200 and GB300 (NeMo 25.11-26.08) with the preset it ran (but a row its publisher says a bug
slowed), and writes each row's model, hardware, release, micro-batch, CUDA graphs and error into
`bridge_sweep_errors.json` beside this module; tests/test_bridge_sweep.py
recomputes them. Only a few of those rows are shipped calibration runs: the rest were never fitted, so an estimate
of Qwen3-30B-A3B on DGX B200 can say how far off every published Megatron-Bridge run of it there came out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cost_models.accuracy import WORDS

from planner.calibration.published import stored_rows

ERRORS = Path(__file__).parent / "bridge_sweep_errors.json"


def graphs_of(execution: Any) -> str:
    """How much of a step a row's stack replays from CUDA graphs: "full iteration", the scopes, or "none"."""
    scopes = tuple(execution.cuda_graphs)
    return "full iteration" if "full_iteration" in scopes else (", ".join(scopes) or "none")


def errors_table(items: Iterable[tuple[Any, bool]]) -> dict[str, Any]:
    """What `ERRORS` holds for the sweep's (prediction, shipped) pairs, in their order."""
    return {"about": "step-time error (predicted / measured - 1) of every Megatron-Bridge pre-training row the sweep "
                     "reads (tests/data/bridge_sweep.json); written by benchmarks/bench_bridge_sweep.py --write, read "
                     "by estimates of the same model on the same hardware (planner/calibration/bridge_sweep.py)",
            "rows": [{"id": p.run.id, "model": p.run.model, "category": p.run.category, "hardware": p.cluster,
                      "release": p.run.id.split("-")[0],
                      "micro_batch": p.micro_batch, "cuda_graphs": graphs_of(p.run.execution), "shipped": shipped,
                      "error": round(p.error, 4)} for p, shipped in items]}


def _rows() -> tuple[dict[str, Any], ...]:
    return stored_rows(ERRORS, "rows")


def rows_of(model: str, hardware: str) -> list[dict[str, Any]]:
    """Every sweep row of zoo model `model` on preset `hardware`, in the file's order."""
    return [r for r in _rows() if r["model"] == model and r["hardware"] == hardware]


def cited(model: str, hardware: str, rows: list[dict[str, Any]]) -> str:
    """One sentence on `rows` (from `rows_of`): how many, their range of errors and mean |error|, and the same for
    the rows that replayed the full iteration from CUDA graphs where some did and some did not."""
    def span(group: list[dict[str, Any]]) -> str:
        errors = [r["error"] for r in group]
        mean = sum(abs(e) for e in errors) / len(errors)
        return (f"{len(group)} row{'' if len(group) == 1 else 's'}, {100 * min(errors):+.1f} % to "
                f"{100 * max(errors):+.1f} % (mean |error| {100 * mean:.1f} %)")
    said = span(rows)
    full = [r for r in rows if r["cuda_graphs"] == "full iteration"]
    if full and len(full) < len(rows):
        said += f"; of them with the full iteration in CUDA graphs {span(full)}"
    shipped = sum(r["shipped"] for r in rows)
    return (f"{model} in Megatron-Bridge's published tables on {hardware} (NeMo 25.11-26.08, each with its "
            f"release's preset; {shipped} of them shipped calibration runs): {said}; a negative error: the estimate "
            "was the faster")


def never_fitted(hardware: str, category: str) -> str:
    """One sentence on the sweep's rows of a kind of job on `hardware` that no fit saw (not shipped: held out by
    every fit): how many, and their mean and largest |error|; "" when there are none. What checks a preset whose
    shipped runs of that kind were all fitted, or set aside as regressions their publisher names."""
    errors = [r["error"] for r in _rows() if r["hardware"] == hardware and r["category"] == category
              and not r["shipped"]]
    if not errors:
        return ""
    mean = sum(abs(e) for e in errors) / len(errors)
    return (f"Megatron-Bridge's {len(errors)} never-fitted {WORDS.get(category, category)} "
            f"row{'' if len(errors) == 1 else 's'} there (NeMo 25.11-26.08): mean |error| {100 * mean:.1f} %, "
            f"max {100 * max(abs(e) for e in errors):.1f} %")


#: The rows that show an eager MoE layer's host cost: the same model on the same GPUs with the router's graphs only
#: (26.02-26.04.01) and with the whole iteration in CUDA graphs (26.06 on)
WITNESS = ("qwen3-30b-a3b", "gb200-nvl72")


def eager_moe() -> str:
    """How the witness model's sweep rows came out with and without the whole iteration in CUDA graphs: the
    evidence for how well the estimate counts an eager MoE layer's host issue ("" without both kinds)."""
    rows = rows_of(*WITNESS)
    eager = [r["error"] for r in rows if r["cuda_graphs"] != "full iteration"]
    full = [r["error"] for r in rows if r["cuda_graphs"] == "full iteration"]
    if not (eager and full):
        return ""
    return (f"{WITNESS[0]}'s Megatron-Bridge rows on {WITNESS[1]} came out {100 * min(eager):+.1f} % to "
            f"{100 * max(eager):+.1f} % eager ({len(eager)} rows) and {100 * min(full):+.1f} % to "
            f"{100 * max(full):+.1f} % with the whole iteration in CUDA graphs ({len(full)})")


__all__ = ["ERRORS", "WITNESS", "cited", "eager_moe", "errors_table", "graphs_of", "never_fitted", "rows_of"]
