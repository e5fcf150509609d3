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
DTYPES: tuple[str, ...] = ("fp4", "fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64")


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator as the framework sees it (one rank): dense peaks and its HBM."""

    name: str
    peak_flops_per_s: tuple[tuple[str, float], ...]  # (dtype, dense matrix-unit peak), sorted by dtype
    vector_flops_per_s: float | None  # non-matrix throughput for elementwise ops; None = unknown
    hbm_bytes: float
    hbm_bytes_per_s: float

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
    dp_overlap_efficiency: float  # fraction of the backward pass that can hide the DP gradient reduction
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_device_count(self.name, self.levels, self.n_devices)

    def group_size(self, level_index: int) -> int:
        """Devices in one group of level `level_index` in this cluster (clipped to its size)."""
        size = self.levels[level_index].group_size
        return self.n_devices if size is None else min(size, self.n_devices)

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
    return ", ".join(parts[:-1]) + (" or " if len(parts) > 1 else "") + parts[-1]


def check_device_count(name: str, levels: tuple[Level, ...], n_devices: int) -> None:
    """SpecError unless `n_devices` is part of one innermost group, or whole groups of the largest level it fills."""
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise SpecError(f"{name}: the device count must be a positive integer, got {n_devices!r}.")
    if fits_hierarchy(levels, n_devices):
        return
    below, above = nearest_valid_counts(levels, n_devices)
    nearest = " or ".join(str(n) for n in (below, above) if n is not None)
    raise SpecError(
        f"{name}: {n_devices} devices do not fit its hierarchy; use {valid_counts_hint(levels)} "
        f"(nearest: {nearest})."
    )


def fits_hierarchy(levels: tuple[Level, ...], n_devices: int) -> bool:
    """True if `n_devices` (>= 1) is part of one innermost group or whole groups of the largest level it fills.

    Why: a collective's cost depends on how a group splits over the levels, so a
    cluster must be made of whole nodes (whole supernodes past one supernode);
    a partial node is allowed only as the whole cluster (a single-node run).
    """
    top = levels[-1].group_size
    if top is not None and n_devices > top:
        return False
    filled = [lvl.group_size for lvl in levels if lvl.group_size is not None and lvl.group_size <= n_devices]
    return not filled or n_devices % filled[-1] == 0


def nearest_valid_counts(levels: tuple[Level, ...], n_devices: int) -> tuple[int | None, int | None]:
    """The largest valid count <= n_devices and the smallest >= it (None where there is none).

    Below: round down to the largest fixed group that n fills (always valid,
    since rounding down keeps that group filled). Above: round up to the same
    group; that never passes the next level's size, which is a multiple of it.
    """
    top = levels[-1].group_size
    if top is not None and n_devices >= top:
        return top, (top if n_devices == top else None)
    filled = [lvl.group_size for lvl in levels if lvl.group_size is not None and lvl.group_size <= n_devices]
    if not filled:
        return n_devices, n_devices
    step = filled[-1]
    return n_devices - n_devices % step, -(-n_devices // step) * step


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
            "memory_by_bytes": cluster.memory_efficiency.to_list(),
            "dp_overlap": cluster.dp_overlap_efficiency,
        },
        "sources": list(cluster.sources),
    }
