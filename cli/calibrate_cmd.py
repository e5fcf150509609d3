"""`hyperplan calibrate [FILE...]`: predicted against measured runs; `--fit` fits a hardware file to some of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import render
from cli.errors import guarded
from planner.errors import InvalidInput
from planner.hypershard.io import check_output, write_atomically
from planner.api import calibrate
from planner.calibration import layout_pairs

console = render.LiveConsole(highlight=False, soft_wrap=False)

HELP = """Predicted against measured step time of training runs, per run and per hardware.

With no FILE, the runs hyperplan ships (published runs of Megatron-LM, NeMo, Megatron-Bridge, torchtitan,
NeMo Automodel and MindSpeed-LLM on A100, H100, H200, B200, B300, GB200, GB300 and Ascend 910B). A run is "fit" when
its hardware file's efficiency was fitted on it, "held-out" otherwise: only held-out runs say how right the model is.
A run whose publisher says a bug slowed it (its known_regression field) is "regression": neither fitted nor scored.
A run with a never_fitted field (why no fit may use it) is always held out, and --fit refuses it.

Bring your own cluster's measurements in the same JSON format (see `planner/calibration/runs.py`) and fit a
hardware file to them: hyperplan calibrate my_runs.json --fit run-a,run-b -o my-cluster.toml

