"""`hyperplan hardware list|show`: the hardware presets and user files, as tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.errors import guarded
from cost_models import Cluster, cluster_as_dict, load_cluster, preset_names

console = Console(highlight=False, soft_wrap=False)


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
             "levels": [lvl.name for lvl in c.levels]}
            for c in clusters
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="hardware presets", title_justify="left")
    for col in ("name", "device", "devices", "interconnect (GB/s per device per direction)"):
        table.add_column(col)
    for c in clusters:
        links = " > ".join(f"{lvl.name} {_gbs(lvl.bandwidth_bytes_per_s)}" for lvl in c.levels)
        table.add_row(escape(c.name), escape(c.device.name), str(c.n_devices), escape(links))
    console.print(table)


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
        typer.echo(json.dumps(cluster_as_dict(cluster), indent=2))
        return
    _print_cluster(cluster)


def _print_cluster(c: Cluster) -> None:
    dev = c.device
    console.print(f"[bold]{escape(c.name)}[/]: {escape(c.description)}")
    console.print(f"{c.n_devices} x {escape(dev.name)}; HBM {dev.hbm_bytes / 2**30:.1f} GiB at "
                  f"{dev.hbm_bytes_per_s / 1e12:.2f} TB/s; peak (dense TFLOP/s) "
                  + ", ".join(f"{d} {v / 1e12:g}" for d, v in dev.peak_flops_per_s))
    levels = Table(title="interconnect levels (innermost first)", title_justify="left")
    for col in ("level", "group", "groups", "GB/s/dir", "latency µs", "algorithm", "topology", "bus eff.", "link"):
        levels.add_column(col)
    for i, lvl in enumerate(c.levels):
        levels.add_row(escape(lvl.name), str(c.group_size(i)), str(c.groups(i)), _gbs(lvl.bandwidth_bytes_per_s),
                       f"{lvl.latency_s * 1e6:g}", lvl.algorithm, lvl.topology, _curve(lvl.bus_efficiency),
                       escape(lvl.link))
    console.print(levels)
    if c.memory_tiers:
        tiers = Table(title="memory tiers beyond HBM (per device)", title_justify="left")
        for col in ("tier", "capacity GiB", "GB/s/dir", "latency µs", "pooled", "efficiency", "link"):
            tiers.add_column(col)
        for t in c.memory_tiers:
            tiers.add_row(escape(t.name), f"{t.capacity_bytes / 2**30:.1f}", _gbs(t.bandwidth_bytes_per_s),
                          f"{t.latency_s * 1e6:g}", "yes" if t.pooled else "no", _curve(t.efficiency),
                          escape(t.link))
        console.print(tiers)
    console.print(f"matmul efficiency by FLOPs: {_curve(c.matmul_efficiency)}; "
                  f"memory efficiency by bytes: {_curve(c.memory_efficiency)}; "
                  f"DP overlap efficiency: {c.dp_overlap_efficiency:g}")
    for src in c.sources:
        console.print(f"  source: {src}", markup=False)


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:g}"


def _curve(curve) -> str:
    if curve.is_constant:
        return f"{curve.points[0][1]:g}"
    (s0, e0), (s1, e1) = curve.points[0], curve.points[-1]
    return f"{e0:g} @ {s0:.0e} .. {e1:g} @ {s1:.0e}"
