"""User hardware files: every malformed field is a one-sentence SpecError naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_models import SpecError, load_cluster
from cost_models.loader import PRESET_DIR

_EFFICIENCY = """[efficiency]
matmul_plateau = 0.75
memory_plateau = 0.74
kernel_overhead_us = 9.8
attention = { flash2 = [0.70, 0.60] }
overlap = 0.8
"""
_PRESET = (PRESET_DIR / "dgx-a100.toml").read_text(encoding="utf-8")
BASE = _PRESET[:_PRESET.index("\n[efficiency]") + 1] + _EFFICIENCY  # a fixed efficiency table: fits change presets
_LAW = "matmul_plateau = 0.75\nmemory_plateau = 0.74\nkernel_overhead_us = 9.8\n"


def _write(tmp_path: Path, text: str, name: str = "my.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _mutate(old: str, new: str, count: int = 1) -> str:
    assert BASE.count(old) >= count, old
    return BASE.replace(old, new, count)


def test_a_user_file_loads_and_is_named_after_its_cluster_table(tmp_path):
    text = _mutate('name = "dgx-a100"\n', "")
    c = load_cluster(_write(tmp_path, text, "lab.toml"), devices=16)
    assert c.name == "lab" and c.n_devices == 16
    assert c.device == load_cluster("dgx-a100").device


MALFORMED = [
    ("bandwidth_gbit_s = 200", 'bandwidth_gbit_s = "fast"',
     'my.toml: levels[1].bandwidth_gbit_s: expected a positive number, got "fast".'),
    ("bandwidth_gbit_s = 200", "bandwidth_gbit_s = 200\nbandwidth_gb_s = 25",
     "levels[1]: give exactly one of bandwidth_gb_s or bandwidth_gbit_s"),
    ("bandwidth_gb_s = 300\n", "", "levels[0]: give exactly one of bandwidth_gb_s or bandwidth_gbit_s"),
    ("latency_us = 5.0", "latency_us = -1", "levels[1].latency_us: expected a non-negative number, got -1"),
    ('algorithm = "ring"', 'algorithm = "butterfly"',
     'levels[0].algorithm: expected one of ring, tree, direct, in_network, got "butterfly"'),
    ('bus_efficiency = [[1e5, 0.40], [1e6, 0.60]', 'topology = "torus"\nbus_efficiency = [[1e5, 0.40], [1e6, 0.60]',
     'levels[0].topology: expected one of switched, full_mesh, got "torus"'),
    ("group_size = 8", "group_size = 1", "levels[0].group_size: expected an integer of at least 2, got 1"),
    ("group_size = 8", "group_size = 8.5", "levels[0].group_size: expected an integer of at least 2, got 8.5"),
    ("group_size = 8\n", "", "levels[0].group_size: missing; only the outermost level may leave it open"),
    ('name = "infiniband"', 'name = "infiniband"\ngroup_size = 12',
     "levels[1].group_size: 12 is not a larger multiple of levels[0].group_size 8"),
    ('name = "infiniband"', 'name = "nvlink"', "levels[1].name: 'nvlink' is used twice"),
    ('name = "A100-SXM4-80GB"\n', "", "device.name: missing; expected a string"),
    ("hbm_bandwidth_gb_s", "hbm_bandwith_gb_s", "device.hbm_bandwith_gb_s: unknown field"),
    ("hbm_gib = 80", "hbm_gib = 80\nhbm_gb = 80", "device: give exactly one of hbm_gib or hbm_gb"),
    ("bf16 = 312", "bf17 = 312", "device.peak_tflops.bf17: unknown field"),
    ("bf16 = 312", "bf16 = 0", "device.peak_tflops.bf16: expected a positive number, got 0"),
    ("devices = 160", "devices = 12", "cluster.devices: 12 devices do not fit its hierarchy; use at most 8"),
    ("devices = 160", 'devices = "many"', 'cluster.devices: expected an integer of at least 1, got "many"'),
    ("sources = [", "sources = [3, ", "cluster.sources: expected a list of strings"),
    ("[efficiency]", "[efficiencies]", "efficiencies: unknown field"),
    (_LAW, "matmul = [[3.16e7, 0.010], [1e7, 0.003]]\nmemory = 0.8\n",
     "efficiency.matmul[1]: sizes must increase, got 1e+07 after 3.16e+07"),
    (_LAW, "matmul = [[1e7, 1.05]]\nmemory = 0.8\n",
     "efficiency.matmul[0]: expected [size, efficiency] with size > 0 and efficiency in (0, 1], "
     "got [10000000.0, 1.05]"),
    (_LAW, "matmul = 0.8\nmemory = [[1e5], [3.16e5, 0.1]]\n", "efficiency.memory[0]: expected [size, efficiency]"),
    (_LAW, "memory = 0.8\n", "efficiency.matmul: missing; give the overhead law's matmul_plateau"),
    (_EFFICIENCY, "", "efficiency: missing: without it every kernel would be costed at the device's peak"),
    ("matmul_plateau = 0.75", "matmul_plateau = 1.2", "efficiency.matmul_plateau: expected a number in (0, 1], got 1.2"),
    ("kernel_overhead_us = 9.8", "kernel_overhead_us = -1",
     "efficiency.kernel_overhead_us: expected a positive number, got -1"),
    ("memory_plateau = 0.74\n", "", "efficiency.memory_plateau: missing; the overhead law needs"),
    ("overlap = 0.8", "overlap = 0.8\nmatmul = [[1e7, 0.1]]",
     "efficiency.matmul: give either the law's parameters or [size, efficiency] tables, not both"),
    ("[0.70, 0.60]", "[0.70]", "efficiency.attention.flash2: expected [forward, backward] fractions"),
    ("overlap = 0.8", "overlap = 0.8\nattention_half_dims = [64]",
     "efficiency.attention_half_dims: expected [forward, backward] head dims >= 0, got [64]"),
    ("overlap = 0.8", "overlap = 0.8\nattention_half_keys = [-1, 2]",
     "efficiency.attention_half_keys: expected [forward, backward] key counts >= 0, got [-1, 2]"),
    ("overlap = 0.8", "overlap = 0.8\nattention_kernel_half_keys = { flash2 = [0, 274] }",
     "efficiency.attention_kernel_half_keys.flash2: expected flash2 = [forward, backward] key counts in (0, 1e+06], "
     "got flash2 = [0, 274]"),
    ("overlap = 0.8", "overlap = 0.8\nattention_kernel_half_keys = { flash3 = [202, 274] }",  # a kernel it lists
     "efficiency.attention_kernel_half_keys.flash3: expected flash2 = [forward, backward] key counts"),
    ("overlap = 0.8", "overlap = 0.8\nattention_wide_heads = [1.2, 0.9]",
     "efficiency.attention_wide_heads: expected [forward, backward] rates over head dim 128's in (0, 1], "
     "got [1.2, 0.9]"),
    ("overlap = 0.8", "overlap = 1.5", "efficiency.overlap: expected a number in (0, 1], got 1.5"),
    ("overlap = 0.8", 'overlap = 0.8\nheld_out = "good"', "efficiency.held_out: expected a table of category ="),
    ("overlap = 0.8", "overlap = 0.8\nheld_out = { moe_training = [0, 1.0, 2.0] }",
     "efficiency.held_out.moe_training: expected [runs >= 1, mean %, max %] with 0 <= mean <= max"),
    ("overlap = 0.8", "overlap = 0.8\nheld_out = { dense_training = [3, 9.0, 2.0] }",
     "efficiency.held_out.dense_training: expected [runs >= 1, mean %, max %]"),
    ("overlap = 0.8", "fp8_matmul_plateau = 0.7", "efficiency.fp8_matmul_plateau: the device lists no fp8 peak"),
    ("efficiency = 0.8", 'efficiency = "high"', 'memory_tiers[0].efficiency: expected a number in (0, 1] or a list'),
    ("pooled = false", 'pooled = "no"', 'memory_tiers[0].pooled: expected true or false, got "no"'),
    ("capacity_gib = 256", "capacity_gb = -3", "memory_tiers[0].capacity_gb: expected a positive number, got -3"),
    ("[cluster]", "[cluster", "my.toml: not valid TOML"),
    ("[device.peak_tflops]\n", "", "device.bf16: unknown field"),
]


@pytest.mark.parametrize(("old", "new", "message"), MALFORMED, ids=[m[2][:48] for m in MALFORMED])
def test_malformed_fields_are_named(tmp_path, old, new, message):
    with pytest.raises(SpecError) as err:
        load_cluster(_write(tmp_path, _mutate(old, new)))
    text = str(err.value)
    assert message in text
    assert "\n" not in text and text.endswith(".")


def test_a_file_states_how_far_off_its_held_out_runs_came_out(tmp_path):
    text = _mutate("overlap = 0.8", "overlap = 0.8\nheld_out = { moe_training = [3, 6.25, 11.5] }")
    c = load_cluster(_write(tmp_path, text))
    h = c.checked("moe_training")
    assert (h.runs, h.mean, h.max) == (3, 0.0625, 0.115) and c.checked("dense_training") is None
    assert "3 held-out MoE training runs on dgx-a100: mean |error| 6.2 %, max 11.5 %" in h.sentence(c.name)
    # a user's runs that state no category check both kinds of job
    text = _mutate("overlap = 0.8", "overlap = 0.8\nheld_out = { training = [2, 3, 4] }")
    mine = load_cluster(_write(tmp_path, text))
    assert mine.checked("dense_training") == mine.checked("moe_training") is not None
    said = mine.checked("moe_training").sentence("lab")
    assert said == "2 held-out training runs on lab: mean |error| 3.0 %, max 4.0 %"  # no preset: no command to list


def test_a_preset_whose_efficiency_is_another_ones_fit_names_it():
    c = load_cluster("cloudmatrix384")
    assert c.transferred_from == "ascend-910b" and not c.held_out and "ascend-910b" in c.calibration
    assert load_cluster("dgx-h100").transferred_from == ""


def test_a_file_without_levels_or_peaks(tmp_path):
    minimal = """
