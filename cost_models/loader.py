"""Read a hardware TOML file (a preset or the user's own) into a `Cluster`, checking every field.

Files use human units (TFLOP/s, GB/s or Gb/s, GiB or GB, microseconds);
they are converted to SI here and nowhere else. Every malformed field is a
`SpecError` that names it, e.g. `levels[1].bandwidth_gb_s: expected a
positive number, got "fast"`, and unknown keys are refused so that a typo
cannot silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path
from typing import Any

from cost_models.accuracy import parse_held_out
from cost_models.curves import EfficiencyCurve, half_size, overhead_law
from cost_models.errors import SpecError
from cost_models.spec import (ALGORITHMS, DTYPES, FP8_ATTENTION_FORMATS, TOPOLOGIES, Cluster, Device, Level,
                              MemoryTier, check_device_count)
from cost_models.toml_table import Table, shown

PRESET_DIR = Path(__file__).parent / "presets"

GB = 1e9
GIB = 2.0**30
GBIT = 1e9 / 8
TFLOP = 1e12
US = 1e-6


def preset_names() -> list[str]:
    """Names of the bundled presets, sorted."""
    return list(_preset_names())


@functools.cache
def _preset_names() -> tuple[str, ...]:  # the package's own files: read once
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))


#: The fields a hardware fit sets (`hyperplan calibrate --fit`): a file that differs from its preset in any of them
#: is a fit of its own.
FIT_FIELDS = ("matmul_plateau", "fp8_matmul_plateau", "memory_plateau", "kernel_overhead_s", "host_overhead_s",
              "fitted_on")


def carries_preset_fit(cluster: Cluster) -> bool:
    """Whether `cluster` is a preset with that preset's fit, so that the shipped runs' and deployments' recorded
    errors, computed with that fit, speak for it: a file of a preset's name fitted to a user's own runs (`hyperplan
    calibrate --fit -o` keeps the name) is not."""
    if cluster.name not in _preset_names():
        return False
    preset = _load_preset(cluster.name)
    return all(getattr(cluster, k) == getattr(preset, k) for k in FIT_FIELDS)


def load_cluster(name_or_path: str, devices: int | None = None) -> Cluster:
    """A preset by name, or a TOML file by path; `devices` rescales it (see `Cluster.scaled`)."""
    if name_or_path in preset_names():
        cluster = _load_preset(name_or_path)
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise SpecError(
                f"unknown hardware {name_or_path!r}: no preset has that name and no file is there; "
                f"use one of {', '.join(preset_names())} or the path of a .toml hardware file."
            )
        cluster = load_file(path)
    return cluster if devices is None else cluster.scaled(devices)


@functools.lru_cache(maxsize=None)
def _load_preset(name: str) -> Cluster:
    return load_file(PRESET_DIR / f"{name}.toml")


def load_file(path: Path) -> Cluster:
    """Parse and check one hardware file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read hardware file {str(path)!r} ({exc.strerror or exc}); check the path.") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path.name}: not a UTF-8 text file; give a TOML hardware file.") from None
    return load_text(text, source=path.name, default_name=path.stem)


def load_text(text: str, *, source: str, default_name: str) -> Cluster:
    """Parse and check the text of one hardware file (`source` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML ({exc}); fix the syntax.") from None
    return parse_cluster(data, source=source, default_name=default_name)


def parse_cluster(data: dict[str, Any], *, source: str, default_name: str) -> Cluster:
    """Build a `Cluster` from the parsed TOML tables."""
    root = Table(data, "", source)
    root.only("cluster", "device", "levels", "memory_tiers", "efficiency")
    meta = root.table("cluster")
    meta.only("name", "description", "devices", "sources")
    name = meta.text("name", default=default_name)
    levels = tuple(_level(t) for t in root.tables("levels", required=True))
    _check_levels(levels, root)
    n_devices = meta.integer("devices", minimum=1)
    check_device_count(f"{source}: cluster.devices", levels, n_devices)
    device = _device(root.table("device"))
    return Cluster(
        name=name,
        description=meta.text("description", default=""),
        device=device,
        levels=levels,
        memory_tiers=tuple(_tier(t) for t in root.tables("memory_tiers", required=False)),
        n_devices=n_devices,
        sources=tuple(meta.texts("sources")),
        **_efficiency(_efficiency_table(root), device),
    )


def _efficiency_table(root: Table) -> Table:
    """The [efficiency] table, which a hardware file must give: without it every kernel would be costed at the
    device's peak, and `hyperplan calibrate --fit` has no table to write a fit into."""
    if "efficiency" not in root.data:
        raise root.error("efficiency", "missing: without it every kernel would be costed at the device's peak; copy "
                         "the [efficiency] table of the closest preset (cost_models/presets/) and fit it to your own "
                         "runs with `hyperplan calibrate RUNS.json --fit RUN,RUN -o FILE`")
    return root.table("efficiency")


