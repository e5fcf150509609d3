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


def test_a_permute_is_folded_into_its_readers_strides_unless_a_view_needs_it_contiguous():
    """Llama's attention: the query and key permuted to [b, h, s, d] are read by RoPE's pointwise ops (strided
    reads: Megatron-Core never permutes them, TorchInductor folds the permute); the attention output permuted
    back feeds the Reshape merging the heads, a `.contiguous()` copy. Under a fusing stack a folded permute
    costs nothing, eager it is a copy: its tensor read and written once at HBM speed."""
    import dataclasses

    from cost_models import load_cluster
    from planner.api import _graph_for_costing, make_workload
    from planner.costing.execution import load_execution, with_changes
    from planner.costing.fusion import folded_permutes
    from planner.costing.graph_facts import GraphFacts
    from planner.costing.node_times import NodeTimes
    from planner.graph.blocks import discover_blocks
    from planner.strategy import Strategy

    g = _graph_for_costing("llama3-8b", 256, None, dict(layers=1, hidden=256, heads=4, kv_heads=2, vocab=512))
    folded = folded_permutes(g)
    made = {o: n for n in g.nodes for o in n.outputs if o}
    readers = {}
    for n in g.nodes:
        for x in n.inputs:
            readers.setdefault(x, []).append(n.op_type)
    permutes = [i for i, n in enumerate(g.nodes) if n.op_type == "Transpose" and made.get(n.inputs[0]) is not None]
    to_rope = [i for i in permutes if "Slice" in readers.get(g.nodes[i].outputs[0], [])]
    to_view = [i for i in permutes if "Reshape" in readers.get(g.nodes[i].outputs[0], [])]
    assert len(to_rope) == 2 and len(to_view) == 1  # query and key; the attention output
    assert folded[to_rope].all() and not folded[to_view].any()

    facts = GraphFacts(g, discover_blocks(g))
    cluster = dataclasses.replace(load_cluster("dgx-h100", devices=8), host_overhead_s=0.0)
    work = make_workload("train", 8, 256, "bf16", None)
    fused = load_execution("megatron-core")
    eager = with_changes(fused, {"fuse_elementwise": False}, "eager")
    q = to_rope[0]
    nbytes = g.tensors[g.nodes[q].outputs[0]].nbytes * 2  # one micro-batch of 2 sequences, the graph's 1
    hbm = cluster.device.hbm_bytes_per_s
    assert NodeTimes(facts, cluster, work, Strategy(dp=8, micro_batch=2), fused).forward(q, 1) == 0.0
    copy = NodeTimes(facts, cluster, work, Strategy(dp=8, micro_batch=2), eager).forward(q, 1)
    assert copy == pytest.approx(2 * nbytes / (hbm * cluster.memory_efficiency(2 * nbytes)), rel=1e-6)
    assert NodeTimes(facts, cluster, work, Strategy(dp=8, micro_batch=2), fused).forward(to_view[0], 1) > 0.0


# -- spelling-independence of what a backward keeps (tests/graphs builders; small hand-made graphs) --

def _graph(nodes, inputs, outputs, inits):
    from planner.graph.onnx_import import import_model
    from tests import graphs

    return import_model(graphs.model(nodes, inputs, outputs, inits))


def test_a_tensor_and_its_float_upcast_are_kept_once_at_the_steps_width():
    """x feeds a weight GEMM (which keeps it) and, upcast to fp32, a square (which keeps the upcast): at the
    step's width the two are one tensor, kept once; at the imported precision they are two."""
    from onnx import helper

    from tests import graphs

    nodes = [helper.make_node("MatMul", ["inp", "w0"], ["x"]),
             helper.make_node("MatMul", ["x", "w1"], ["y"]),
             helper.make_node("Cast", ["x"], ["xf"], to=graphs.F),
             helper.make_node("Mul", ["xf", "xf"], ["sq"]),
             helper.make_node("Cast", ["sq"], ["sqh"], to=graphs.BF16),
             helper.make_node("Add", ["y", "sqh"], ["out"])]
    g = _graph(nodes, [graphs.vi("inp", [4, 8], graphs.BF16)], [graphs.vi("out", [4, 8], graphs.BF16)],
               [graphs.weight("w0", 8, 8, dtype=graphs.BF16), graphs.weight("w1", 8, 8, dtype=graphs.BF16)])
    at_width = [sv.tensor for sv in saved_tensors(g, 2.0) if sv.tensor in ("x", "xf")]
    as_imported = [sv.tensor for sv in saved_tensors(g) if sv.tensor in ("x", "xf")]
    assert at_width == ["x"]
    assert sorted(as_imported) == ["x", "xf"]


