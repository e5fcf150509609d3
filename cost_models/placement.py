"""Where a device group sits on the hierarchy: which levels it spans and with how many participants.

A mesh axis of size g over devices numbered 0..N-1 with stride s is the group
{o, o+s, ..., o+(g-1)s}. A collective over it runs level by level (see
`collectives`): at level k it involves the distinct level-(k-1) groups that
hold members inside one level-k group. That count is the ring size at
level k; levels where it is 1 are not crossed and cost nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cost_models.errors import SpecError
from cost_models.spec import Cluster, Level


@dataclass(frozen=True, slots=True)
class LevelSpan:
    """One level a group crosses: `participants` peers there, each a group of the level below."""

    level: Level
    level_index: int
    participants: int  # ring size at this level (the largest over the level's groups)
    fanout: int  # level-(k-1) groups inside one level-k group of the cluster

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Per-device bandwidth usable by this group at this level (before bus efficiency).

        On a full mesh each device splits its bandwidth over fanout-1 dedicated
        links, one per peer, so a group using p-1 of them gets (p-1)/(fanout-1).
        """
        bw = self.level.bandwidth_bytes_per_s
        if self.level.topology == "full_mesh" and self.fanout > 1:
            return bw * (self.participants - 1) / (self.fanout - 1)
        return bw

    def effective_bandwidth(self, message_bytes: float) -> float:
        """Bandwidth after the level's bus efficiency at this message size."""
        return self.bandwidth_bytes_per_s * self.level.bus_efficiency(message_bytes)


def place_group(cluster: Cluster, size: int, stride: int = 1, offset: int = 0) -> tuple[LevelSpan, ...]:
    """Levels (innermost first) crossed by the group {offset + j*stride : j < size}, with their participants."""
    if size < 1 or stride < 1 or offset < 0:
        raise SpecError(f"a device group needs size >= 1, stride >= 1, offset >= 0; got {size}, {stride}, {offset}.")
    last = offset + (size - 1) * stride
    if last >= cluster.n_devices:
        raise SpecError(
            f"a group of {size} devices with stride {stride} from device {offset} reaches device {last}, "
            f"but {cluster.name} has {cluster.n_devices}; use a smaller group or more devices."
        )
    return _place(cluster, size, stride, offset)


@functools.lru_cache(maxsize=4096)
def _place(cluster: Cluster, size: int, stride: int, offset: int) -> tuple[LevelSpan, ...]:
    members = offset + stride * np.arange(size, dtype=np.int64)
    spans: list[LevelSpan] = []
    inner_size = 1
    for k in range(len(cluster.levels)):
        outer_size = cluster.group_size(k)
        if outer_size == inner_size:
            continue  # a clipped level that adds nothing in this cluster
        participants = _max_children(members // outer_size, members // inner_size)
        if participants > 1:
            spans.append(LevelSpan(level=cluster.levels[k], level_index=k, participants=participants,
                                   fanout=outer_size // inner_size))
        inner_size = outer_size
    return tuple(spans)


def _max_children(parent: np.ndarray, child: np.ndarray) -> int:
    """Largest number of distinct `child` ids under one `parent` id (both non-decreasing)."""
    new = np.ones(len(child), dtype=bool)
    new[1:] = (child[1:] != child[:-1]) | (parent[1:] != parent[:-1])
    _, counts = np.unique(parent[new], return_counts=True)
    return int(counts.max())


def common_level(cluster: Cluster, device_a: int, device_b: int) -> int | None:
    """Index of the innermost level whose group holds both devices (None if they are the same device)."""
    if device_a == device_b:
        return None
    for k in range(len(cluster.levels)):
        size = cluster.group_size(k)
        if device_a // size == device_b // size:
            return k
    raise SpecError(f"devices {device_a} and {device_b} are not both in {cluster.name} ({cluster.n_devices} devices).")