def _pairs_by_name(eff, key: str, what: str, most: float, names: tuple[str, ...] = ()) -> tuple:
    """A table of [forward, backward] figures by name (one of `names`, where given), each in (0, most]."""
    table = eff.table(key, required=False)
    out = []
    for name in table.data:
        value = table.data[name]
        ok = ((not names or name in names) and isinstance(value, list) and len(value) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= most for v in value))
        if not ok:
            lead = f"{' or '.join(names)} = " if names else ""
            raise table.error(name, f"expected {lead}[forward, backward] {what} in (0, {most:g}], "
                                    f"got {name} = {shown(value)}")
        out.append((name, float(value[0]), float(value[1])))
    return tuple(out)


def _pair(eff: Table, key: str, what: str, rate: bool = False) -> tuple[float, float]:
    """A [forward, backward] pair of numbers >= 0 in [efficiency] (0, 0 when absent), or with `rate` of rates in
    (0, 1] (1, 1 when absent)."""
    pair = eff.data.get(key, [1.0, 1.0] if rate else [0.0, 0.0])
    if not (isinstance(pair, list) and len(pair) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and (0 < v <= 1 if rate else v >= 0)
                    for v in pair)):
        raise eff.error(key, f"expected [forward, backward] {what}, got {shown(pair)}")
    return float(pair[0]), float(pair[1])


