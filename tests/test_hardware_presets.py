"""Presets load, carry their sources, match the published hardware, and scale with --devices."""

from __future__ import annotations

import json

import pytest

from cost_models import SpecError, cluster_as_dict, load_cluster, place_group, preset_names
from cost_models.placement import common_level

GIB = 2**30


def test_the_five_presets_are_bundled():
    assert preset_names() == ["ascend-910b", "cloudmatrix384", "dgx-a100", "dgx-h100", "gb200-nvl72"]


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_with_sources_and_a_valid_hierarchy(name):
    c = load_cluster(name)
    assert c.name == name
    assert c.sources, "a preset must cite where its numbers come from"
    assert c.device.peak_flops("bf16") > 1e14
    sizes = [c.group_size(i) for i in range(len(c.levels))]
    assert sizes == sorted(sizes) and sizes[-1] == c.n_devices
    assert all(b % a == 0 for a, b in zip(sizes, sizes[1:]))
    assert c.levels[-1].group_size is None, "the outermost level spans the cluster so that --devices can grow it"
    assert c.memory_tiers and all(t.capacity_bytes > 0 for t in c.memory_tiers)


def test_dgx_a100_matches_the_calibration_hardware():
    # calibration/published_runs.json "a100-80gb-selene": 312 TFLOP/s bf16, 80 GB HBM2e at about 2.0 TB/s,
    # NVLink 300 GB/s per direction per GPU, 8 per node, HDR 200 Gb/s per GPU (25 GB/s).
    c = load_cluster("dgx-a100")
    assert c.device.peak_flops("bf16") == 312e12
    assert c.device.hbm_bytes == 80 * GIB
    assert c.device.hbm_bytes_per_s == pytest.approx(2.0e12, rel=0.03)
    nvlink, ib = c.levels
    assert (nvlink.group_size, nvlink.bandwidth_bytes_per_s) == (8, 300e9)
    assert ib.bandwidth_bytes_per_s == 25e9


def test_supernode_presets_carry_their_fabric():
    gb = load_cluster("gb200-nvl72")
    assert gb.level("nvlink").bandwidth_bytes_per_s == 900e9 and gb.group_size(0) == 72
    assert gb.level("scale-out").bandwidth_bytes_per_s == 50e9  # 400 Gb/s
    cm = load_cluster("cloudmatrix384")
    assert cm.n_devices == 2 * 384  # one rank per 910C die
    assert 2 * cm.device.peak_flops("bf16") == 752e12
    assert cm.level("supernode").group_size == 768
    assert cm.tier("pooled-dram").pooled and not load_cluster("dgx-h100").tier("host").pooled
    with pytest.raises(SpecError, match="lists no fp8 peak"):
        cm.device.peak_flops("fp8")


@pytest.mark.parametrize(("name", "n"), [("dgx-a100", 1), ("dgx-a100", 4), ("dgx-a100", 8), ("dgx-a100", 1024),
                                         ("cloudmatrix384", 16), ("cloudmatrix384", 400 - 16), ("cloudmatrix384", 1536),
                                         ("gb200-nvl72", 36), ("gb200-nvl72", 144), ("ascend-910b", 2048)])
def test_scaling_accepts_part_of_a_node_or_whole_groups(name, n):
    c = load_cluster(name, devices=n)
    assert c.n_devices == n
    assert c.group_size(len(c.levels) - 1) == n
    assert c.device == load_cluster(name).device


@pytest.mark.parametrize(("name", "n", "hint"), [
    ("dgx-a100", 12, "use at most 8 (part of one nvlink group) or a multiple of 8"),
    ("cloudmatrix384", 40, "a multiple of 16 up to 768"),
    ("cloudmatrix384", 800, "or a multiple of 768"),
    ("gb200-nvl72", 100, "a multiple of 72"),
    ("dgx-h100", 0, "positive integer"),
])
def test_scaling_refuses_counts_that_split_a_group(name, n, hint):
    with pytest.raises(SpecError) as err:
        load_cluster(name, devices=n)
    assert hint in str(err.value) and "\n" not in str(err.value)


def test_a_scaled_cluster_clips_its_levels():
    c = load_cluster("cloudmatrix384", devices=16)
    assert [c.group_size(i) for i in range(4)] == [2, 16, 16, 16]
    assert place_group(c, 16)[-1].level.name == "node"
    back = c.scaled(768)
    assert back == load_cluster("cloudmatrix384")


def test_placement_counts_participants_per_level():
    c = load_cluster("dgx-a100", devices=1024)
    names = lambda spans: [(s.level.name, s.participants) for s in spans]  # noqa: E731
    assert names(place_group(c, 8)) == [("nvlink", 8)]
    assert names(place_group(c, 32, stride=8)) == [("infiniband", 32)]
    assert names(place_group(c, 16, stride=4)) == [("nvlink", 2), ("infiniband", 8)]
    assert names(place_group(c, 1024)) == [("nvlink", 8), ("infiniband", 128)]
    assert place_group(c, 1) == ()
    with pytest.raises(SpecError, match="reaches device 1024"):
        place_group(c, 2, stride=512, offset=512)


def test_placement_of_an_unaligned_group_takes_the_largest_ring():
    c = load_cluster("cloudmatrix384", devices=1536)
    # members 0, 256, 512, 768, 1024: supernode 0 holds three of them (three different nodes), supernode 1 two.
    spans = place_group(c, 5, stride=256)
    assert [(s.level.name, s.participants) for s in spans] == [("supernode", 3), ("roce", 2)]


def test_common_level_of_two_devices():
    c = load_cluster("cloudmatrix384", devices=1536)
    assert common_level(c, 0, 1) == 0
    assert common_level(c, 0, 15) == 1
    assert common_level(c, 0, 767) == 2
    assert common_level(c, 0, 768) == 3
    assert common_level(c, 5, 5) is None


def test_loading_is_deterministic_and_json_is_stable():
    a = json.dumps(cluster_as_dict(load_cluster("cloudmatrix384", devices=1536)))
    load_cluster.__globals__["_load_preset"].cache_clear()
    b = json.dumps(cluster_as_dict(load_cluster("cloudmatrix384", devices=1536)))
    assert a == b
    assert json.loads(a)["levels"][1]["groups"] == 96
