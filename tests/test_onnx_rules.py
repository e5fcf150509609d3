"""The import's rules, each against its reference: module scopes from torch's exporters' names, batch and sequence
dims by name, dim expressions, the Conv/Pool shape rule against ONNX's own inference, the value rules against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.graph import onnx_dims, onnx_scopes, shape_rules, value_rules
from tests import graphs


@pytest.mark.parametrize("text, scope", [
    ("['', 'model', 'model.layers.0', 'model.layers.0.self_attn', 'model.layers.0.self_attn.q_proj', 'linear']",
     "model.layers.0.self_attn.q_proj"),
    ("['', 'model', 'layers.0', 'self_attn', 'linear']", "model.layers.0.self_attn"),  # older, relative names
    ("['_empty_nn_module_stack_from_metadata_hook', 'sym_size_int_24']", ""),
    ("['', 'lm_head', 'linear_14']", "lm_head"),
])
def test_scope_from_dynamo_name_scopes(text, scope):
    assert onnx_scopes.scope_from_name_scopes(text) == scope


def test_scope_from_namespace_and_node_names():
    ns = ": LlamaForCausalLM/model: LlamaModel/model.layers.3: LlamaDecoderLayer/mul_5: aten.mul.Tensor"
    assert onnx_scopes.scope_from_namespace(ns) == "model.layers.3"
    assert onnx_scopes.scope_from_node_name("/model/layers.0/self_attn/q_proj/MatMul") == "model.layers.0.self_attn.q_proj"
    assert onnx_scopes.scope_from_node_name("node_linear_3") == ""
    # an nn.Sequential's children are named after it: /mlp/mlp.0/ is the module mlp.0
    assert onnx_scopes.scope_from_node_name("/model/visual/merger/mlp/mlp.0/Gemm") == "model.visual.merger.mlp.0"


@pytest.mark.parametrize("name", ["batch", "batch_size", "BatchSize", "N", "b", "bsz", "input_batch"])
def test_batch_names(name):
    assert onnx_dims.is_batch_name(name) and not onnx_dims.is_seq_name(name)


@pytest.mark.parametrize("name, is_seq", [("seq", True), ("seq_len", True), ("sequence_length", True),
                                          ("encoder_sequence_length", True), ("num_tokens", True),
                                          ("past_sequence_length", False), ("max_seq_len", False),
                                          ("total_sequence_length", False), ("s0", False), ("height", False)])
def test_seq_names(name, is_seq):
    assert onnx_dims.is_seq_name(name) is is_seq


def test_dim_expressions():
    assert onnx_dims.evaluate("seq + 1", {"seq": 7}) == 8
    assert onnx_dims.evaluate("2*s0 - s1//2", {"s0": 3, "s1": 4}) == 4
    assert onnx_dims.evaluate("max(a, 3)", {"a": 1}) == 3
    assert onnx_dims.evaluate("seq + 1", {}) is None and onnx_dims.evaluate("__import__('os')", {}) is None
    assert onnx_dims.names_in("past_sequence_length + sequence_length") == ["past_sequence_length",
                                                                           "sequence_length"]


@given(st.integers(1, 3), st.integers(5, 12), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2),
       st.integers(1, 2), st.sampled_from(["Conv", "MaxPool", "AveragePool"]), st.booleans())
@settings(max_examples=40, deadline=None)
def test_conv_and_pool_shape_rule_matches_onnx_inference(c, size, k, stride, pad, dil, op, ceil):
    assume(size + 2 * pad >= dil * (k - 1) + 1 and pad < k)
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    if op == "Conv":
        attrs["dilations"] = [dil, dil]
    elif ceil:
        attrs["ceil_mode"] = 1
    ins = ["x", "w"] if op == "Conv" else ["x"]
    inits = [graphs.weight("w", 4, c, k, k)] if op == "Conv" else []
    m = graphs.model([onnx.helper.make_node(op, ins, ["y"], **attrs)], [graphs.vi("x", [2, c, size, size + 1])],
                     [graphs.vi("y", None)], inits)
    inferred = onnx.shape_inference.infer_shapes(m)
    expected = tuple(d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim)
    mine = shape_rules.infer_shapes(op, "", attrs, [(2, c, size, size + 1), (4, c, k, k)], [None, None], [None], 1)
    assert mine[0] == expected


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
@settings(max_examples=40, deadline=None)
def test_value_rules_match_numpy(dims, data):
    x = np.arange(int(np.prod(dims)), dtype=np.int64).reshape(dims)
    axis = data.draw(st.integers(0, len(dims) - 1))
    start = data.draw(st.integers(-dims[axis], dims[axis]))
    sliced = value_rules.evaluate("Slice", {}, [x, np.array([start]), np.array([dims[axis]]), np.array([axis])],
                                  [x.shape], "int64")
    assert np.array_equal(sliced, x[(slice(None),) * axis + (slice(start, None),)])
    flat = value_rules.evaluate("Reshape", {}, [x, np.array([0, -1])], [x.shape], "int64")
    assert flat.shape == (dims[0], x.size // dims[0])
    assert shape_rules.infer_shapes("Reshape", "", {}, [x.shape, (2,)], [x, np.array([0, -1])], [None], 1)[0] == \
        flat.shape
    gathered = value_rules.evaluate("Gather", {"axis": axis}, [x, np.array([0, -1])], [x.shape], "int64")
    assert np.array_equal(gathered, np.take(x, [0, -1], axis=axis))
    shape = value_rules.evaluate("Shape", {"start": 1}, [None], [x.shape], "int64")
    assert list(shape) == dims[1:]


@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 5), st.data())
@settings(max_examples=40, deadline=None)
def test_one_hot_value_rule_matches_onnx_reference(dims, depth, data):
    """OneHot (negative indices counted from depth, out-of-range ones all `off`, the new axis anywhere) as ONNX's
    reference implementation computes it."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    indices = np.array(data.draw(st.lists(st.integers(-depth - 1, depth), min_size=int(np.prod(dims)),
                                          max_size=int(np.prod(dims)))), dtype=np.int64).reshape(dims)
    axis = data.draw(st.integers(-len(dims) - 1, len(dims)))
    values = np.array([2, 7], dtype=np.int64)
    node = helper.make_node("OneHot", ["i", "d", "v"], ["o"], axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, None)
                                            for n in "idv"], [helper.make_tensor_value_info("o", onnx.TensorProto.INT64,
                                                                                            None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    want = ReferenceEvaluator(model).run(None, {"i": indices, "d": np.array(depth), "v": values})[0]
    got = value_rules.evaluate("OneHot", {"axis": axis}, [indices, np.array(depth), values], [indices.shape], "int64")
    assert np.array_equal(got, want)
