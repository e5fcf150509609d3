"""`hyperplan calibrate --serving [FILE...]`: serving deployments' tokens/s per device, measured against estimated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from cli import render
from planner.inference.deployments import summary
from planner.inference.validation import check_files


def check_deployments(files: Optional[list[Path]], hardware: Optional[str], as_json: bool, console) -> None:
    """Estimate every deployment of `files` (the shipped ones when none), on `hardware` only when given, and print
    them with the per-cluster mean and largest |error| of the compared ones (or one JSON object)."""
    with render.progress("estimating deployments"):
        results = check_files(files or (), hardware)
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
