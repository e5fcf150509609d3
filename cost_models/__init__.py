"""The cost model: hardware specs as data and the physics of time and memory, in plain SI numbers.

Imports nothing of the project. Modules, one idea each: `spec` (devices,
interconnect levels, memory tiers), `loader` (TOML presets and user files),
`curves` (efficiency by size), `placement` (which levels a device group
crosses), `compute`, `collectives`, `memory`, `schedule`, `offload`, `overlap`,
`streams` (a compute and a communication stream running dependent tasks).
"""

from __future__ import annotations

from cost_models.curves import EfficiencyCurve
from cost_models.errors import SpecError
from cost_models.loader import load_cluster, load_file, preset_names
from cost_models.placement import LevelSpan, common_level, place_group
from cost_models.spec import Cluster, Device, Level, MemoryTier, cluster_as_dict

__all__ = [
    "Cluster",
    "Device",
    "EfficiencyCurve",
    "Level",
    "LevelSpan",
    "MemoryTier",
    "SpecError",
    "cluster_as_dict",
    "common_level",
    "load_cluster",
    "load_file",
    "place_group",
    "preset_names",
]
