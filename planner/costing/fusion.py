"""Which intermediate tensors never reach HBM because chains of memory-bound ops run as one kernel.

An ONNX graph spells every elementwise step as its own node (scale, mask,
softmax; bias, dropout, residual add), and costing each node as a trip to
HBM and back overstates what a trained model moves: training frameworks
fuse such chains into one kernel (Megatron-LM's fused scale-mask-softmax,
bias-GeLU and bias-dropout-add kernels, Narayanan et al. 2021 section 4.2;
TorchInductor and XLA fuse pointwise chains the same way). The rule here is
the one those compilers use: a tensor stays on chip when its producer and
its only consumer are both memory-bound ops (views such as Reshape are
looked through) and the backward pass does not need it stored (softmax
outputs, norm inputs, dropout masks are written regardless).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np

from planner.costing.node_work import METADATA_OPS
from planner.graph.ir import Graph

#: Ops that only relabel storage: a chain is fused through them.
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def fused_act_bytes(graph: Graph, act_bytes: np.ndarray, matrix: np.ndarray, stored: Collection[str]) -> np.ndarray:
    """`act_bytes` (per node, at the imported batch) less the tensors that stay on chip between fused ops.

    `matrix[i]` marks nodes that run on the matrix units (never fused here);
    `stored` holds the (view-root) names the backward pass reads, which
    must be written even inside a fused chain.
    """
    chains = _Chains(graph, matrix)
    out = act_bytes.astype(float).copy()
    for i, j, nbytes, reads in chains.fused_edges(stored):
        out[i] -= nbytes  # not written by the producer
        out[j] -= nbytes * reads  # not read back by the consumer
    for i, readers, source, cast in chains.casts:
        out[i] = 0.0  # the cast does not run: each reader converts in registers
        for j, k in readers:
            out[j] -= (cast - source) * k  # it reads the source at the source's width
    return np.maximum(out, 0.0)


def absorbed_nodes(graph: Graph, matrix: np.ndarray) -> np.ndarray:
    """Per node: a memory-bound op that launches no kernel of its own because it runs inside its consumers'
    fused kernel: each of its outputs stays on chip into one memory-bound reader (`fused_act_bytes`' rule, a
    tensor the backward keeps included: the kernel writes it on the way, as Transformer Engine's RMSNorm writes
    its 1/rms beside its output), or it is a cast its readers fold (`folded_casts`). A fused RMSNorm's seven
    ONNX nodes are one launch, its last."""
    chains = _Chains(graph, matrix)
    fused: dict[int, int] = {}
    for i, _, _, _ in chains.fused_edges(()):
        fused[i] = fused.get(i, 0) + 1
    out = np.array([bool(n.outputs) and fused.get(i, 0) == sum(1 for o in n.outputs if o in graph.tensors)
                    for i, n in enumerate(graph.nodes)], dtype=bool)
    for i, _, _, _ in chains.casts:
        out[i] = True
    return out


def data_inputs(node) -> tuple[str, ...]:
    """The inputs whose data a node reads: none for an op that reads only shapes (`METADATA_OPS`), CastLike's
    first (its second names a dtype)."""
    if node.op_type in METADATA_OPS:
        return ()
    return tuple(node.inputs[:1] if node.op_type == "CastLike" else node.inputs)


class _Chains:
    """What the chain rule reads of a graph, found once: each tensor's readers (a node that reads a tensor's data,
    once however many of its inputs it is: x * x), the graph's outputs, the casts readers fold (`folded_casts`),
    and the nodes that move nothing, views aside: folded permutes and casts (`folded_permutes`)."""

    def __init__(self, graph: Graph, matrix: np.ndarray) -> None:
        self.graph, self.matrix = graph, matrix
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(graph.nodes):
            for x in dict.fromkeys(data_inputs(n)):
                if x:
                    self.consumers.setdefault(x, []).append(i)
        self.outputs = set(graph.outputs)
        self.casts = folded_casts(graph, matrix, self.consumers, self.outputs)
        self.free = folded_permutes(graph)  # moves nothing: neither ends a chain nor keeps its input on chip
        for cast, _, _, _ in self.casts:
            self.free[cast] = True

    def fused_edges(self, stored: Collection[str]) -> Iterator[tuple[int, int, float, int]]:
        return _fused_edges(self.graph, self.matrix, stored, self.consumers, self.outputs, self.free)


def _fused_edges(graph: Graph, matrix: np.ndarray, stored: Collection[str], consumers: dict[str, list[int]],
                 outputs: Collection[str], free: np.ndarray) -> Iterator[tuple[int, int, float, int]]:
    """(producer, consumer, bytes, times the consumer reads it) of each tensor that stays on chip between two
    memory-bound ops: its one non-view reader (views looked through, and so are the `free` nodes, the permutes
    and casts its readers fold in) is memory-bound, and neither the graph nor the backward pass (`stored`)
    needs it."""

    def is_view(i: int) -> bool:
        return graph.nodes[i].op_type in VIEW_OPS or bool(free[i])

    def final_consumer(name: str, root: str) -> tuple[int, str] | None:
        """The one non-view node that reads `name` (through views), and the tensor it reads; None if not one."""
        seen = 0
        while True:
            users = consumers.get(name, [])
            if len(users) != 1 or name in outputs or name in stored or root in stored:
                return None
            user = users[0]
            if not is_view(user):
                return user, name
            seen += 1
            if seen > 16:
                return None
            name = graph.nodes[user].outputs[0]

    for i, n in enumerate(graph.nodes):
        if matrix[i] or is_view(i):
            continue
        for o in n.outputs:
            t = graph.tensors.get(o) if o else None
            if t is None:
                continue
            hit = final_consumer(o, o)
            if hit is None:
                continue
            j, read = hit
            if matrix[j] or is_view(j):
                continue
            yield i, j, float(t.nbytes), graph.nodes[j].inputs.count(read)


def folded_casts(graph: Graph, matrix: np.ndarray, consumers: dict[str, list[int]],
                 outputs: Collection[str]) -> list[tuple[int, list[tuple[int, int]], float, float]]:
    """Casts read by two or more memory-bound ops (through views) that fuse into each of them: (cast, [(reader,
    times it reads)], the source's bytes, the cast's bytes). An eager export spells RMSNorm's upcast to fp32 as
    one Cast read by the square and by the scaling; a fused norm (Transformer Engine's, TorchInductor's) reads
    the 16-bit input and converts it in registers, and its backward keeps that input rather than the upcast
    (which `planner.costing.activations` already prices at the step's width). A cast read once is the chain
    rule's (`fused_act_bytes`)."""
    out = []
    for i, n in enumerate(graph.nodes):
        if n.op_type not in ("Cast", "CastLike") or not n.inputs or not n.outputs:
            continue
        src, dst = graph.tensors.get(n.inputs[0]), graph.tensors.get(n.outputs[0])
        if src is None or dst is None or dst.name in outputs:
            continue
        readers: dict[int, int] = {}
        frontier, ok = [dst.name], True
        while frontier and ok:
            name = frontier.pop()
            for j in consumers.get(name, []):
                if graph.nodes[j].op_type in VIEW_OPS:
                    ok = ok and graph.nodes[j].outputs[0] not in outputs
                    frontier.append(graph.nodes[j].outputs[0])
                elif matrix[j]:
                    ok = False
                else:
                    readers[j] = readers.get(j, 0) + graph.nodes[j].inputs.count(name)
        if ok and len(readers) >= 2:
            out.append((i, sorted(readers.items()), float(src.nbytes), float(dst.nbytes)))
    return out


def folded_permutes(graph: Graph) -> np.ndarray:
    """Per node: a Transpose that a fusing stack folds into its readers' strides instead of copying.

    A permutation is only a change of strides: a GEMM reads either operand transposed (cuBLAS's op(A)), a
    flash kernel and a fused pointwise kernel index their inputs through strides, and Megatron-Core keeps
    attention's [s, b, h, d] layout so that no permute runs before its fused RoPE or after its attention
    (TorchInductor folds permutes into the indexing of the kernels that read them the same way, Ansel et
    al. 2024). A Transpose read by a Reshape or Flatten that merges the permuted dimensions is a copy
    (`.contiguous()` before `.view()`, as attention's output back to [b, s, h x d] in eager and compiled
    torch), and costs one.
    """
    merging = {x for n in graph.nodes if n.op_type in ("Reshape", "Flatten") for x in n.inputs if x}
    return np.array([n.op_type == "Transpose" and not any(o in merging or o in graph.outputs for o in n.outputs if o)
                     for n in graph.nodes], dtype=bool)


__all__ = ["VIEW_OPS", "absorbed_nodes", "data_inputs", "folded_casts", "folded_permutes", "fused_act_bytes"]


#: Pointwise and row-wise ops a fusing compiler (or a hand-fused kernel) runs in one kernel with their neighbours.
FUSABLE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid", "Relu",
    "LeakyRelu", "Gelu", "FastGelu", "QuickGelu", "Erf", "Silu", "Softplus", "HardSigmoid", "HardSwish", "Mish",
    "Cast", "CastLike", "Where", "Max", "Min", "Clip", "Abs", "Sin", "Cos", "ReduceMean", "ReduceSum",
    "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}) | VIEW_OPS | frozenset({"Transpose", "Expand", "Slice", "Split", "Concat"})


def recomputed_in_fused_backward(graph: Graph, saved: list, stored_by_others: Collection[str]) -> set[str]:
    """The saved tensors a fused backward recomputes instead of keeping (cheap pointwise intermediates).

    When chains of pointwise ops run as one kernel, their backward kernel
    reads the chain's stored inputs and recomputes the intermediates
    (Megatron's fused bias-SwiGLU keeps its input, not the activation;
    Transformer Engine's fused norms keep the input and the statistics;
    torch.compile's partitioner recomputes pointwise ops rather than saving
    them, Ansel et al. 2024 section 5). So a tensor that only pointwise ops
    save, made by a pointwise op from tensors that are kept (or themselves
    recomputable), parameters or constants, is dropped. Tensors a
    contraction, a softmax or any other op saves are kept.
    """
    producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    params = set(graph.params)
    savers: dict[str, set[int]] = {}
    for sv in saved:
        savers.setdefault(sv.tensor, set()).add(sv.saver)
    kept: set[str] = set(stored_by_others)
    recomputable: set[str] = set()
    dropped: set[str] = set()

    def available(x: str) -> bool:
        t = graph.tensors.get(x)
        if x in params or x not in producer or graph.nodes[producer[x]].op_type == "Constant":
            return True  # parameters, graph inputs and constants (initializers or Constant nodes)
        if t is not None and t.dtype not in ("float32", "float16", "bfloat16", "float", "float64", "double"):
            return True  # integer and boolean side inputs (masks, positions) are cheap to rebuild
        return x in kept or x in recomputable

    for i, n in enumerate(graph.nodes):
        fusable = n.op_type in FUSABLE_OPS
        for o in n.outputs:
            if not o:
                continue
            ok = fusable and all(available(x) for x in data_inputs(n) if x)
            if ok:
                recomputable.add(o)
            if o in savers:
                if ok and all(graph.nodes[s].op_type in FUSABLE_OPS for s in savers[o]) and o not in stored_by_others:
                    dropped.add(o)
                else:
                    kept.add(o)
    return dropped
