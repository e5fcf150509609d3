"""The hardware model: a device, the levels of its interconnect, its memory tiers, its efficiencies.

Everything here is SI (bytes, seconds, FLOP/s); the loader converts the
human units of the TOML files. A cluster is a hierarchy of levels, innermost
first: a group of level k holds `group_size` devices and is made of whole
groups of level k-1 (die -> node -> supernode -> scale-out). The outermost
level may leave `group_size` open: it then spans the whole cluster, which is
how `--devices N` grows a preset by adding nodes or supernodes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from cost_models.accuracy import HeldOut, held_out_dicts
from cost_models.curves import EfficiencyCurve
from cost_models.errors import SpecError

Algorithm = Literal["ring", "tree", "direct", "in_network"]
"""Collective algorithm inside one level: NCCL/HCCL ring, double binary tree, one-shot direct
(full mesh or switch), or in-network reduction in the switches (NVLink SHARP, SHArP)."""

Topology = Literal["switched", "full_mesh"]
"""switched: any subset of a level's devices gets the full per-device bandwidth;
full_mesh: each device's bandwidth is split over dedicated links, one per peer (HCCS on 8-NPU servers)."""

ALGORITHMS: tuple[str, ...] = ("ring", "tree", "direct", "in_network")
TOPOLOGIES: tuple[str, ...] = ("switched", "full_mesh")
#: The formats a flash kernel runs in FP8: per-tensor scales (Transformer Engine's delayed and current scaling) and
#: MXFP8's 32-element blocks (its mxfp8 recipe), each timed apart by cuDNN.
FP8_ATTENTION_FORMATS = ("fp8", "mxfp8")
DTYPES: tuple[str, ...] = ("fp4", "fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64")


