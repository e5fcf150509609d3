"""The training loss costed as the stack runs it: a memory-bound pass over this rank's share of the logits,
charged to the op that computes them, at the bytes per logit element of the stack's kernel, never in serving.

Hand physics on a small Llama: vocabulary 32,000, 256 tokens a sequence, 2 a micro-batch. The kernels' bytes
are counted from their sources (`planner.costing.loss`): Megatron-Core's unfused vocab-parallel cross entropy
moves 38 bytes per element forward and 14 backward, Transformer Engine's fused one 6 and 4, torch's eager
cross entropy on upcast logits 22 and 26 (Automodel's), compiled 4 and 4 (torchtitan's, an assumption).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, make_workload
from planner.costing import loss
from planner.costing.execution import load_execution, with_changes
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.errors import InvalidInput
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

VOCAB, SEQ, MB = 32000, 256, 2


@pytest.fixture(scope="module")
def small():
    graph = _graph_for_costing("llama3-8b", SEQ, None, dict(layers=2, hidden=256, heads=4, kv_heads=2, vocab=VOCAB))
    return GraphFacts(graph, discover_blocks(graph))


def _cluster():
    return dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=0.0)


def _times(facts, execution, mode, k, monkeypatch, bytes_=None):
    """(forward, backward) seconds of every node on a 1/k shard, with the stack's loss kernel moving `bytes_`."""
    if bytes_ is not None:
        monkeypatch.setitem(loss.LOSS_BYTES, execution.loss_kernel, bytes_)
    work = make_workload(mode, 16, SEQ, "bf16", None)
    t = NodeTimes(facts, _cluster(), work, Strategy(dp=8, micro_batch=MB), execution)
    out = [(t.forward(i, k), t.backward(i, k)) for i in range(len(facts.graph.nodes))]
    monkeypatch.undo()
    return out


def _memory_s(nbytes: float) -> float:
    cluster = _cluster()
    return nbytes / (cluster.device.hbm_bytes_per_s * cluster.memory_efficiency(nbytes))


def test_the_loss_reads_the_logits_where_the_output_head_computes_them(small):
    (producer,) = np.flatnonzero(small.loss_numel)
    assert small.graph.nodes[producer].op_type in ("MatMul", "Gemm")  # not the Identity that names the output
    assert small.loss_numel[producer] == SEQ * VOCAB  # one sequence of the imported batch


@pytest.mark.parametrize("name, kernel, k", [
    ("megatron-core-2024", "megatron", 1), ("megatron-core-2024", "megatron", 2),
    ("megatron-core", "te", 1), ("automodel", "torch", 1), ("torchtitan", "torch_compiled", 1)])
def test_each_stack_pays_its_kernels_bytes_over_its_share_of_the_logits(small, monkeypatch, name, kernel, k):
    stack = load_execution(name)
    assert stack.loss_kernel == kernel
    forward, backward = {"megatron": (38, 14), "te": (6, 4), "torch": (22, 26), "torch_compiled": (4, 4)}[kernel]
    loaded = _times(small, stack, "train", k, monkeypatch)
    bare = _times(small, stack, "train", k, monkeypatch, (0.0, 0.0))
    (i,) = np.flatnonzero(small.loss_numel)
    elements = MB * SEQ * VOCAB / k  # the vocabulary split over k tensor-parallel ranks
    assert loaded[i][0] - bare[i][0] == pytest.approx(_memory_s(forward * elements), rel=1e-9)
    assert loaded[i][1] - bare[i][1] == pytest.approx(_memory_s(backward * elements), rel=1e-9)
    assert all(loaded[j] == bare[j] for j in range(len(loaded)) if j != i)


def test_serving_has_no_loss(small, monkeypatch):
    stack = load_execution("megatron-core-2024")
    assert _times(small, stack, "infer", 1, monkeypatch) == _times(small, stack, "infer", 1, monkeypatch, (0.0, 0.0))