def _efficiency(eff: Table, device: Device) -> dict[str, Any]:
    """The [efficiency] table: the overhead law's parameters (or bare tables), flash-attention plateaus, the
    overlap efficiency, and where the figures come from.

    With `matmul_plateau`, `memory_plateau` and `kernel_overhead_us` the curves are the law of
    `cost_models.curves.overhead_law` at this device's own peaks (bf16 for `matmul`, fp8 for `fp8_matmul`),
    sampled at eighth-decades; `matmul = [[size, eff], ...]` tables are taken as given instead.
    """
    eff.only("matmul", "memory", "matmul_plateau", "fp8_matmul_plateau", "memory_plateau", "kernel_overhead_us",
             "host_overhead_us", "attention", "attention_fp8", "attention_fp8_wide_heads", "attention_basis",
             "attention_half_keys", "attention_kernel_half_keys", "attention_half_dims", "attention_wide_heads",
             "overlap", "fitted_on", "not_fitted", "calibration", "held_out", "transferred_from")
    law = [k for k in ("matmul_plateau", "memory_plateau", "kernel_overhead_us") if k in eff.data]
    if law and len(law) != 3:
        missing = sorted({"matmul_plateau", "memory_plateau", "kernel_overhead_us"} - set(law))
        raise eff.error(missing[0], "missing; the overhead law needs matmul_plateau, memory_plateau and "
                                    "kernel_overhead_us together")
    if law and ("matmul" in eff.data or "memory" in eff.data):
        raise eff.error("matmul", "give either the law's parameters or [size, efficiency] tables, not both")
    t0 = eff.number("kernel_overhead_us") * US if law else 0.0
    fp8 = None
    plateaus: dict[str, Any] = {}
    if law:
        plateaus = {"matmul_plateau": eff.fraction("matmul_plateau", 1.0),
                    "memory_plateau": eff.fraction("memory_plateau", 1.0),
                    "fp8_matmul_plateau": eff.fraction("fp8_matmul_plateau", 1.0)
                    if "fp8_matmul_plateau" in eff.data else None}
        if plateaus["fp8_matmul_plateau"] is not None and "fp8" not in dict(device.peak_flops_per_s):
            raise eff.error("fp8_matmul_plateau", "the device lists no fp8 peak")
        matmul, memory, fp8 = law_curves(device, plateaus["matmul_plateau"], plateaus["fp8_matmul_plateau"],
                                         plateaus["memory_plateau"], t0)
    else:
        if "fp8_matmul_plateau" in eff.data:
            raise eff.error("fp8_matmul_plateau", "needs the law's parameters (matmul_plateau, memory_plateau, "
                                                  "kernel_overhead_us)")
        for key in ("matmul", "memory"):
            if key not in eff.data:  # else the curve would be 1: every kernel at the peak, unstated
                raise eff.error(key, "missing; give the overhead law's matmul_plateau, memory_plateau and "
                                     "kernel_overhead_us, or matmul and memory efficiencies by size")
        matmul, memory = eff.curve("matmul"), eff.curve("memory")
    # per kernel (file order: the first is the device's default flash kernel), then per FP8 format
    attention = _pairs_by_name(eff, "attention", "fractions of the bf16 peak", 1.0)
    attention_fp8 = _pairs_by_name(eff, "attention_fp8", "fractions of the fp8 peak", 1.0, FP8_ATTENTION_FORMATS)
    fp8_wide = _pairs_by_name(eff, "attention_fp8_wide_heads", "rates over head dim 128's", 2.0, FP8_ATTENTION_FORMATS)
    half, dims = (_pair(eff, key, f"{what} >= 0") for key, what in (("attention_half_keys", "key counts"),
                                                                   ("attention_half_dims", "head dims")))
    kernel_half = _pairs_by_name(eff, "attention_kernel_half_keys", "key counts", 1e6,  # of kernels it lists
                                 tuple(k for k, _, _ in attention))
    wide = _pair(eff, "attention_wide_heads", "rates over head dim 128's in (0, 1]", rate=True)
    fitted_on = eff.texts("fitted_on")
    return dict(matmul_efficiency=matmul, memory_efficiency=memory, fp8_matmul_efficiency=fp8,
                attention_plateaus=attention, attention_fp8_plateaus=attention_fp8,
                attention_fp8_wide_heads=fp8_wide,
                attention_half_keys=half, attention_kernel_half_keys=kernel_half, attention_half_dims=dims,
                attention_wide_heads=wide,
                kernel_overhead_s=t0, **plateaus,
                host_overhead_s=eff.number("host_overhead_us", default=0.0, allow_zero=True) * US,
                dp_overlap_efficiency=eff.fraction("overlap", default=1.0),
                attention_basis=eff.text("attention_basis", default=""),
                calibration=eff.text("calibration", default=""), fitted_on=tuple(fitted_on),
                not_fitted=tuple(eff.texts("not_fitted")),
                held_out=parse_held_out(eff.data.get("held_out", {}), f"{eff.source}: {eff.field('held_out')}"),
                transferred_from=eff.text("transferred_from", default=""))


def law_curves(device: Device, matmul_plateau: float, fp8_matmul_plateau: float | None, memory_plateau: float,
               overhead_s: float) -> tuple[EfficiencyCurve, EfficiencyCurve, EfficiencyCurve | None]:
    """(bf16 GEMM, memory, fp8 GEMM or None) curves of the overhead law at `device`'s own peaks."""
    bf16 = dict(device.peak_flops_per_s).get("bf16", max(v for _, v in device.peak_flops_per_s))
    fp8 = (law_table(device.peak_flops("fp8"), fp8_matmul_plateau, overhead_s)
           if fp8_matmul_plateau is not None else None)
    return (law_table(bf16, matmul_plateau, overhead_s), law_table(device.hbm_bytes_per_s, memory_plateau, overhead_s),
            fp8)


def with_law(cluster: Cluster, *, matmul_plateau: float, fp8_matmul_plateau: float | None, memory_plateau: float,
             overhead_s: float, overlap: float, host_overhead_s: float) -> Cluster:
    """`cluster` with its efficiency curves made anew from these law parameters and the host's per-op overhead
    (what a fit tries)."""
    matmul, memory, fp8 = law_curves(cluster.device, matmul_plateau, fp8_matmul_plateau, memory_plateau, overhead_s)
    return dataclasses.replace(cluster, matmul_efficiency=matmul, memory_efficiency=memory, fp8_matmul_efficiency=fp8,
                               kernel_overhead_s=overhead_s, matmul_plateau=matmul_plateau,
                               fp8_matmul_plateau=fp8_matmul_plateau, memory_plateau=memory_plateau,
                               dp_overlap_efficiency=overlap,
                               host_overhead_s=host_overhead_s)


