"""Read an ONNX model without its weights, check it is a graph we can order, and order it.

Weights are never loaded: `onnx.load(..., load_external_data=False)` leaves
external data on disk (a 140 GB checkpoint costs nothing), and `skeleton`
copies the model without the bytes of large inline initializers so shape
inference serialises only the structure. Small integer tensors keep their data:
Reshape, Expand, Slice and friends read their values.
"""

from __future__ import annotations

import heapq
import math
import os
from typing import Iterable

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from planner.errors import InvalidInput, InvalidModel

#: Integer tensors up to this many elements keep their data in the skeleton (shape arithmetic).
KEEP_INT_NUMEL = 4096
#: Float tensors up to this many elements keep their data too (scalars, scales).
KEEP_FLOAT_NUMEL = 16
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})
_STRIPPED = "hyperplan:stripped"


def _signature_lists(graph: onnx.GraphProto, name: str) -> bool:
    """Whether torch's exported-program signature in the graph's metadata names `name` as a parameter or buffer."""
    from planner.graph.onnx_params import declared_roles  # onnx_params reads shapes; keep this module light

    return name in declared_roles(graph)


def _invalid_text(msg, path: str) -> str:
    """Where a string field of `msg` holds bytes that are not UTF-8 (protobuf hands those over as bytes), or ''."""
    for field, value in msg.ListFields():
        many = field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED
        if field.type == FieldDescriptor.TYPE_STRING:
            for i, v in enumerate(value if many else (value,)):
                if isinstance(v, bytes):
                    return f"{path}.{field.name}{f'[{i}]' if many else ''} = {v[:40]!r}"
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for i, v in enumerate(value if many else (value,)):
                hit = _invalid_text(v, f"{path}.{field.name}{f'[{i}]' if many else ''}")
                if hit:
                    return hit
    return ""


def read_model(source: str | os.PathLike | onnx.ModelProto, built: bool = False) -> tuple[onnx.ModelProto, str]:
    """The model proto (external data not loaded) and a default name for it.

    Its strings are checked for UTF-8 (a proto parsed from bytes may hold any); with `built`, a proto set field by
    field in this process, they are not: protobuf refuses a string that is not UTF-8 when it is set, and the check
    walks every message (15 % of importing a zoo model).
    """
    if isinstance(source, onnx.ModelProto):
        model, name = source, source.graph.name or "model"
        where = "the given ModelProto"
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise InvalidModel(f"model file '{path}' does not exist; check the path (or give a zoo model name)")
        if os.path.isdir(path):
            raise InvalidModel(f"'{path}' is a directory; give the path of the .onnx file inside it")
        try:
            model = onnx.load(path, load_external_data=False)
        except (DecodeError, ValueError, RuntimeError, OSError, UnicodeDecodeError) as exc:
            reason = str(exc).split("\n")[0] or type(exc).__name__
            if isinstance(exc, DecodeError):  # protobuf does not say which field: a cut file or bad UTF-8 strings
                reason += ": a truncated file, or a name or metadata string that is not valid UTF-8"
            raise InvalidModel(
                f"'{path}' is not a readable ONNX model ({reason}); check that the file is complete and is ONNX"
            ) from None
        name = os.path.splitext(os.path.basename(path))[0]
        where = f"'{path}'"
    else:
        raise InvalidInput(f"a model must be a file path or an onnx.ModelProto, not {type(source).__name__}")
    bad = "" if built else _invalid_text(model, "model")
    if bad:
        raise InvalidModel(f"{where} has a string that is not valid UTF-8 ({bad}); ONNX names and metadata must be "
                           "UTF-8: fix or re-export the model")
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise InvalidModel(f"{where} holds no ONNX graph (no nodes); is it an empty, truncated or non-ONNX file?")
    if not any(op.domain in ("", "ai.onnx") for op in model.opset_import):
        raise InvalidModel(f"{where} declares no default-domain opset (truncated or hand-built without opset_import)")
    return model, name


def _big(t: onnx.TensorProto) -> bool:
    numel = 1
    for d in t.dims:
        numel *= d
    limit = KEEP_INT_NUMEL if t.data_type in _INT_TYPES else KEEP_FLOAT_NUMEL
    return numel > limit


def shell(name: str, data_type: int, dims) -> onnx.TensorProto:
    """An initializer of this name, type and dims with its data left out (marked external so checkers accept it)."""
    out = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
    out.data_location = onnx.TensorProto.EXTERNAL
    out.external_data.add(key="location", value=_STRIPPED)
    return out