def test_a_stack_names_a_known_kernel():
    assert with_changes(load_execution("megatron-core"), {"loss_kernel": "torch_16bit"}, "t").loss_kernel == "torch_16bit"
    with pytest.raises(InvalidInput, match="loss_kernel"):
        with_changes(load_execution("megatron-core"), {"loss_kernel": "liger"}, "test")


@pytest.mark.parametrize("kernel, peak", [("megatron", 6.0), ("te", 2.0), ("torch", 12.0), ("torch_16bit", 6.0)])
def test_what_the_loss_holds_at_its_peak_is_its_kernels(small, kernel, peak):
    from planner.costing.recompute import kept_tensors

    (i,) = np.flatnonzero(small.loss_numel)
    blk = small.structure.block_of_node(i)
    stack = with_changes(load_execution("megatron-core"), {"loss_kernel": kernel}, "t")
    entries = [sv for sv in kept_tensors(small, blk, "none", stack, 2.0) if sv.tensor.endswith(loss.LOSS_SUFFIX)]
    assert [sv.nbytes for sv in entries] == [peak * SEQ * VOCAB]  # the imported batch: one sequence


def test_a_stage_holds_one_micro_batchs_loss_however_many_it_keeps(tmp_path):
    """Interleaved, the last rank keeps several micro-batches' activations, but runs one loss at a time: between
    two kernels the stage's activations differ by their peaks' difference over one micro-batch's logits."""
    from planner.api import estimate_model

    acts = {}
    for kernel in ("te", "torch"):
        path = tmp_path / f"{kernel}.toml"
        path.write_text(f'[stack]\nbase = "megatron-core"\n[kernels]\nloss_kernel = "{kernel}"\n', encoding="utf-8")
        r = estimate_model("llama3-8b", cluster="dgx-h100", devices=8, global_batch=32, seq_len=SEQ, pp=2, vpp=2,
                           tp=2, sp=True, dp=2, micro_batch=MB, stack=str(path),
                           overrides=dict(layers=4, hidden=256, heads=4, kv_heads=2, vocab=VOCAB))
        acts[kernel] = [s["memory_gib"]["activations"] * 2**30 for s in r["stages"]]
    logits = MB * SEQ * VOCAB / 2  # one micro-batch's, the vocabulary split over the two tensor ranks
    assert acts["torch"][0] == pytest.approx(acts["te"][0])
    assert acts["torch"][1] - acts["te"][1] == pytest.approx((12.0 - 2.0) * logits, rel=1e-6)


def test_the_fitting_bound_holds_the_loss_once_as_the_stage_does():
    """The search's memory floor per stage (`planner.search.fitting.stage_floors`, exact at TP1 without selective
    recompute) keeps the loss's tensors once, as the stage's own costing does: interleaved, the last rank holds
    several micro-batches, and a floor multiplying the loss by them would be above the stage it bounds."""
    from planner.costing.stage_costs import stage_costs
    from planner.costing.stage_memory import held_activations
    from planner.search.fitting import stage_floors

    graph = _graph_for_costing("llama3-8b", SEQ, None, dict(layers=4, hidden=256, heads=4, kv_heads=2, vocab=VOCAB))
    structure = discover_blocks(graph)
    facts = GraphFacts(graph, structure)
    strategy = Strategy(pp=2, vpp=2, dp=4, micro_batch=MB, recompute="full")
    costs = stage_costs(graph, structure, _cluster(), make_workload("train", 32, SEQ, "bf16", None), strategy,
                        facts=facts)
    floors = stage_floors(graph, structure, facts, costs, strategy, exact=True)
    last = costs.stages[-1]
    assert last.held > 1 and floors[-1][3] > 0  # the case: several micro-batches, and a loss on this stage
    assert held_activations(floors[-1][2], floors[-1][3], last.held) == pytest.approx(last.activation_bytes, rel=1e-9)