def law_table(peak_per_s: float, plateau: float, overhead_s: float) -> EfficiencyCurve:
    """The overhead law at eighth-decades from 10**-3 to 10**4 times its n_half (interpolation in log size
    between them errs by under 0.1% of the plateau)."""
    n_half = half_size(peak_per_s, plateau, overhead_s)
    sizes = [n_half * 10.0 ** (k / 8.0) for k in range(-24, 33)]
    return EfficiencyCurve(points=tuple((s, overhead_law(s, peak_per_s, plateau, overhead_s)) for s in sizes))


def _device(t: Table) -> Device:
    t.only("name", "peak_tflops", "vector_tflops", "hbm_gib", "hbm_gb", "hbm_bandwidth_gb_s", "fp8_any_layout")
    peaks_t = t.table("peak_tflops")
    peaks_t.only(*DTYPES)
    peaks = tuple((d, peaks_t.number(d) * TFLOP) for d in DTYPES if d in peaks_t.data)
    if not peaks:
        raise peaks_t.error("", f"list at least one dense peak ({', '.join(DTYPES)}) in TFLOP/s")
    vector = t.number("vector_tflops", default=None)
    fp32 = dict(peaks).get("fp32")
    return Device(
        name=t.text("name"),
        peak_flops_per_s=peaks,
        vector_flops_per_s=vector * TFLOP if vector is not None else fp32,
        hbm_bytes=t.one_of({"hbm_gib": GIB, "hbm_gb": GB}, "HBM capacity per device"),
        hbm_bytes_per_s=t.number("hbm_bandwidth_gb_s") * GB,
        fp8_any_layout=t.boolean("fp8_any_layout", default=False),
    )


def _level(t: Table) -> Level:
    t.only("name", "link", "group_size", "bandwidth_gb_s", "bandwidth_gbit_s", "latency_us",
           "algorithm", "topology", "bus_efficiency", "partial")
    size = t.integer("group_size", minimum=2, default=None)
    return Level(
        name=t.text("name"),
        group_size=size,
        bandwidth_bytes_per_s=t.one_of({"bandwidth_gb_s": GB, "bandwidth_gbit_s": GBIT},
                                       "bandwidth per device per direction"),
        latency_s=t.number("latency_us", allow_zero=True) * US,
        algorithm=t.choice("algorithm", ALGORITHMS),
        topology=t.choice("topology", TOPOLOGIES, default="switched"),
        bus_efficiency=t.curve("bus_efficiency"),
        link=t.text("link", default=""),
        partial=t.integer("partial", minimum=1, default=0),
    )


def _check_levels(levels: tuple[Level, ...], root: Table) -> None:
    names = [lvl.name for lvl in levels]
    for i, lvl in enumerate(levels):
        if names.index(lvl.name) != i:
            raise root.error(f"levels[{i}].name", f"{lvl.name!r} is used twice; give each level its own name")
        if lvl.group_size is None and i < len(levels) - 1:
            raise root.error(f"levels[{i}].group_size",
                             "missing; only the outermost level may leave it open (spanning the cluster)")
        if i > 0 and lvl.group_size is not None:
            inner = levels[i - 1].group_size
            if lvl.group_size <= inner or lvl.group_size % inner:
                raise root.error(
                    f"levels[{i}].group_size",
                    f"{lvl.group_size} is not a larger multiple of levels[{i - 1}].group_size {inner}; "
                    "each group must be made of whole groups of the level below")


def _tier(t: Table) -> MemoryTier:
    t.only("name", "link", "capacity_gib", "capacity_gb", "bandwidth_gb_s", "latency_us", "pooled", "efficiency")
    return MemoryTier(
        name=t.text("name"),
        capacity_bytes=t.one_of({"capacity_gib": GIB, "capacity_gb": GB}, "capacity per device"),
        bandwidth_bytes_per_s=t.number("bandwidth_gb_s") * GB,
        latency_s=t.number("latency_us", allow_zero=True) * US,
        pooled=t.boolean("pooled"),
        link=t.text("link", default=""),
        efficiency=t.curve("efficiency"),
    )
