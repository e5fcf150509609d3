"""The training loss costed as the stack runs it: a memory-bound pass over this rank's share of the logits,
charged to the node that produces them, at the stack's bytes per logit element, never in serving.

Hand physics on a small Llama: vocab 32,000, 256 tokens a sequence, 2 a micro-batch. The stack figures are
counted from the kernels each stack runs (their sources are in the stack files): Megatron-Core's unfused
vocab-parallel cross entropy moves 38 bytes per element forward and 14 backward, Transformer Engine's fused one
6 and 4, torch's eager cross entropy on upcast logits 22 and 26.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, make_workload
from planner.costing.execution import load_execution, with_changes
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

VOCAB, SEQ, MB = 32000, 256, 2


@pytest.fixture(scope="module")
def small():
    graph = _graph_for_costing("llama3-8b", SEQ, None, dict(layers=2, hidden=256, heads=4, kv_heads=2, vocab=VOCAB))
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, execution, mode="train"):
    cluster = dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=0.0)
    work = make_workload(mode, 16, SEQ, "bf16", None)
    return cluster, NodeTimes(facts, cluster, work, Strategy(dp=8, micro_batch=MB), execution)


def _memory_s(cluster, nbytes: float) -> float:
    return nbytes / (cluster.device.hbm_bytes_per_s * cluster.memory_efficiency(nbytes))


def test_only_the_logits_are_read_by_the_loss(small):
    (producer,) = np.flatnonzero(small.loss_numel)
    node = small.graph.nodes[producer]
    assert node.op_type in ("MatMul", "Gemm") and small.loss_numel[producer] == SEQ * VOCAB  # one sequence


@pytest.mark.parametrize("k", [1, 2])
def test_megatrons_unfused_cross_entropy_over_a_shard_of_the_logits(small, k):
    stack = load_execution("megatron-core-2024")
    assert (stack.loss_forward_bytes, stack.loss_backward_bytes) == (38.0, 14.0)
    cluster, loaded = _times(small, stack)
    _, bare = _times(small, with_changes(stack, {"loss_forward_bytes": 0.0, "loss_backward_bytes": 0.0}, "test"))
    (i,) = np.flatnonzero(small.loss_numel)
    elements = MB * SEQ * VOCAB / k  # the vocabulary split over k tensor-parallel ranks
    assert loaded.forward(i, k) - bare.forward(i, k) == pytest.approx(_memory_s(cluster, 38 * elements), rel=1e-9)
    assert loaded.backward(i, k) - bare.backward(i, k) == pytest.approx(_memory_s(cluster, 14 * elements), rel=1e-9)
    others = [j for j in range(len(small.graph.nodes)) if j != i]
    assert all(loaded.forward(j, k) == bare.forward(j, k) and loaded.backward(j, k) == bare.backward(j, k)
               for j in others)


@pytest.mark.parametrize("name, forward, backward", [
    ("megatron-core", 6.0, 4.0), ("megatron-core-2024", 38.0, 14.0), ("torchtitan", 22.0, 26.0)])
def test_each_stack_pays_what_its_kernels_move(small, name, forward, backward):
    (i,) = np.flatnonzero(small.loss_numel)
    stack = load_execution(name)
    assert (stack.loss_forward_bytes, stack.loss_backward_bytes) == (forward, backward)
    cluster, loaded = _times(small, stack)
    _, bare = _times(small, with_changes(stack, {"loss_forward_bytes": 0.0, "loss_backward_bytes": 0.0}, "t"))
    paid = loaded.forward(i, 1) + loaded.backward(i, 1) - bare.forward(i, 1) - bare.backward(i, 1)
    elements = MB * SEQ * VOCAB
    assert paid == pytest.approx(_memory_s(cluster, forward * elements) + _memory_s(cluster, backward * elements),
                                 rel=1e-9)


def test_serving_has_no_loss(small):
    stack = load_execution("megatron-core-2024")
    _, serving = _times(small, stack, "infer")
    _, bare = _times(small, with_changes(stack, {"loss_forward_bytes": 0.0, "loss_backward_bytes": 0.0}, "t"), "infer")
    assert all(serving.forward(j, 1) == bare.forward(j, 1) for j in range(len(small.graph.nodes)))


def test_a_stack_file_refuses_a_negative_figure():
    from planner.errors import InvalidInput
    with pytest.raises(InvalidInput, match="loss_forward_bytes"):
        with_changes(load_execution("megatron-core"), {"loss_forward_bytes": -1.0}, "test")
