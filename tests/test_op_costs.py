"""FLOPs and bytes per op (planner.graph.op_costs): formulas, property tests, cross-checks with torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.graph.ir import Node, Tensor
from planner.graph.contractions import einsum_flops, matmul_flops
from planner.graph.op_costs import OpCost, cost_of_node, node_cost
from planner.graph.shape_rules import broadcast

dim = st.integers(1, 6)


def cost(op, ins, outs=(), attrs=None, domain="", dtype="float32"):
    return node_cost(op, domain, attrs or {}, list(ins), [dtype] * len(ins), list(outs), [dtype] * len(outs))


@st.composite
def matmul_shapes(draw):
    """Two operands with broadcastable batch dims (some 1s, different ranks)."""
    m, k, n = draw(dim), draw(dim), draw(dim)
    batch = draw(st.lists(dim, max_size=3))
    a_batch = [draw(st.sampled_from([b, 1])) for b in batch]
    b_batch = [draw(st.sampled_from([b, 1])) for b in batch][draw(st.integers(0, len(batch))):]
    return (*a_batch, m, k), (*b_batch, k, n)


@given(matmul_shapes())
@settings(max_examples=60, deadline=None)
def test_matmul_flops_is_two_mnk_times_broadcast_batch(shapes):
    a, b = shapes
    out = np.matmul(np.zeros(a), np.zeros(b)).shape
    m, k, n = a[-2], a[-1], b[-1]
    c = cost("MatMul", [a, b], [out])
    assert c.known and c.flops == 2 * math.prod(out[:-2]) * m * n * k
    assert c.bytes_read == 4 * (math.prod(a) + math.prod(b)) and c.bytes_written == 4 * math.prod(out)


def test_matmul_vector_operands_follow_numpy_promotion():
    assert matmul_flops((5,), (5, 7)) == 2 * 5 * 7
    assert matmul_flops((3, 5), (5,)) == 2 * 3 * 5
    assert matmul_flops((2, 1, 3, 5), (4, 5, 6)) == 2 * 2 * 4 * 3 * 5 * 6


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_einsum_agrees_with_matmul_on_batched_contraction(b, i, j, k):
    assert einsum_flops("bij,bjk->bik", [(b, i, j), (b, j, k)]) == matmul_flops((b, i, j), (b, j, k))
    c = cost("Einsum", [(b, i, j), (b, j, k)], [(b, i, k)], {"equation": "bij,bjk->bik"})
    assert c.known and c.flops == 2 * b * i * j * k


def test_einsum_other_forms():
    assert einsum_flops("ij->ji", [(3, 4)]) == 0  # a transpose
    assert einsum_flops("ij->", [(3, 4)]) == 12  # a sum: one add per element
    assert einsum_flops("i,j->ij", [(3,), (4,)]) == 12  # outer product: one multiply per point
    assert einsum_flops("...ij,...jk", [(2, 3, 4), (2, 4, 5)]) == 2 * 2 * 3 * 4 * 5  # implicit output, ellipsis
    # Left to right: (ij,jk -> ik) then (ik,kl -> il).
    assert einsum_flops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == 2 * 2 * 3 * 4 + 2 * 2 * 4 * 5


def test_gemm_transposes_and_bias():
    c = cost("Gemm", [(8, 4), (16, 8), (16,)], [(4, 16)], {"transA": 1, "transB": 1})
    assert c.flops == 2 * 4 * 16 * 8 + 4 * 16
    assert cost("Gemm", [(4, 8), (8, 16)], [(4, 16)]).flops == 2 * 4 * 8 * 16


try:
    import torch
except ImportError:  # the torch extra is optional
    torch = None
def needs_torch(test):
    """Marked torch (under CI a skip fails) and skipped without it."""
    return pytest.mark.torch(pytest.mark.skipif(torch is None, reason="needs torch (the [torch] extra)")(test))


def _torch_flops(fn, *args) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(4, 9),
       st.integers(1, 3), st.integers(1, 2), st.integers(0, 1), st.integers(1, 2))
@settings(max_examples=25, deadline=None)
@needs_torch
def test_conv_flops_match_torch_flop_counter(n, groups, cin_g, cout_g, size, k, stride, pad, dil):
    assume(size + 2 * pad >= dil * (k - 1) + 1)
    x = torch.zeros(n, cin_g * groups, size, size + 1)
    w = torch.zeros(cout_g * groups, cin_g, k, k)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups)
    c = cost("Conv", [tuple(x.shape), tuple(w.shape)], [tuple(y.shape)],
             {"group": groups, "strides": (stride, stride), "pads": (pad,) * 4, "dilations": (dil, dil)})
    assert c.known and c.flops == _torch_flops(torch.nn.functional.conv2d, x, w, None, stride, pad, dil, groups)
    with_bias = cost("Conv", [tuple(x.shape), tuple(w.shape), (w.shape[0],)], [tuple(y.shape)], {"group": groups})
    assert with_bias.flops == c.flops + y.numel()


@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(2, 5), st.integers(1, 3),
       st.integers(1, 2))
@settings(max_examples=20, deadline=None)
@needs_torch
def test_conv_transpose_and_3d_conv_match_torch(n, cin, cout, size, k, stride):
    assume(size >= k)
    x = torch.zeros(n, cin, size, size)
    w = torch.zeros(cin, cout, k, k)
    y = torch.nn.functional.conv_transpose2d(x, w, stride=stride)
    c = cost("ConvTranspose", [tuple(x.shape), tuple(w.shape)], [tuple(y.shape)], {"strides": (stride, stride)})
    assert c.flops == _torch_flops(torch.nn.functional.conv_transpose2d, x, w, None, stride)
    x3, w3 = torch.zeros(n, cin, size, size, size), torch.zeros(cout, cin, k, k, k)
    y3 = torch.nn.functional.conv3d(x3, w3)
    c3 = cost("Conv", [tuple(x3.shape), tuple(w3.shape)], [tuple(y3.shape)])
    assert c3.flops == _torch_flops(torch.nn.functional.conv3d, x3, w3)


@needs_torch
def test_matmul_matches_torch_flop_counter():
    a, b = torch.zeros(3, 1, 4, 5), torch.zeros(2, 5, 6)
    out = torch.matmul(a, b)
    assert cost("MatMul", [tuple(a.shape), tuple(b.shape)], [tuple(out.shape)]).flops == _torch_flops(
        torch.matmul, a, b)


def test_attention_opset23_counts_qk_av_and_softmax():
    b, hq, hkv, s, d = 2, 8, 2, 16, 32
    four_d = cost("Attention", [(b, hq, s, d), (b, hkv, s, d), (b, hkv, s, d)], [(b, hq, s, d)], {"is_causal": 1})
    scores = b * hq * s * s
    assert four_d.flops == 2 * scores * d * 2 + scores * 6  # QK^T + AV, scale + softmax (5)
    three_d = cost("Attention", [(b, s, hq * d), (b, s, hkv * d), (b, s, hkv * d)], [(b, s, hq * d)],
                   {"q_num_heads": hq, "kv_num_heads": hkv})
    assert three_d.flops == four_d.flops
    with_past = cost("Attention", [(b, hq, 1, d), (b, hkv, 1, d), (b, hkv, 1, d), None, (b, hkv, 15, d),
                                   (b, hkv, 15, d)], [(b, hq, 1, d)])
    assert with_past.flops == 2 * b * hq * 1 * 16 * d * 2 + b * hq * 16 * 6
    # Fused: bytes are the inputs and the output, no S x S score matrix.
    assert four_d.bytes_read == 4 * (b * hq * s * d + 2 * b * hkv * s * d)
    assert not cost("Attention", [(b, s, hq * d), (b, s, hkv * d), (b, s, hkv * d)], [None]).known  # no head counts


def test_norms_softmax_and_elementwise_per_element_weights():
    x = (4, 8, 64)
    n = math.prod(x)
    assert cost("LayerNormalization", [x, (64,), (64,)], [x]).flops == 8 * n
    assert cost("RMSNormalization", [x, (64,)], [x]).flops == 4 * n
    assert cost("SimplifiedLayerNormalization", [x, (64,)], [x], domain="com.microsoft").flops == 4 * n
    assert cost("SkipLayerNormalization", [x, x, (64,), (64,)], [x], domain="com.microsoft").flops == 9 * n
    assert cost("Softmax", [x], [x]).flops == 5 * n
    assert cost("Add", [x, (64,)], [x]).flops == n
    assert cost("Sum", [x, x, x], [x]).flops == 2 * n
    assert cost("Where", [x, x, (1,)], [x]).flops == n
    assert cost("Sigmoid", [x], [x]).flops == 4 * n
    assert cost("Gelu", [x], [x], {"approximate": "tanh"}).flops == 9 * n
    to_half = node_cost("Cast", "", {"to": 10}, [x], ["float32"], [x], ["float16"])
    assert to_half.flops == 0 and to_half.bytes_read == 4 * n and to_half.bytes_written == 2 * n
    assert cost("Cast", [x], [x]).bytes_read == cost("Cast", [x], [x]).bytes_written == 0  # to its own dtype
    like = node_cost("CastLike", "", {}, [(), x], ["float32", "float16"], [()], ["float16"])
    assert like.bytes_read == 4  # the scalar, not the tensor that names the dtype
    assert cost("ReduceMean", [x, (1,)], [(4, 8, 1)]).flops == n + 32
    assert cost("BatchNormalization", [(1, 3, 4, 4)] + [(3,)] * 4, [(1, 3, 4, 4)]).flops == 2 * 48


def test_pooling_topk_and_cumsum():
    x, y = (1, 8, 16, 16), (1, 8, 8, 8)
    assert cost("MaxPool", [x], [y], {"kernel_shape": (3, 3)}).flops == 9 * math.prod(y)
    assert cost("AveragePool", [x], [y], {"kernel_shape": (2, 2)}).flops == 5 * math.prod(y)
    assert cost("GlobalAveragePool", [x], [(1, 8, 1, 1)]).flops == math.prod(x)
    assert cost("TopK", [(4, 1024), (1,)], [(4, 8), (4, 8)]).flops == 4 * 1024 * 3
    assert cost("CumSum", [(4, 100), ()], [(4, 100)]).flops == 400


def test_views_move_nothing_and_movers_move_bytes_without_flops():
    x = (4, 8, 16)
    for op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape"):
        assert cost(op, [x, (2,)], [(32, 16)]) == OpCost(0.0, 0.0, 0.0, True)
    t = cost("Transpose", [x], [(16, 8, 4)])
    assert t == OpCost(0.0, 4 * 512, 4 * 512, True)
    cat = cost("Concat", [x, x], [(8, 8, 16)])
    assert cat.flops == 0 and cat.bytes_read == 2 * 4 * 512 and cat.bytes_written == 4 * 1024
    assert cost("ConstantOfShape", [(3,)], [x]).bytes_read == 0


def test_gather_reads_rows_not_the_table():
    table, ids, out = (128256, 8192), (1, 4096), (1, 4096, 8192)
    c = node_cost("Gather", "", {}, [table, ids], ["bfloat16", "int64"], [out], ["bfloat16"])
    assert c.known and c.flops == 0
    assert c.bytes_written == 2 * 4096 * 8192
    assert c.bytes_read == 8 * 4096 + 2 * 4096 * 8192  # indices + the gathered rows
    s = cost("Slice", [(100, 64), (1,), (1,)], [(10, 64)])
    assert s.bytes_read == 4 * 640 + 2 * 4 and s.bytes_written == 4 * 640


def test_unknown_ops_and_missing_shapes_cost_bytes_only_and_are_flagged():
    c = cost("Frobnicate", [(4, 4)], [(4, 4)], domain="acme")
    assert c == OpCost(0.0, 64.0, 64.0, False)
    assert not cost("NotAnOnnxOp", [(2,)], [(2,)]).known
    missing = cost("MatMul", [(4, 8), None], [None])
    assert not missing.known and missing.flops == 0 and missing.bytes_read == 4 * 32
    assert cost("Relu", [None], [None]) == OpCost(0.0, 0.0, 0.0, False)


def test_cost_of_node_recosts_under_a_sharded_shape():
    tensors = {"x": Tensor("x", (8, 64), "float32"), "w": Tensor("w", (64, 256), "float32", True),
               "y": Tensor("y", (8, 256), "float32")}
    node = Node("mm", "MatMul", ("x", "w"), ("y",))
    full = cost_of_node(node, tensors)
    assert full.flops == 2 * 8 * 64 * 256
    shard = cost_of_node(node, tensors, {"w": (64, 64), "y": (8, 64)})  # column-parallel over 4 devices
    assert shard.flops == full.flops / 4
    assert shard.bytes_read == 4 * (8 * 64 + 64 * 64)


@given(st.lists(st.lists(st.sampled_from([1, 2, 3, 5]), max_size=4), min_size=1, max_size=3))
@settings(max_examples=80, deadline=None)
def test_broadcast_shape_rule_matches_numpy(shapes):
    shapes = [tuple(s) for s in shapes]
    try:
        expected = np.broadcast_shapes(*shapes)
    except ValueError:
        return  # incompatible shapes are not ONNX-valid inputs
    assert broadcast(*shapes) == expected
    assert cost("Add", shapes[:2] if len(shapes) > 1 else shapes * 2, [expected]).flops == math.prod(expected)


def test_broadcast_with_unknown_dims():
    assert broadcast((None, 4), (3, 1)) == (3, 4)
    assert broadcast((None, 4), (1, 4)) == (None, 4)
    assert broadcast((2, 4), None) is None


def test_a_tensor_given_twice_is_read_once():
    """x * x squares what one load brings, as x ** 2 does: the op's bytes count x once, whatever the spelling
    (an exporter's RMSNorm writes Pow(x, 2), the zoo's Mul(x, x))."""
    x = Tensor("x", (8, 1024), "float16")
    two = Tensor("two", (), "float16")
    y = Tensor("y", (8, 1024), "float16")
    square = cost_of_node(Node("sq", "Mul", ("x", "x"), ("y",)), {"x": x, "y": y})
    power = cost_of_node(Node("pw", "Pow", ("x", "two"), ("y",)), {"x": x, "two": two, "y": y})
    product = cost_of_node(Node("xy", "Mul", ("x", "y"), ("y",)), {"x": x, "y": y})
    assert square.bytes_read == 8 * 1024 * 2 == power.bytes_read - 2
    assert product.bytes_read == 2 * 8 * 1024 * 2  # two tensors: both read
