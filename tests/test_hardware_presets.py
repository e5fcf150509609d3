"""Presets load, carry their sources, match the published hardware, and scale with --devices."""

from __future__ import annotations

import json

import pytest

from cost_models import SpecError, cluster_as_dict, load_cluster, place_group, preset_names
from cost_models.placement import common_level
from cost_models.spec import fits_hierarchy, nearest_valid_counts

GIB = 2**30


def test_the_presets_are_bundled():
    assert preset_names() == ["ascend-910b", "cloudmatrix384", "cloudmatrix384-die", "dgx-a100", "dgx-b200",
                              "dgx-b300", "dgx-h100", "dgx-h200", "gb200-nvl72", "gb300-nvl72", "h100-grand-teton"]


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
    assert gb.device.peak_flops("bf16") == 2500e12 and gb.device.hbm_bytes == 185 * GIB
    assert gb.tier("grace-lpddr5x").bandwidth_bytes_per_s == 225e9  # C2C 450 GB/s per direction / 2 GPUs
    assert load_cluster("dgx-h100").level("infiniband").bandwidth_bytes_per_s == 50e9  # 400 Gb/s per GPU
    assert load_cluster("ascend-910b").device.hbm_bytes == 64 * GIB  # npu-smi: 65,536 MB


def test_cloudmatrix384_counts_one_device_per_910c_package():
    # arXiv 2506.12708: 384 NPUs of 2 dies, 752 TFLOP/s bf16, 128 GB at 3.2 TB/s, UB 392 GB/s, RoCE 400 Gb/s per NPU.
    cm = load_cluster("cloudmatrix384")
    assert cm.n_devices == 384
    assert cm.device.peak_flops("bf16") == 752e12
    assert (cm.device.hbm_bytes, cm.device.hbm_bytes_per_s) == (128 * GIB, 3.2e12)
    assert [(lvl.name, cm.group_size(i)) for i, lvl in enumerate(cm.levels)] == [
        ("node", 8), ("supernode", 384), ("roce", 384)]
    assert cm.level("node").bandwidth_bytes_per_s == 392e9
    assert cm.level("supernode").bandwidth_bytes_per_s == pytest.approx(392e9, rel=0.03)
    assert cm.level("roce").bandwidth_bytes_per_s == 50e9
    assert cm.tier("pooled-dram").pooled and not load_cluster("dgx-h100").tier("host").pooled
    assert cm.tier("pooled-dram").bandwidth_bytes_per_s == 4 * 160e9 / 8
    with pytest.raises(SpecError, match="lists no fp8 peak"):
        cm.device.peak_flops("fp8")


def test_the_die_preset_is_the_same_supernode_split_in_two():
    pkg, die = load_cluster("cloudmatrix384"), load_cluster("cloudmatrix384-die")
    assert die.n_devices == 2 * pkg.n_devices == 768
    for dtype, flops in pkg.device.peak_flops_per_s:
        assert 2 * die.device.peak_flops(dtype) == flops
    assert 2 * die.device.hbm_bytes == pkg.device.hbm_bytes
    assert 2 * die.device.hbm_bytes_per_s == pkg.device.hbm_bytes_per_s
    for name in ("node", "supernode", "roce"):
        assert 2 * die.level(name).bandwidth_bytes_per_s == pkg.level(name).bandwidth_bytes_per_s
        assert die.group_size(die.levels.index(die.level(name))) == 2 * pkg.group_size(pkg.levels.index(
            pkg.level(name)))
    for field in ("capacity_bytes", "bandwidth_bytes_per_s"):
        assert 2 * getattr(die.tier("pooled-dram"), field) == getattr(pkg.tier("pooled-dram"), field)
    assert die.level("package").group_size == 2


@pytest.mark.parametrize("name", ["cloudmatrix384", "cloudmatrix384-die"])
def test_the_910c_presets_carry_the_910b_fit_and_say_so(name):
    """No CloudMatrix run is fitted: its presets take the fitted Ascend 910B's law (the same die generation
    and CANN stack; benchmarks/fit_presets.py copies it on every fit), not the A100's, and label it."""
    b, c = load_cluster("ascend-910b"), load_cluster(name)
    assert (c.matmul_plateau, c.memory_plateau, c.kernel_overhead_s) == (b.matmul_plateau, b.memory_plateau,
                                                                         b.kernel_overhead_s)
    assert "transferred from the ascend-910b fit" in c.calibration


