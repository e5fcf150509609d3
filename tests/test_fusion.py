"""Fusion of memory-bound chains: which tensors stay on chip, and which the backward pass forces out."""

from __future__ import annotations

import numpy as np
import pytest

from planner.costing.activations import requires_grad, saved_tensors
from planner.api import load_graph
from planner.costing.fusion import fused_act_bytes
from planner.costing.node_work import node_work


@pytest.fixture(scope="module")
def gpt():
    g = load_graph("gpt", batch=1, seq_len=128, overrides=dict(hidden=256, layers=2, heads=4, vocab=512))
    return g, node_work(g)


def _node(g, op: str, after: str):
    """Index of the first `op` node that reads a tensor produced by an `after` node."""
    made = {o: n.op_type for n in g.nodes for o in n.outputs if o}
    return next(i for i, n in enumerate(g.nodes) if n.op_type == op and any(made.get(x) == after for x in n.inputs))


def test_scale_mask_softmax_chain_keeps_its_intermediates_on_chip(gpt):
    g, w = gpt
    stored = {s.tensor for s in saved_tensors(g, None, requires_grad(g))}
    fused = fused_act_bytes(g, w.act_bytes, w.matrix, stored)
    scale = _node(g, "Mul", "MatMul")  # scores * 1/sqrt(d)
    mask = _node(g, "Add", "Mul")
    softmax = _node(g, "Softmax", "Add")
    scores = g.tensors[g.nodes[scale].outputs[0]].nbytes
    assert fused[scale] == pytest.approx(w.act_bytes[scale] - scores)  # reads the scores, writes nothing
    assert fused[mask] < w.act_bytes[mask] - 1.9 * scores  # neither reads nor writes the big tensor
    assert fused[softmax] == pytest.approx(w.act_bytes[softmax] - scores)  # writes its output: backward needs it
    assert np.array_equal(fused[w.matrix], w.act_bytes[w.matrix])  # matmuls are never fused here
    assert (fused <= w.act_bytes).all() and (fused >= 0).all()


def test_inference_fuses_what_training_must_store(gpt):
    g, w = gpt
    train = fused_act_bytes(g, w.act_bytes, w.matrix, {s.tensor for s in saved_tensors(g, None, requires_grad(g))})
    infer = fused_act_bytes(g, w.act_bytes, w.matrix, set())
    softmax = _node(g, "Softmax", "Add")
    assert infer[softmax] < train[softmax]  # its output goes straight into the dropout
    assert infer.sum() < train.sum() < w.act_bytes.sum()


def test_a_tensor_read_twice_is_written(gpt):
    g, w = gpt
    fused = fused_act_bytes(g, w.act_bytes, w.matrix, set())
    consumers: dict[str, int] = {}
    for n in g.nodes:
        for x in n.inputs:
            if x:
                consumers[x] = consumers.get(x, 0) + 1
    # the residual adds feed a norm and the next residual add: their outputs must reach HBM
    residual = [i for i, n in enumerate(g.nodes) if n.op_type == "Add" and consumers.get(n.outputs[0], 0) >= 2]
    assert residual
    for i in residual:
        out = g.tensors[g.nodes[i].outputs[0]].nbytes
        assert fused[i] >= out


def test_a_fused_kernel_writes_none_of_the_intermediates_its_backward_recomputes():
    """SwiGLU as one kernel (Megatron's bias_swiglu, TE's fused norms): silu(g) * u keeps g and u for backward
    and recomputes sigmoid(g) there, so the time of a fused stack's forward never writes sigmoid(g) to HBM and
    never reads it back; costed as stored (an unfused backward keeps it), it is written once and read once."""
    from planner.costing.graph_facts import GraphFacts
    from planner.graph.blocks import discover_blocks

    g = load_graph("llama3-8b", batch=1, seq_len=64, overrides=dict(layers=1, hidden=256, heads=4, kv_heads=2,
                                                                    ffn=512, vocab=512))
    facts = GraphFacts(g, discover_blocks(g))
    sig = next(i for i, n in enumerate(g.nodes) if n.op_type == "Sigmoid")
    gate, out = g.tensors[g.nodes[sig].inputs[0]], g.tensors[g.nodes[sig].outputs[0]]
    kept = facts.act_bytes(True, 2.0)
    fused = facts.act_bytes(True, 2.0, flash=True, fused=True)
    assert kept[sig] == pytest.approx(gate.nbytes + out.nbytes)  # reads g, writes sigmoid(g)
    assert fused[sig] == pytest.approx(gate.nbytes)  # reads g only