def test_a_constant_nodes_output_is_as_available_to_a_fused_backward_as_an_initializer():
    """tanh(h + c) * h, c a Constant node's output: the Tanh keeps its input h + c, which the fused backward
    rebuilds from the kept h (it stayed kept while a Constant node's output did not count as available)."""
    from onnx import helper, numpy_helper

    from planner.costing.fusion import recomputed_in_fused_backward
    from tests import graphs

    c = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "c_value")
    nodes = [helper.make_node("MatMul", ["inp", "w0"], ["h"]),
             helper.make_node("Constant", [], ["c"], value=c),
             helper.make_node("Add", ["h", "c"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Mul", ["t", "h"], ["u"]),
             helper.make_node("MatMul", ["u", "w1"], ["out"])]
    g = _graph(nodes, [graphs.vi("inp", [4, 8])], [graphs.vi("out", [4, 8])],
               [graphs.weight("w0", 8, 8), graphs.weight("w1", 8, 8)])
    assert g.nodes[1].op_type == "Constant"
    saved = saved_tensors(g, 2.0)
    assert {"a", "h"} <= {sv.tensor for sv in saved}
    dropped = recomputed_in_fused_backward(g, saved, ())
    assert "a" in dropped and "h" not in dropped


def test_only_a_softmax_stabilizer_joins_the_attention_region():
    """Of two ReduceMax over the scores, the one whose maximum only the region's Sub subtracts joins it; the
    one whose maximum is a graph output (a logged max-logit) stays out."""
    from onnx import helper

    from planner.costing.attention import _stabilizers
    from planner.graph.walk import index_graph
    from tests import graphs

    nodes = [helper.make_node("Identity", ["s"], ["t"]),
             helper.make_node("ReduceMax", ["t"], ["m"], keepdims=1),
             helper.make_node("Sub", ["t", "m"], ["d"]),
             helper.make_node("ReduceMax", ["t"], ["m2"], keepdims=1),
             helper.make_node("Softmax", ["d"], ["p"])]
    g = _graph(nodes, [graphs.vi("s", [2, 4, 4])], [graphs.vi("p", [2, 4, 4]), graphs.vi("m2", [2, 4, 1])], [])
    names = [n.name or n.op_type for n in g.nodes]
    idx = {n.outputs[0]: i for i, n in enumerate(g.nodes)}
    region = {idx["t"], idx["d"], idx["p"]}
    assert _stabilizers(g, index_graph(g).consumers, region) == {idx["m"]}, names


def test_a_permute_folded_into_its_readers_neither_ends_a_chain_nor_keeps_its_input_on_chip():
    """A norm's scaled output permuted before RoPE (an export's QK-norm: [b, s, h, d] -> [b, h, s, d]) is read
    through the permute by two pointwise ops: as without the permute, the scaling is a kernel of its own that
    writes its output (it had fused into the permute, which moves nothing, with no kernel left to run it)."""
    from onnx import helper

    from planner.costing.fusion import absorbed_nodes, folded_permutes
    from tests import graphs

    def build(permuted: bool):
        head = [helper.make_node("MatMul", ["inp", "w0"], ["h"]), helper.make_node("Mul", ["h", "g"], ["n"])]
        if permuted:
            head.append(helper.make_node("Transpose", ["n"], ["t"], perm=[1, 0]))
        src = "t" if permuted else "n"
        tail = [helper.make_node("Mul", [src, "c"], ["a"]), helper.make_node("Neg", [src], ["b"]),
                helper.make_node("Add", ["a", "b"], ["out"])]
        shape = [8, 4] if permuted else [4, 8]
        return _graph(head + tail, [graphs.vi("inp", [4, 8], graphs.BF16)], [graphs.vi("out", shape, graphs.BF16)],
                      [graphs.weight("w0", 8, 8, dtype=graphs.BF16), graphs.weight("g", 8, dtype=graphs.BF16),
                       graphs.weight("c", *shape, dtype=graphs.BF16)])

    for permuted in (False, True):
        g = build(permuted)
        w = node_work(g)
        scale = next(i for i, n in enumerate(g.nodes) if n.op_type == "Mul" and "g" in n.inputs)
        assert not absorbed_nodes(g, w.matrix)[scale]
        assert fused_act_bytes(g, w.act_bytes, w.matrix, set())[scale] == pytest.approx(w.act_bytes[scale])
        assert folded_permutes(g).any() == permuted