def _named(rows: tuple[tuple[str, float, float], ...], name: str) -> tuple[float, float] | None:
    """The (forward, backward) figures of `name` in a table of (name, forward, backward) rows, if it lists it."""
    return next(((fwd, bwd) for n, fwd, bwd in rows if n == name), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator as the framework sees it (one rank): dense peaks and its HBM."""

    name: str
    peak_flops_per_s: tuple[tuple[str, float], ...]  # (dtype, dense matrix-unit peak), sorted by dtype
    vector_flops_per_s: float | None  # non-matrix throughput for elementwise ops; None = unknown
    hbm_bytes: float
    hbm_bytes_per_s: float
    fp8_any_layout: bool = False  # FP8 GEMMs take operands in any layout (Blackwell); else only TN (Hopper, Ada:
    # cuBLASLt), so an FP8 operand a backward GEMM reads transposed is written a second time, transposed

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; SpecError naming the dtypes this device lists if absent."""
        for name, value in self.peak_flops_per_s:
            if name == dtype:
                return value
        listed = ", ".join(n for n, _ in self.peak_flops_per_s)
        raise SpecError(f"device {self.name} lists no {dtype} peak; use one of: {listed}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One level of the interconnect: groups of `group_size` devices joined by one kind of link."""

    name: str
    group_size: int | None  # devices in one group of this level; None = the whole cluster
    bandwidth_bytes_per_s: float  # per device, per direction
    latency_s: float  # alpha: cost of one step of a collective algorithm at this level
    algorithm: Algorithm
    topology: Topology = "switched"
    bus_efficiency: EfficiencyCurve  # achievable fraction of bandwidth by message bytes
    link: str = ""
    partial: int = 0  # a job may take the same share of each group, in multiples of this (an NVL72 rack's
    # trays of 4: 64 of its 72 GPUs); 0: whole groups only


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTier:
    """Memory beyond HBM (host DRAM, pooled DRAM): per-device share of capacity and bandwidth."""

    name: str
    capacity_bytes: float  # per device
    bandwidth_bytes_per_s: float  # per device, per direction, HBM <-> tier
    latency_s: float
    pooled: bool  # reachable over the scale-up fabric (any node's DRAM) vs local PCIe / C2C only
    link: str
    efficiency: EfficiencyCurve  # achievable fraction of bandwidth by transfer bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A device, its interconnect levels (innermost first), memory tiers, size and efficiency data."""

    name: str
    description: str
    device: Device
    levels: tuple[Level, ...]
    memory_tiers: tuple[MemoryTier, ...]
    n_devices: int
    matmul_efficiency: EfficiencyCurve  # fraction of matrix peak by FLOPs of one op
    memory_efficiency: EfficiencyCurve  # fraction of HBM bandwidth by bytes of one op
    dp_overlap_efficiency: float  # fraction of a compute window that can hide communication beside it
    sources: tuple[str, ...] = ()
    fp8_matmul_efficiency: EfficiencyCurve | None = None  # FP8 GEMMs by FLOPs of one op; None: not measured
    attention_plateaus: tuple[tuple[str, float, float], ...] = ()  # (kernel, forward, backward): fractions of bf16 peak
    attention_basis: str = ""  # where those figures come from: a measurement, or an "ASSUMPTION: ..." carried over
    attention_fp8_plateaus: tuple[tuple[str, float, float], ...] = ()  # (format, forward, backward) of the flash
    # kernel run in FP8 (Transformer Engine's fp8_dot_product_attention): format "fp8" (per-tensor scales) or
    # "mxfp8" (MXFP8 blocks); fractions of the fp8 peak, on the same length and head-dim laws
    attention_fp8_wide_heads: tuple[tuple[str, float, float], ...] = ()  # (format, forward, backward) rate of heads
    # wider than 128 over head dim 128's in that format (cuDNN's FP8 MLA runs faster a FLOP than its head dim 128);
    # a format not listed takes `attention_wide_heads`
    attention_half_keys: tuple[float, float] = (0.0, 0.0)  # (forward, backward) keys per query row at which a flash
    # kernel reaches half its plateau (`cost_models.compute.attention_time_s`); 0: no dependence on the length
    attention_kernel_half_keys: tuple[tuple[str, float, float], ...] = ()  # (kernel, forward, backward): a kernel's
    # own length law where it was measured at several lengths; a kernel not listed takes `attention_half_keys`
    attention_half_dims: tuple[float, float] = (0.0, 0.0)  # (forward, backward) D of the head-dim law (see
    # `cost_models.compute.head_dim_factor`); 0: every head dim at head dim 128's rate
    attention_wide_heads: tuple[float, float] = (1.0, 1.0)  # (forward, backward) rate of heads wider than 128 (MLA's
    # 192/128, where cuDNN was measured) over head dim 128's; 1: not measured, head dim 128's rate
    kernel_overhead_s: float = 0.0  # t0 of the overhead law the curves follow (0: the curves are bare tables)
    host_overhead_s: float = 0.0  # what issuing one op from an eager training step's host adds to it (0: none)
    matmul_plateau: float | None = None  # the law's parameters the curves were made from (None: bare tables)
    fp8_matmul_plateau: float | None = None
    memory_plateau: float | None = None
    calibration: str = ""  # where the efficiency figures come from: a fit on named rows, or a stated assumption
    fitted_on: tuple[str, ...] = ()  # ids of the measured runs its efficiency parameters were fitted on
    not_fitted: tuple[str, ...] = ()  # the law's parameters those runs could not pin (kept from the file: assumptions)
    held_out: tuple[HeldOut, ...] = ()  # per category, the errors of the runs the fit left out (cost_models.accuracy)
    transferred_from: str = ""  # the preset whose fit these efficiency figures are, when none of this hardware's is

    def checked(self, category: str) -> HeldOut | None:
        """The held-out runs of `category` (dense_training, moe_training) on this hardware, if any; else those of
        runs that state no category ("training": a user's runs file may not tell dense from MoE)."""
        mine = {h.category: h for h in self.held_out}
        return mine.get(category) or mine.get("training")

    @property
    def fitted(self) -> bool:
        """Whether this device's own measurements were fitted (otherwise its efficiency is an assumption)."""
        return bool(self.fitted_on)

    def attention_plateau(self, kernel: str) -> tuple[float, float, str]:
        """(forward, backward) fraction of the bf16 peak of flash-attention kernel `kernel`, and the kernel whose
        figures they are: the named one if the file lists it, else the file's first (an assumption to print)."""
        if (pair := _named(self.attention_plateaus, kernel)) is not None:
            return *pair, kernel
        if not self.attention_plateaus:
            raise SpecError(f"{self.name} lists no flash-attention efficiency ([efficiency.attention]); "
                            "add one, or run with the materialized attention of the megatron-2021 stack.")
        name, fwd, bwd = self.attention_plateaus[0]
        return fwd, bwd, name

    def half_keys(self, kernel: str) -> tuple[float, float]:
        """(forward, backward) keys per query row at which flash kernel `kernel` reaches half its plateau: its own,
        where the file measures its length law, else the device's (`attention_half_keys`)."""
        return _named(self.attention_kernel_half_keys, kernel) or self.attention_half_keys

    def wide_heads(self, fmt: str = "") -> tuple[float, float]:
        """(forward, backward) rate of heads wider than 128 over head dim 128's, in FP8 format `fmt` where this
        hardware's file measures it, else at 16 bits."""
        return _named(self.attention_fp8_wide_heads, fmt) or self.attention_wide_heads

    def attention_fp8_plateau(self, fmt: str) -> tuple[float, float]:
        """(forward, backward) fraction of the fp8 peak of the flash kernel run in FP8 format `fmt` ("fp8" or
        "mxfp8"), as this hardware's file measures it."""
        if (pair := _named(self.attention_fp8_plateaus, fmt)) is not None:
            return pair
        raise SpecError(f"{self.name} lists no {fmt} attention efficiency ([efficiency] attention_fp8); add one "
                        "measured on this hardware, or run attention in 16 bits (fp8_attention = false)")

    def __post_init__(self) -> None:
        check_device_count(self.name, self.levels, self.n_devices)

    def group_size(self, level_index: int) -> int:
        """Devices in one group of level `level_index` in this cluster (clipped to its size; on a level that
        allows partial groups, the equal share of each group the cluster's devices fill)."""
        return used_group_size(self.levels, level_index, self.n_devices)

    def groups(self, level_index: int) -> int:
        """How many groups of that level the cluster holds."""
        return self.n_devices // self.group_size(level_index)

    def level(self, name: str) -> Level:
        """The level called `name`; SpecError listing the names if absent."""
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        raise SpecError(f"{self.name} has no level {name!r}; levels are: {', '.join(l.name for l in self.levels)}.")

    def tier(self, name: str) -> MemoryTier:
        """The memory tier called `name`; SpecError listing the names if absent."""
        for t in self.memory_tiers:
            if t.name == name:
                return t
        names = ", ".join(t.name for t in self.memory_tiers) or "none"
        raise SpecError(f"{self.name} has no memory tier {name!r}; tiers are: {names}.")

    def scaled(self, n_devices: int) -> Cluster:
        """The same hardware with `n_devices` devices: part of one node, whole nodes, or whole supernodes."""
        return dataclasses.replace(self, n_devices=n_devices)


def valid_counts_hint(levels: tuple[Level, ...]) -> str:
    """Say which device counts fit the hierarchy, e.g. 'at most 8, a multiple of 8 up to 384, or a multiple of 384'."""
    fixed = [lvl.group_size for lvl in levels if lvl.group_size is not None]
    if not fixed:
        return "any positive number"
    parts = [f"at most {fixed[0]} (part of one {levels[0].name} group)"]
    for inner, outer in zip(fixed, fixed[1:]):
        parts.append(f"a multiple of {inner} up to {outer}")
    if levels[-1].group_size is None:
        parts.append(f"a multiple of {fixed[-1]}")
    partial = [lvl for lvl in levels if lvl.partial and lvl.group_size]
    if partial:
        lvl = partial[-1]
        parts.append(f"the same multiple of {lvl.partial} from each of several {lvl.name} groups of {lvl.group_size}")
    return ", ".join(parts[:-1]) + (" or " if len(parts) > 1 else "") + parts[-1]


#: A three-tier fat tree of 128-port switches, the largest scale-out network in service, joins 128**3 / 4
#: = 524,288 endpoints (Al-Fares et al. 2008: k**3 / 4 hosts for k-port switches); no preset scales beyond it.
MAX_DEVICES = 128**3 // 4


def check_device_count(name: str, levels: tuple[Level, ...], n_devices: int) -> None:
    """SpecError unless `n_devices` is part of one innermost group, or whole groups of the largest level it fills."""
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise SpecError(f"{name}: the device count must be a positive integer, got {n_devices!r}.")
    if n_devices > MAX_DEVICES:
        raise SpecError(f"{name}: {n_devices:,} devices is more than any network joins ({MAX_DEVICES:,}: a three-tier "
                        "fat tree of 128-port switches); give fewer.")
    if fits_hierarchy(levels, n_devices):
        return
    below, above = nearest_valid_counts(levels, n_devices)
    nearest = " or ".join(str(n) for n in (below, above) if n is not None)
    raise SpecError(
        f"{name}: {n_devices} devices do not fit its hierarchy; use {valid_counts_hint(levels)} "
        f"(nearest: {nearest})."
    )


def used_group_size(levels: tuple[Level, ...], level_index: int, n_devices: int) -> int:
    """Devices of an `n_devices` cluster in one group of level `level_index`: the level's group size (at most
    the cluster); on a `partial` level that the cluster does not fill in whole groups, the equal share of each
    of the fewest groups that hold it (256 GPUs on NVL72 racks: 64 in each of 4 racks)."""
    lvl = levels[level_index]
    if lvl.group_size is None or lvl.group_size >= n_devices:
        return n_devices
    if lvl.partial and n_devices % lvl.group_size:
        groups = -(-n_devices // lvl.group_size)
        if n_devices % groups == 0 and (n_devices // groups) % lvl.partial == 0:
            return n_devices // groups
    return lvl.group_size


def fits_hierarchy(levels: tuple[Level, ...], n_devices: int) -> bool:
    """True if `n_devices` (>= 1) is part of one innermost group or whole groups of the largest level it fills
    (equal shares of groups on a `partial` level, each share whole groups of the level below).

    Why: a collective's cost depends on how a group splits over the levels, so a
    cluster must be made of whole nodes (whole supernodes past one supernode);
    a partial node is allowed only as the whole cluster (a single-node run).
    """
    top = levels[-1].group_size
    if top is not None and n_devices > top and not (levels[-1].partial and fits_partial(levels, n_devices)):
        return False
    sizes = [used_group_size(levels, k, n_devices) for k, lvl in enumerate(levels)
             if lvl.group_size is not None and lvl.group_size <= n_devices]
    if not sizes:
        return True
    inner = [lvl.group_size for lvl in levels if lvl.group_size is not None and lvl.group_size < sizes[-1]]
    return n_devices % sizes[-1] == 0 and all(sizes[-1] % g == 0 for g in inner)


def fits_partial(levels: tuple[Level, ...], n_devices: int) -> bool:
    k = used_group_size(levels, len(levels) - 1, n_devices)
    return n_devices % k == 0


def nearest_valid_counts(levels: tuple[Level, ...], n_devices: int) -> tuple[int | None, int | None]:
    """The largest valid count <= n_devices and the smallest >= it (None where there is none).

    Valid counts are at most one largest fixed group apart (whole groups of it always are valid), so each is
    found within that distance.
    """
    top = levels[-1].group_size
    if top is not None and n_devices >= top:
        return top, (top if n_devices == top else None)
    step = max([lvl.group_size for lvl in levels if lvl.group_size is not None], default=1)
    below = next((n for n in range(n_devices, max(0, n_devices - step) - 1, -1) if n >= 1
                  and fits_hierarchy(levels, n)), None)
    above = next((n for n in range(n_devices, n_devices + step + 1) if fits_hierarchy(levels, n)), None)
    return below, above


def cluster_as_dict(cluster: Cluster) -> dict:
    """The cluster in SI units with unit-suffixed keys, for `--json` output; key order is fixed."""
    dev = cluster.device
    return {
        "name": cluster.name,
        "description": cluster.description,
        "n_devices": cluster.n_devices,
        "device": {
            "name": dev.name,
            "peak_flops_per_s": dict(dev.peak_flops_per_s),
            "vector_flops_per_s": dev.vector_flops_per_s,
            "hbm_bytes": dev.hbm_bytes,
            "hbm_bytes_per_s": dev.hbm_bytes_per_s,
            "fp8_any_layout": dev.fp8_any_layout,
        },
        "levels": [
            {
                "name": lvl.name,
                "link": lvl.link,
                "group_size": cluster.group_size(i),
                "groups": cluster.groups(i),
                "bandwidth_bytes_per_s": lvl.bandwidth_bytes_per_s,
                "latency_s": lvl.latency_s,
                "algorithm": lvl.algorithm,
                "topology": lvl.topology,
                "bus_efficiency": lvl.bus_efficiency.to_list(),
            }
            for i, lvl in enumerate(cluster.levels)
        ],
        "memory_tiers": [
            {
                "name": t.name,
                "link": t.link,
                "capacity_bytes": t.capacity_bytes,
                "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s,
                "latency_s": t.latency_s,
                "pooled": t.pooled,
                "efficiency": t.efficiency.to_list(),
            }
            for t in cluster.memory_tiers
        ],
        "efficiency": {
            "matmul_by_flops": cluster.matmul_efficiency.to_list(),
            "fp8_matmul_by_flops": cluster.fp8_matmul_efficiency.to_list() if cluster.fp8_matmul_efficiency else None,
            "memory_by_bytes": cluster.memory_efficiency.to_list(),
            "attention": {k: {"forward": f, "backward": b} for k, f, b in cluster.attention_plateaus},
            "attention_fp8": {k: {"forward": f, "backward": b} for k, f, b in cluster.attention_fp8_plateaus},
            "attention_fp8_wide_heads": {k: {"forward": f, "backward": b}
                                         for k, f, b in cluster.attention_fp8_wide_heads},
            "attention_basis": cluster.attention_basis,
            "attention_half_keys": dict(zip(("forward", "backward"), cluster.attention_half_keys)),
            "attention_kernel_half_keys": {k: {"forward": f, "backward": b}
                                           for k, f, b in cluster.attention_kernel_half_keys},
            "attention_half_dims": dict(zip(("forward", "backward"), cluster.attention_half_dims)),
            "attention_wide_heads": dict(zip(("forward", "backward"), cluster.attention_wide_heads)),
            "kernel_overhead_s": cluster.kernel_overhead_s,
            "host_overhead_s": cluster.host_overhead_s,
            "overlap": cluster.dp_overlap_efficiency,
            "fitted_on": list(cluster.fitted_on),
            "not_fitted": list(cluster.not_fitted),
            "calibration": cluster.calibration,
            "held_out": held_out_dicts(cluster.held_out),
            "transferred_from": cluster.transferred_from,
        },
        "sources": list(cluster.sources),
    }