def test_cloudmatrix384_takes_any_count_up_to_a_node_then_whole_nodes_then_whole_supernodes():
    accepted = []
    for n in range(1, 2 * 384 + 1):
        try:
            load_cluster("cloudmatrix384", devices=n)
            accepted.append(n)
        except SpecError as err:
            assert "use at most 8 (part of one node group), a multiple of 8 up to 384 or a multiple of 384" in str(err)
    assert accepted == list(range(1, 9)) + list(range(16, 385, 8)) + [768]
    for n in (64, 128, 256, 384, 1152, 3840):
        assert load_cluster("cloudmatrix384", devices=n).n_devices == n


@pytest.mark.parametrize(("name", "n"), [("dgx-a100", 1), ("dgx-a100", 4), ("dgx-a100", 8), ("dgx-a100", 1024),
                                         ("cloudmatrix384", 8), ("cloudmatrix384", 400 - 16), ("cloudmatrix384", 1536),
                                         ("cloudmatrix384-die", 2), ("cloudmatrix384-die", 1536),
                                         ("gb200-nvl72", 36), ("gb200-nvl72", 144), ("ascend-910b", 2048)])
def test_scaling_accepts_part_of_a_node_or_whole_groups(name, n):
    c = load_cluster(name, devices=n)
    assert c.n_devices == n
    assert c.group_size(len(c.levels) - 1) == n
    assert c.device == load_cluster(name).device


@pytest.mark.parametrize(("name", "n", "hint"), [
    ("dgx-a100", 12, "use at most 8 (part of one nvlink group) or a multiple of 8 (nearest: 8 or 16)."),
    ("cloudmatrix384", 12, "a multiple of 8 up to 384 or a multiple of 384 (nearest: 8 or 16)."),
    ("cloudmatrix384", 100, "(nearest: 96 or 104)."),
    ("cloudmatrix384", 500, "or a multiple of 384 (nearest: 384 or 768)."),
    ("cloudmatrix384-die", 40, "a multiple of 16 up to 768"),
    ("cloudmatrix384-die", 3, "(nearest: 2 or 4)."),
    ("gb200-nvl72", 100, "the same multiple of 4 from each of several nvlink groups of 72 (nearest: 96 or 104)."),
    ("dgx-h100", 0, "positive integer"),
])
def test_scaling_refuses_counts_that_split_a_group(name, n, hint):
    with pytest.raises(SpecError) as err:
        load_cluster(name, devices=n)
    assert hint in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", preset_names())
def test_the_nearest_counts_named_in_the_error_are_valid_and_nothing_valid_lies_between(name):
    levels = load_cluster(name).levels
    valid = [n for n in range(1, 6001) if fits_hierarchy(levels, n)]  # 3000 + the largest group
    for n in range(1, 3001):
        below, above = nearest_valid_counts(levels, n)
        assert below == max(v for v in valid if v <= n)
        assert above == min(v for v in valid if v >= n)


def test_a_fixed_top_level_has_nothing_above_it():
    levels = load_cluster("gb200-nvl72").levels[:1]  # the NVLink level alone: a single rack, capped at 72
    assert nearest_valid_counts(levels, 100) == (72, None)
    assert nearest_valid_counts(levels, 72) == (72, 72)


def test_a_scaled_cluster_clips_its_levels():
    c = load_cluster("cloudmatrix384", devices=8)
    assert [c.group_size(i) for i in range(3)] == [8, 8, 8]
    assert place_group(c, 8)[-1].level.name == "node"
    back = c.scaled(384)
    assert back == load_cluster("cloudmatrix384")
    d = load_cluster("cloudmatrix384-die", devices=16)
    assert [d.group_size(i) for i in range(4)] == [2, 16, 16, 16]
    assert place_group(d, 16)[-1].level.name == "node"


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
    c = load_cluster("cloudmatrix384", devices=768)
    # members 0, 128, 256, 384, 512: supernode 0 holds three of them (three different nodes), supernode 1 two.
    spans = place_group(c, 5, stride=128)
    assert [(s.level.name, s.participants) for s in spans] == [("supernode", 3), ("roce", 2)]


def test_common_level_of_two_devices():
    c = load_cluster("cloudmatrix384", devices=768)
    assert common_level(c, 0, 1) == 0
    assert common_level(c, 0, 7) == 0
    assert common_level(c, 0, 8) == 1
    assert common_level(c, 0, 383) == 1
    assert common_level(c, 0, 384) == 2
    assert common_level(c, 5, 5) is None


def test_loading_is_deterministic_and_json_is_stable():
    a = json.dumps(cluster_as_dict(load_cluster("cloudmatrix384", devices=1536)))
    load_cluster.__globals__["_load_preset"].cache_clear()
    b = json.dumps(cluster_as_dict(load_cluster("cloudmatrix384", devices=1536)))
    assert a == b
    assert json.loads(a)["levels"][0]["groups"] == 192  # nodes of 8 NPUs
    assert json.loads(a)["levels"][1]["groups"] == 4  # supernodes
