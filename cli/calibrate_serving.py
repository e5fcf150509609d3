"""`hyperplan calibrate --serving [FILE...]`: serving deployments' tokens/s per device, measured against estimated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from cli import render
from cost_models.errors import SpecError
from planner.errors import HyperplanError, InvalidInput
from planner.inference.deployments import summary
from planner.inference.validation import SHIPPED, estimate_row, load_rows


def check_deployments(files: Optional[list[Path]], hardware: Optional[str], as_json: bool, console) -> None:
    """Estimate every deployment of `files` (the shipped ones when none), on `hardware` only when given, and print
    them with the per-cluster mean and largest |error| of the compared ones (or one JSON object)."""
    results: list[dict[str, Any]] = []
    for path in files or [SHIPPED]:
        doc, clusters = load_rows(path)
        rows = [r for r in doc["rows"] if hardware is None or r["cluster"] == hardware]
        with render.progress(f"estimating {len(rows)} deployments of {path.name}"):
            for row in rows:
                try:
                    results.append(estimate_row(row, clusters))
                except HyperplanError as exc:  # a model or hardware file the row names: say which row
                    raise type(exc)(f"{path.name} ({row['id']}): {exc}") from None
                except SpecError as exc:
                    raise InvalidInput(f"{path.name} ({row['id']}): {str(exc).rstrip('.')}") from None
    if not results:
        raise InvalidInput(f"no deployment runs on {hardware}; the files name "
                           + ", ".join(sorted({r["cluster"] for p in files or [SHIPPED] for r in load_rows(p)[0]["rows"]})))
    if as_json:
        typer.echo(json.dumps({"deployments": results, "summary": summary(results)}, indent=1, allow_nan=False))
        return
    rows = [(r["id"], r["cluster"], f"{r['measured']:,.0f}", f"{r['estimate']:,.0f}",
             f"{100 * r['error']:+.1f}%" + ("" if r["compared"] else "*")) for r in results]
    console.print(render.table("serving deployments: tokens/s per device, measured and estimated",
                               ("deployment", "cluster", "measured", "estimate", "error"), rows,
                               right=("measured", "estimate", "error"), prose=("deployment", "cluster")))
    per = [(s["cluster"], str(s["compared"]), f"{100 * s['mean_abs_error']:.1f}%" if s["compared"] else "-",
            f"{100 * s['max_abs_error']:.1f}%" if s["compared"] else "-", str(s["listed"])) for s in summary(results)]
    console.print(render.table("per cluster (mean and max |error| of the compared deployments)",
                               ("cluster", "compared", "mean", "max", "listed"), per,
                               right=("compared", "mean", "max", "listed")))
    console.print("* listed, not compared: a deployment whose configuration is not fully published")


__all__ = ["check_deployments"]
