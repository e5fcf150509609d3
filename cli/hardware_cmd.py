"""`hyperplan hardware list|show`: the hardware presets and user files, as tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.markup import escape

from cli import render
from cli.errors import guarded
from cost_models import Cluster, cluster_as_dict, load_cluster, preset_names
from cost_models.accuracy import CATEGORIES, held_out_dicts
from planner.caveats import checked_sentence
from planner.inference.deployments import serving_accuracy

console = render.LiveConsole(highlight=False, soft_wrap=False)


def register(app: typer.Typer) -> None:
    """Add the `hardware` command group to the root app."""
    hw = typer.Typer(name="hardware", help="List and show hardware presets (or your own TOML file).",
                     no_args_is_help=True)
    hw.command("list")(list_cmd)
    hw.command("show")(show_cmd)
    app.add_typer(hw, name="hardware")


@guarded
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the bundled hardware presets."""
    clusters = [load_cluster(name) for name in preset_names()]
    if as_json:
        rows = [
            {"name": c.name, "description": c.description, "device": c.device.name, "n_devices": c.n_devices,
             "levels": [lvl.name for lvl in c.levels], "transferred_from": c.transferred_from or None,
             "held_out": held_out_dicts(c.held_out)}
            for c in clusters
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    rows = [(c.name, c.device.name, c.n_devices,
             " > ".join(f"{lvl.name} {_gbs(lvl.bandwidth_bytes_per_s)}" for lvl in c.levels)) for c in clusters]
    console.print(render.table("hardware presets", ("name", "device", "devices",
                                                    "interconnect (GB/s per device per direction)"), rows,
                               right=("devices",)))
    console.print(render.table("how far off estimates came out: the runs each fit left out", (
        "name", "dense training", "MoE training"), ((c.name, *_held_out(c)) for c in clusters)))
    console.print("mean |error| of the step times (runs, largest); `hyperplan calibrate --hardware NAME` lists "
                  "them")


def _held_out(c: Cluster) -> tuple[str, str]:
    """A preset's held-out errors, dense and MoE training: mean (runs, largest), "-" for none, or, for a preset
    that carries another's fit, whose."""
    mine = {h.category: f"{100 * h.mean:.1f} % ({h.runs}, {100 * h.max:.1f} %)" for h in c.held_out}
    none = f"- ({c.transferred_from}'s fit)" if c.transferred_from else "-"
    return mine.get("dense_training", none), mine.get("moe_training", none)


@guarded
def show_cmd(
    name_or_path: Annotated[str, typer.Argument(help="A preset name or the path of a .toml hardware file.")],
    devices: Annotated[
        Optional[int], typer.Option("--devices", help="Scale to N devices (whole nodes or supernodes).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (SI units) instead of tables.")] = False,
) -> None:
    """Show one cluster: device, interconnect levels, memory tiers, efficiency data, sources."""
    cluster = load_cluster(name_or_path, devices=devices)
    if as_json:
        typer.echo(json.dumps({**cluster_as_dict(cluster), "serving_checked": serving_accuracy(cluster)}, indent=2))
        return
    _print_cluster(cluster)


def _print_cluster(c: Cluster) -> None:
    dev = c.device
    console.print(f"[bold]{escape(c.name)}[/]: {escape(c.description)}")
    console.print(f"{c.n_devices} x {escape(dev.name)}; HBM {render.nbytes(dev.hbm_bytes)} at "
                  f"{dev.hbm_bytes_per_s / 1e12:.2f} TB/s; peak (dense TFLOP/s) "
                  + ", ".join(f"{d} {v / 1e12:g}" for d, v in dev.peak_flops_per_s)
                  + (f"; vector {dev.vector_flops_per_s / 1e12:g}" if dev.vector_flops_per_s else
                     "; vector peak unknown (elementwise ops bound by HBM only)")
                  + ("; FP8 GEMMs take any operand layout" if dev.fp8_any_layout else ""))
    console.print(render.table("interconnect levels (innermost first)", (
        "level", "group", "groups", "GB/s/dir", "latency", "algorithm", "topology", "bus eff.", "link"), (
        (lvl.name, c.group_size(i), c.groups(i), _gbs(lvl.bandwidth_bytes_per_s), render.seconds(lvl.latency_s),
         lvl.algorithm, lvl.topology, _curve(lvl.bus_efficiency, render.nbytes), lvl.link) for i, lvl in enumerate(c.levels)),
        right=("group", "groups", "GB/s/dir", "latency"), prose=("link",)))
    if c.memory_tiers:
        console.print(render.table("memory tiers beyond HBM (per device)", (
            "tier", "capacity", "GB/s/dir", "latency", "pooled", "efficiency", "link"), (
            (t.name, render.nbytes(t.capacity_bytes), _gbs(t.bandwidth_bytes_per_s), render.seconds(t.latency_s),
             "yes" if t.pooled else "no", _curve(t.efficiency, render.nbytes), t.link) for t in c.memory_tiers),
            right=("capacity", "GB/s/dir", "latency"), prose=("link",)))
    console.print(f"matmul efficiency by FLOPs: {_curve(c.matmul_efficiency, render.flops)}; "
                  f"memory efficiency by bytes: {_curve(c.memory_efficiency, render.nbytes)}; "
                  f"DP overlap efficiency: {c.dp_overlap_efficiency:g}"
                  + (f"; host overhead per training op: {render.seconds(c.host_overhead_s)}"
                     if c.host_overhead_s else ""), markup=False)
    if c.calibration:  # whether the efficiency is this hardware's own fit or an assumption carried from another
        console.print(f"efficiency calibration: {c.calibration}", markup=False)
    for category in CATEGORIES:  # how far off the runs the fit left out came out, per kind of job
        console.print(f"checked: {checked_sentence(c, category)[0]}", markup=False)
    console.print(f"checked (serving): {serving_accuracy(c)['sentence']}", markup=False)
    if c.attention_plateaus:
        kernels = ", ".join(f"{k} {f:g}/{b:g}" for k, f, b in c.attention_plateaus)
        kf, kb = c.attention_half_keys
        law = bool(kf or kb)  # a length law: the figures are its plateaus
        half = f", half of it at {kf:g}/{kb:g} keys per query" if law else ""
        half += "".join(f" ({k}'s own: half at {f:g}/{b:g} keys)" for k, f, b in c.attention_kernel_half_keys)
        (df, db), (wf, wb) = c.attention_half_dims, c.attention_wide_heads
        narrow, wide = bool(df or db), (wf, wb) != (1.0, 1.0)  # measured away from head dim 128, either side
        half += f", head dims under 128 slower (D {df:g}/{db:g})" if narrow else ""
        half += f", heads wider than 128 at {wf:g}/{wb:g} of head dim 128's rate" if wide else ""
        half += "" if narrow or wide else ", every head dim at head dim 128's rate (not measured)"
        console.print(f"flash attention ({'plateau share' if law else 'share'} of the bf16 peak, forward/backward): "
                      f"{kernels}{half}"
                      + (f"; {c.attention_basis}" if c.attention_basis else ""), markup=False)
    if c.attention_fp8_plateaus:  # the kernel run in FP8 (a stack's fp8_attention), where measured
        wide = {k: (f, b) for k, f, b in c.attention_fp8_wide_heads}
        shown = ", ".join(f"{k} {f:g}/{b:g}" + (f" (MLA's heads at {wide[k][0]:g}/{wide[k][1]:g} of head dim 128's rate)"
                                                  if k in wide else "") for k, f, b in c.attention_fp8_plateaus)
        console.print(f"flash attention in FP8 (plateau share of the fp8 peak, forward/backward): {shown}",
                      markup=False)
    for src in c.sources:
        console.print(f"  source: {src}", markup=False)


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:g}"


def _curve(curve, size) -> str:
    """An efficiency curve by its ends: '0.35 at 98 KiB .. 0.8 at 954 MiB' (`size` renders the sizes)."""
    if curve.is_constant:
        return f"{curve.points[0][1]:g}"
    (s0, e0), (s1, e1) = curve.points[0], curve.points[-1]
    return f"{render.sig(e0)} at {size(s0)} .. {render.sig(e1)} at {size(s1)}"