[cluster]
devices = 4
[device]
name = "x"
hbm_gib = 1
hbm_bandwidth_gb_s = 1
[device.peak_tflops]
bf16 = 1
"""
    with pytest.raises(SpecError, match=r"my.toml: levels: missing; expected one or more \[\[levels\]\] tables"):
        load_cluster(_write(tmp_path, minimal))
    level = '[[levels]]\nname = "l"\nbandwidth_gb_s = 1\nlatency_us = 0\nalgorithm = "ring"\n'
    no_peak = minimal.replace("bf16 = 1", "") + level
    with pytest.raises(SpecError, match=r"device.peak_tflops: list at least one dense peak"):
        load_cluster(_write(tmp_path, no_peak))


def test_a_fixed_outermost_level_caps_the_cluster(tmp_path):
    text = """
[cluster]
devices = 72
[device]
name = "x"
hbm_gib = 1
hbm_bandwidth_gb_s = 1
[device.peak_tflops]
bf16 = 1
[[levels]]
name = "rack"
group_size = 72
bandwidth_gb_s = 900
latency_us = 1
algorithm = "ring"
[efficiency]
matmul = 0.5
memory = 0.5
"""
    path = _write(tmp_path, text)
    assert load_cluster(path).memory_tiers == ()
    with pytest.raises(SpecError, match="144 devices do not fit its hierarchy; use at most 72"):
        load_cluster(path, devices=144)


@pytest.mark.parametrize("arg", ["no-such-preset", "/nonexistent/dir/hw.toml"])
def test_unknown_names_and_missing_files(arg):
    with pytest.raises(SpecError, match="no preset has that name and no file is there; use one of ascend-910b"):
        load_cluster(arg)


def test_a_binary_file_is_refused(tmp_path):
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError, match="bin.toml: not a UTF-8 text file"):
        load_cluster(str(binary))
