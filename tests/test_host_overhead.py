"""The host's per-op overhead of an eager training step: read from a hardware file, charged to every kernel a
training step issues (two for a backward), never to serving, and fitted where a hardware has enough runs."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import SpecError, load_cluster, load_file
from cost_models.loader import PRESET_DIR
from planner.api import _graph_for_costing, make_workload
from planner.calibration import read_runs
from planner.calibration.fit import FEW_RUNS, fitted_names, law_values
from planner.costing.execution import load_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

US = 1e-6


def _file(tmp_path, value: str):
    text = (PRESET_DIR / "dgx-h100.toml").read_text(encoding="utf-8")
    lines = [l for l in text.splitlines() if not l.startswith("host_overhead_us")]
    at = lines.index("[efficiency]") + 1
    path = tmp_path / "hw.toml"
    path.write_text("\n".join(lines[:at] + [f"host_overhead_us = {value}"] + lines[at:]) + "\n", encoding="utf-8")
    return path


def test_a_hardware_file_gives_it_in_microseconds_and_refuses_a_negative_one(tmp_path):
    assert load_file(_file(tmp_path, "7.5")).host_overhead_s == pytest.approx(7.5 * US)
    with pytest.raises(SpecError, match="host_overhead_us"):
        load_file(_file(tmp_path, "-1"))


@pytest.fixture(scope="module")
def small():
    graph = _graph_for_costing("llama3-8b", 256, None, dict(layers=2, hidden=256, heads=4, kv_heads=2, vocab=1000))
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, host_us: float, mode: str, fused_launches: bool = True):
    cluster = dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=host_us * US)
    execution = dataclasses.replace(load_execution("megatron-core"), fused_launches=fused_launches)
    work = make_workload(mode, 8, 256, "bf16", None)
    return NodeTimes(facts, cluster, work, Strategy(dp=8, micro_batch=1), execution)


def _issued(facts, fused_launches: bool, part: str) -> list[str]:
    """The ops of layer 0's `part` (a module path) that issue a kernel of their own in training."""
    bare, loaded = _times(facts, 0.0, "train", fused_launches), _times(facts, 10.0, "train", fused_launches)
    return [n.op_type for i, n in enumerate(facts.graph.nodes) if f"layers.0/{part}/" in n.name
            and loaded.forward(i, 1) > bare.forward(i, 1)]


def test_every_kernel_of_a_training_step_pays_it_once_forward_and_twice_backward(small):
    """Every timed op issues its kernel, except a sibling GEMM after its group's first (Megatron-Core runs the
    query, key and value projections, and the gate and up halves, as one GEMM) and an op inside its readers'
    fused kernel."""
    bare, loaded = _times(small, 0.0, "train"), _times(small, 10.0, "train")
    timed = [i for i in range(len(small.graph.nodes)) if bare.forward(i, 1) > 0]
    riders = {i for i, group in small.siblings.items() if group[0] != i}
    inside = {i for i in timed if small.absorbed()[i]}
    assert len(timed) > 20 and len(riders) == 2 * 3 and len(inside) > 10  # per layer: key and value, up
    for i in range(len(small.graph.nodes)):
        paid = 1 if i in timed and i not in riders and i not in inside else 0
        assert loaded.forward(i, 1) == pytest.approx(bare.forward(i, 1) + paid * 10 * US, rel=1e-12, abs=1e-15)
        if bare.backward(i, 1) > 0:
            assert loaded.backward(i, 1) == pytest.approx(bare.backward(i, 1) + 2 * paid * 10 * US, rel=1e-12)


def test_a_stack_of_fused_kernels_issues_one_per_chain(small):
    """Transformer Engine's RMSNorm is one kernel for the norm's seven ONNX ops, Megatron's bias-SwiGLU one for
    sigmoid, product and gate; without `fused_launches` (Inductor's kernels, whose count the rule does not
    predict) each op keeps its own."""
    assert _issued(small, True, "input_layernorm") == ["Mul"]
    assert sorted(_issued(small, False, "input_layernorm")) == ["Add", "Mul", "Mul", "Mul", "Reciprocal",
                                                                 "ReduceMean", "Sqrt"]
    assert [op for op in _issued(small, True, "mlp") if op != "MatMul"] == ["Mul"]
    assert [op for op in _issued(small, False, "mlp") if op != "MatMul"] == ["Sigmoid", "Mul", "Mul"]


def test_serving_replays_its_kernels_without_the_host(small):
    bare, loaded = _times(small, 0.0, "infer"), _times(small, 10.0, "infer")
    assert all(loaded.forward(i, 1) == bare.forward(i, 1) for i in range(len(small.graph.nodes)))


def test_it_is_fitted_with_enough_runs_and_carried_in_seconds():
    runs = [r for r in read_runs() if r.hardware == "dgx-h100"]
    assert "host_overhead_us" in fitted_names(runs[:FEW_RUNS])
    assert "host_overhead_us" not in fitted_names(runs[:FEW_RUNS - 1])
    values = law_values(load_cluster("dgx-h100"), {"host_overhead_us": 8.0, "kernel_overhead_us": 5.0})
    assert values["host_overhead_s"] == pytest.approx(8 * US) and values["overhead_s"] == pytest.approx(5 * US)