Layout pairs: runs of one table (a run's table field; without it, its file) that measure the same job in two
strategies are compared, the estimated tokens/s ratio against the measured one. That is what a plan's choice
between two layouts rests on.

With --serving, serving deployments instead: tokens/s per device measured against the estimate at each one's
layout, batch and context (the shipped ones, published by DeepSeek, SGLang and Huawei, or your own in the
format of planner/inference/published_deployments.json).

Example: hyperplan calibrate --hardware dgx-h100
"""


def register(app: typer.Typer) -> None:
    app.command("calibrate", help=HELP)(calibrate_cmd)


@guarded
def calibrate_cmd(
    files: Annotated[Optional[list[Path]], typer.Argument(help="Runs files (JSON); default: the shipped runs.",
                                                          show_default=False)] = None,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", help="Only the runs on this hardware (a preset name or .toml file as the runs name it).")] = None,
    category: Annotated[Optional[str], typer.Option(
        "--category", help="Only runs of this category (dense_training, moe_training).")] = None,
    fit: Annotated[Optional[str], typer.Option(
        "--fit", metavar="RUN,RUN,...",
        help="Fit the hardware file of these runs (all on one hardware) on them: the GEMM plateaus (bf16, and "
             "fp8 when a run trains in FP8), the per-kernel overhead and the overlap efficiency.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="With --fit: write the fitted hardware file here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing -o or --plot file (an input of the "
                                        "command is never replaced).")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Draw predicted against measured tokens/s to this PNG (needs matplotlib).")] = None,
    serving: Annotated[bool, typer.Option(
        "--serving", help="Serving deployments (JSON) instead of training runs: tokens/s per device measured "
                          "against estimated.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    if serving:
        given = [flag for flag, value in (("--fit", fit), ("-o", output), ("--plot", plot), ("--category", category))
                 if value is not None]
        if given:
            raise InvalidInput(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to training runs; "
                               "drop them with --serving")
        from cli.calibrate_serving import check_deployments

        check_deployments(files, hardware, as_json, console)
        return
    fit_ids = [x.strip() for x in fit.split(",") if x.strip()] if fit else None
    if fit is not None and not fit_ids:
        raise InvalidInput(f"--fit {fit!r} names no run; give the ids of the runs to fit on, RUN,RUN,... "
                           "(`hyperplan calibrate --json` lists them)")
    inputs = (*(str(f) for f in files or ()), hardware)
    if output is not None:
        if fit_ids is None:
            raise InvalidInput("-o writes a fitted hardware file; give --fit RUN,RUN,... too")
        if output.suffix.lower() != ".toml":
            raise InvalidInput(f"-o {output}: a hardware file is a .toml file; name it like my-cluster.toml")
        check_output(output, "-o", protect=inputs, force=force, noun="fitted hardware file")
    if plot is not None:
        if plot.suffix.lower() not in (".png", ".svg"):
            raise InvalidInput(f"--plot {plot}: use a file name ending in .png or .svg")
        check_output(plot, "--plot", protect=inputs, force=force, noun="plot")
    with render.progress("estimating runs" + (" and fitting" if fit_ids else "")):
        result = calibrate(files, hardware=hardware, category=category, fit=fit_ids)
    if not result.predictions and result.skipped:
        more = f" (and {len(result.skipped) - 1} more run{'s' if len(result.skipped) > 2 else ''})" \
            if len(result.skipped) > 1 else ""
        raise InvalidInput(f"no run could be predicted: {result.skipped[0]}{more}")
    if output is not None:
        write_atomically(str(output), lambda: result.fitted_text, inputs, "fitted hardware file")
    if plot is not None:
        from cli.calibrate_plot import draw

        draw(result, plot)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1, allow_nan=False))
        return
    _print(result, output, plot)


def _print(result, output: Optional[Path], plot: Optional[Path]) -> None:
    rows = []
    for p in result.predictions:
        measured, predicted = p.tokens_per_s_per_device
        rows.append((p.run.id, p.cluster, p.group, render.seconds(p.measured_s),
                     render.seconds(p.predicted_s), f"{100 * p.error:+.1f}%"))
    console.print(render.table("runs: step time measured and predicted",
                               ("run", "hardware", "group", "measured", "predicted", "error"), rows,
                               right=("measured", "predicted", "error")))
    summary = [(s["hardware"], s["group"], s["category"], str(s["rows"]), f"{100 * s['mean_abs_error']:.1f}%",
                f"{100 * s['max_abs_error']:.1f}%") for s in result.summary()]
    console.print(render.table("per hardware (mean and max |error| of the step time)",
                               ("hardware", "group", "category", "runs", "mean", "max"), summary,
                               right=("runs", "mean", "max")))
    mem = [(p.run.id, f"{p.run.memory_gib:.1f}", f"{p.predicted_memory_gib:.1f}", "yes" if p.estimate.fits else "NO")
           for p in result.predictions if p.run.memory_gib is not None]
    if mem:
        console.print(render.table("memory per device, GiB (measured: the allocator's reserved peak)",
                                   ("run", "measured", "predicted", "fits"), mem, right=("measured", "predicted")))
        by_stack: dict[str, list[dict]] = {}
        for s in result.memory_summary():
            by_stack.setdefault(s["stack"], []).append(s)
        for stack, groups in by_stack.items():
            parts = [f"{s['group']} mean {s['mean_abs_error']:.1%}, max {s['max_abs_error']:.1%} ({s['rows']} runs)"
                     for s in groups]
            refit = groups[0]["fitted_reserve"]
            console.print(f"memory, {stack}: {'; '.join(parts)}; allocator reserve {groups[0]['allocator_reserve']:.1%}"
                          + (f" in the stack, {refit:.1%} refitted on the fit runs" if refit is not None else ""))
    _print_pairs(result)
    unfit = [p.run.id for p in result.predictions if not p.estimate.fits]
    if unfit:
        console.print(f"predicted not to fit although they ran: {', '.join(unfit)}")
    for line in result.skipped:
        console.print(f"skipped {line}")
    for hw, note in sorted(result.assumptions().items()):
        console.print(f"{hw}: {note}")
    if result.fit is not None:
        values = ", ".join(f"{k} {v:g}" for k, v in result.fit.values.items())
        runs = len(result.fit.runs)
        console.print(f"fitted {result.fit.hardware} on {runs} run{'s' if runs != 1 else ''} in "
                      f"{result.fit.evaluations} evaluations: {values}")
        if bound := result.fit.bound_sentence():
            console.print(f"warning: {bound}")
        if output is not None:
            console.print(f"wrote {output}")
    if plot is not None:
        console.print(f"wrote {plot}")


def _print_pairs(result) -> None:
    """Runs of one table measuring one job in two strategies: the estimated ratio against the measured one (each
    pair when there are few, else per category)."""
    found = layout_pairs.pairs(result.predictions)
    if not found:
        return
    title = "layout pairs: tokens/s of a over b, measured and estimated (one table, one job, two strategies)"
    if len(found) <= 20:
        rows = [(p.a.run.id, p.b.run.id, p.differs, f"{p.measured:.3f}", f"{p.estimated:.3f}",
                 f"{100 * p.error:.1f}%" + (" flipped" if p.flipped else "")) for p in found]
        console.print(render.table(title, ("a", "b", "differs", "measured", "estimated", "error"), rows,
                                   right=("measured", "estimated", "error")))
        return
    rows = [(s["category"], s["differs"], str(s["pairs"]), f"{100 * s['median_error']:.1f}%",
             f"{100 * s['max_error']:.1f}%", str(s["flipped"])) for s in layout_pairs.summary(found)]
    console.print(render.table(title, ("category", "differs", "pairs", "median", "max", "flipped"), rows,
                               right=("pairs", "median", "max", "flipped")))


__all__ = ["register"]