def _shell(t: onnx.TensorProto) -> onnx.TensorProto:
    """Same name, type and dims, data left out."""
    return shell(t.name, t.data_type, t.dims)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without large initializer data and without node metadata (the graph's is kept).

    Metadata (stack traces, scope names) is read from the original; shape
    inference does not need it and it dominates the size of dynamo exports.
    """
    src = model.graph
    skel = onnx.ModelProto(
        ir_version=model.ir_version, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain, model_version=model.model_version,
    )
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    g = skel.graph
    g.name = src.name
    g.metadata_props.extend(src.metadata_props)  # small: the exporter's signature of parameters and buffers
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.node.extend(src.node)
    for n in g.node:
        if n.metadata_props:
            del n.metadata_props[:]
        if n.doc_string:
            n.doc_string = ""
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and _big(a.t) and a.t.data_location != onnx.TensorProto.EXTERNAL:
                    a.t.CopyFrom(_shell(a.t))
    g.initializer.extend(_shell(t) if (_big(t) and t.data_location != onnx.TensorProto.EXTERNAL) else t
                         for t in src.initializer)
    g.sparse_initializer.extend(src.sparse_initializer)
    return skel


#: Element types packed two to a byte: their bytes are not elements x itemsize
_SUB_BYTE = frozenset(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
                      if hasattr(onnx.TensorProto, n))


def external_span(t: onnx.TensorProto, base_dir: str | None) -> tuple[str, int, int] | None:
    """(file, offset, bytes) of an initializer's external data, or None where it cannot be read from here: no
    folder, no location (or the skeleton's stripped mark), a location outside the model's folder (absolute, or
    through `..`, as onnx's own loader refuses; a symlink inside it, as the Hugging Face cache's, is followed), a
    size unknown (negative dims, sub-byte elements) or disagreeing with its `length`, or a file too short."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if base_dir is None or not location or location == _STRIPPED or os.path.isabs(location) \
            or ".." in location.replace("\\", "/").split("/") or t.data_type in _SUB_BYTE or any(d < 0 for d in t.dims):
        return None
    path = os.path.normpath(os.path.join(base_dir, location))
    try:
        length = math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        offset = int(info.get("offset") or 0)
        if int(info.get("length") or length) != length or os.path.getsize(path) < offset + length:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path, offset, length


def inline_small_external(skel: onnx.ModelProto, base_dir: str | None) -> int:
    """Read into `skel` the data of its small initializers stored as external data (those `skeleton` would have
    kept inline: shape arithmetic, scalars), so that Reshape, Slice and friends can read their values. A file
    saved with every tensor external (`onnx.save_model(..., size_threshold=0)`) otherwise leaves an optimised
    export's `[-1]` Reshape targets unknown, and the attention GEMMs after them uncosted (`external_span` says
    which files are read). Returns how many were read."""
    done = 0
    for t in skel.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL or _big(t) or (span := external_span(t, base_dir)) is None:
            continue
        path, offset, length = span
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError:
            continue
        if len(data) == length:
            t.raw_data = data
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            done += 1
    return done


def subgraph_refs(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes (used but not defined inside it)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for n in graph.node:
        used.update(n.input)
        used.update(nested_refs(n))
        defined.update(n.output)
    used.update(o.name for o in graph.output)
    return {u for u in used if u and u not in defined}


def nested_refs(node: onnx.NodeProto) -> set[str]:
    refs: set[str] = set()
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            refs |= subgraph_refs(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for sub in a.graphs:
                refs |= subgraph_refs(sub)
    return refs


def node_label(node: onnx.NodeProto, index: int) -> str:
    return f"'{node.name}' ({node.op_type})" if node.name else f"#{index} ({node.op_type})"


def topo_order(graph: onnx.GraphProto, where: str = "the graph") -> list[int]:
    """Node indices in dependency order, stable by original index (Kahn's algorithm, a heap).

    Raises InvalidModel for a node reading a name nothing produces, and for a
    cycle. Exported graphs are nearly always sorted already: one pass checks
    that, and Kahn's algorithm runs only when it is not so.
    """
    nodes = graph.node
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer.setdefault(o, idx)
    reads: list[list[str]] = []
    in_order = True
    for idx, n in enumerate(nodes):
        mine = [i for i in n.input if i]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            mine.extend(sorted(nested_refs(n)))
        for name in mine:
            p = producer.get(name)
            if p is None:
                if name not in available:
                    if _signature_lists(graph, name):
                        raise InvalidModel(
                            f"node {node_label(n, idx)} in {where} reads the weight '{name}', which the file holds "
                            "neither as an initializer nor as a graph input (torch's ONNXProgram.save(..., "
                            "include_initializers=False)): save it with keep_initializers_as_inputs=True too, so "
                            "the weights' shapes are kept")
                    raise InvalidModel(
                        f"node {node_label(n, idx)} in {where} reads '{name}', which no node, graph input or "
                        "initializer produces; the model is incomplete or corrupt"
                    )
            elif p >= idx:
                in_order = False
        reads.append(mine)
    for o in graph.output:
        if o.name not in producer and o.name not in available:
            raise InvalidModel(f"graph output '{o.name}' of {where} is produced by no node; the model is incomplete")
    if in_order:
        return list(range(len(nodes)))
    deps = [{producer[r] for r in mine if r in producer} for mine in reads]
    users: list[list[int]] = [[] for _ in nodes]
    missing = [len(d) for d in deps]
    for idx, d in enumerate(deps):
        for p in d:
            users[p].append(idx)
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        cycle = _find_cycle(deps, set(range(len(nodes))) - set(order))
        names = " -> ".join(node_label(nodes[i], i) for i in (*cycle, cycle[0]))
        raise InvalidModel(f"{where} has a cycle through node {names}; an ONNX graph must be acyclic")
    return order


def _find_cycle(deps: list[set[int]], stuck: Iterable[int]) -> list[int]:
    """One cycle among the nodes Kahn's algorithm could not emit (walk predecessors until a repeat)."""
    stuck = set(stuck)
    start = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    cur = start
    while cur not in seen:
        seen[cur] = len(path)
        path.append(cur)
        cur = min(p for p in deps[cur] if p in stuck)
    cycle = list(reversed(path[seen[cur]:]))  # in data-flow order
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]
