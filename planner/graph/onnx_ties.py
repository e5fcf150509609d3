"""A tied weight that TorchScript's exporter stored twice: the embedding table and a transposed copy for the head.

A language model whose output head shares the token embedding's weight
(GPT-2, Qwen2, Llama 3.2, Gemma: `tie_word_embeddings`) computes its logits
with `weight.t()`. `torch.onnx.export(..., dynamo=False)` folds that
transpose into a constant of its own, so the file holds the table (read by a
Gather) and its transpose (read by a MatMul, named like
`onnx::MatMul_657`) as two initializers. Read as two, the model counts
vocab x hidden parameters twice, with their gradients and optimizer states
(Llama 3.2 1B: 263 M of its 1.24 B). The dynamo exporter writes the tie as
it is: one initializer and a Transpose node.

`untie` finds such a copy by its values and writes it the dynamo way: a
Transpose of the table (an Identity where the copy is stored in the table's
own orientation, as Gemm's transB reads it). A pair is compared where both
values can be read, inline or in external data beside the file, at
`SAMPLE` positions on fixed strides: every sampled element bit-for-bit
equal, and the sample not all one value (a weightless export's zeros match
anything). Weights given as graph inputs carry no values: nothing is untied.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: Elements compared between a table and a candidate copy (on fixed strides through both)
SAMPLE = 4096
#: How the node standing for a stored copy is named: the copy's name and this
TIED = "/tied"
_HEADS = {"MatMul": 1, "Gemm": 1}  # the op and the input slot that reads a head's weight


def untie(skel: onnx.ModelProto, original: onnx.ModelProto, scopes: list[str], base_dir: str | None) -> str:
    """Rewrite in `skel` (the importer's copy; `original` holds the values) each head weight that is a stored copy
    of an embedding table as a Transpose (or Identity) of that table, inserting the nodes' scopes; a note, or ""."""
    g = skel.graph
    inits = {t.name: t for t in original.graph.initializer}
    tables = {n.input[0] for n in g.node if n.op_type == "Gather" and n.input and n.input[0] in inits
              and len(inits[n.input[0]].dims) == 2}
    readers: dict[str, int] = {}
    for i, n in enumerate(g.node):
        slot = _HEADS.get(n.op_type)
        if slot is not None and len(n.input) > slot and n.input[slot] in inits and n.input[slot] not in tables:
            readers.setdefault(n.input[slot], i)
    tied = []
    for copy, first in readers.items():
        c = inits[copy]
        for table in sorted(tables):
            t = inits[table]
            if c.data_type != t.data_type or len(c.dims) != 2:
                continue
            flipped = list(c.dims) == list(t.dims)[::-1]
            if not flipped and list(c.dims) != list(t.dims):
                continue
            if _same_values(t, c, flipped, base_dir):
                tied.append((copy, table, flipped, first))
                break
    if not tied:
        return ""
    drop = {copy for copy, *_ in tied}
    kept = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept)
    for copy, table, flipped, first in sorted(tied, key=lambda x: -x[3]):
        node = (helper.make_node("Transpose", [table], [copy], perm=[1, 0], name=copy + TIED)
                if flipped else helper.make_node("Identity", [table], [copy], name=copy + TIED))
        g.node.insert(first, node)
        scopes.insert(first, scopes[first])
    pairs = ", ".join(f"'{copy}' as {'the transpose of ' if flipped else ''}'{table}'" for copy, table, flipped, _
                      in tied)
    return (f"the exporter stored a tied weight twice (TorchScript folds the head's weight.t()): read {pairs}, one "
            "parameter, as the model trains it")


def tied_copies(graph) -> dict[str, tuple[str, bool]]:
    """In an imported `Graph`, each stored copy `untie` read as a tied weight: its table, and whether transposed."""
    return {n.outputs[0]: (n.inputs[0], n.op_type == "Transpose") for n in graph.nodes
            if n.name.endswith(TIED) and n.op_type in ("Transpose", "Identity") and n.name == n.outputs[0] + TIED}


def _same_values(table: onnx.TensorProto, copy: onnx.TensorProto, flipped: bool, base_dir: str | None) -> bool:
    a, b = _bits(table, base_dir), _bits(copy, base_dir)
    if a is None or b is None:
        return False
    rows, cols = a.shape
    k = np.arange(min(SAMPLE, a.size), dtype=np.int64)
    r, c = (k * 7919) % rows, (k * 104729) % cols  # strides coprime to any dim a model has in practice
    x = a[r, c]
    y = b[c, r] if flipped else b[r, c]
    return bool(np.array_equal(x, y)) and bool(np.any(x != x[0]))


def _bits(t: onnx.TensorProto, base_dir: str | None) -> np.ndarray | None:
    """The tensor's elements as unsigned integers of their width (read, not converted), or None where its values
    are not here (external data that is missing, or a width numpy cannot view)."""
    try:
        width = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    as_bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
    shape = tuple(int(d) for d in t.dims)
    if as_bits is None or len(shape) != 2 or 0 in shape:
        return None
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        path = os.path.join(base_dir or "", info.get("location", ""))
        offset, size = int(info.get("offset", 0) or 0), int(np.prod(shape)) * width
        if not info.get("location") or not os.path.isfile(path) or os.path.getsize(path) < offset + size:
            return None
        return np.memmap(path, dtype=as_bits, mode="r", offset=offset, shape=shape)
    if t.raw_data:
        if len(t.raw_data) != int(np.prod(shape)) * width:
            return None
        return np.frombuffer(t.raw_data, dtype=as_bits).reshape(shape)
    try:
        return numpy_helper.to_array(t).view(as_bits).reshape(shape)
    except (ValueError, TypeError):
        return None


__all__ = ["SAMPLE", "TIED", "tied_copies", "untie"]
