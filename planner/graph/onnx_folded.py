"""Weights an exporter stored as folded copies, read back as the parameters the model trains.

Torch's exporters fold the transpose a module applies to its weight into a
constant of its own, under a new name and in the other orientation:

- A tied head. A language model whose output head shares the token
  embedding's weight (GPT-2, Qwen2, Llama 3.2, Gemma: `tie_word_embeddings`)
  computes its logits with `weight.t()`; `torch.onnx.export(...,
  dynamo=False)` stores that transpose beside the table (read by a Gather) as
  a second initializer (read by a MatMul, named like `onnx::MatMul_657`).
  Read as two, the model counts vocab x hidden parameters twice, with their
  gradients and optimizer states (Llama 3.2 1B: 263 M of its 1.24 B).
  `untie` finds the copy by its values (below).
- A linear layer. `nn.Linear` keeps its weight [out, in] and multiplies by
  its transpose; TorchScript stores the transpose (or, without the weights,
  `export_params=False`, declares it as a graph input) as `onnx::MatMul_604`, the
  dynamo exporter's optimiser as `val_152`, [in, out], under no module path.
  Read as stored, the weight had a name no framework's model has and the
  orientation of GPT-2's Conv1D, so a tensor-parallel export to torch was
  refused and jax's and MindSpore's modules named nothing a model holds.
  `unfold` names each such weight after the module whose MatMul reads it
  (its node's scope: `model.layers.0.self_attn.q_proj` gives
  `model.layers.0.self_attn.q_proj.weight`), where the exporter's signature
  lists that parameter and the file holds no tensor of that name (TorchScript
  writes no signature: the name must then be free). Only a tensor named as
  those exporters name what they fold (`FOLDED_NAME`) is renamed.

- A weight read as it is. The dynamo exporter's optimiser also renames
  tensors it did not change: a MoE layer's stacked expert weights
  ([experts, out, in], indexed by expert: GatherND) come out as `val_353`.
  `unrename` gives such a tensor back its parameter's name where the reading
  node's torch.export record (`pkg.torch.onnx.fx_node`) takes that
  parameter's placeholder as the tensor it gathers from; one tensor that
  stands for several such parameters, equal at export (GPT-OSS's zero expert
  biases), gives each its own copy.

- A parameter read only through a view. The optimiser folds the view into
  a constant named after it (GPT-OSS's attention sinks, [heads], stored as
  `view_3`, [1, heads, 1, 1], read by an Expand); the parameter is in no
  tensor of the file and had gone uncounted. `unview` reads such a constant
  as the one parameter of its readers' module scope that the signature lists
  and no tensor holds (one of each in that scope, or nothing is read).

Each is written as the dynamo exporter writes it unoptimised: the
parameter, and a Transpose node (an Identity where the file's tensor is in
the parameter's own orientation: a renamed one, or a tied copy as Gemm's
transB reads it; a Reshape for a folded view, the parameter's dims the
view's but its unit ones, an assumption its note states) whose output keeps
the file's name, so the ONNX export can annotate the file's tensor
(`stored_copies`). A tied pair is compared where both values can be read,
inline or in external data beside the file, at `SAMPLE` positions on fixed
strides: every sampled element bit-for-bit equal, and the sample not all
one value (a weightless export's zeros match anything). Weights given as
graph inputs carry no values: nothing is untied.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from planner.graph.onnx_read import external_span, shell

#: Elements compared between a table and a candidate copy (on fixed strides through both)
SAMPLE = 4096
#: The names torch's exporters give a constant they folded: TorchScript's `onnx::MatMul_604`, the dynamo
#: optimiser's `val_152` (a tensor named otherwise is the file's own and keeps its name)
FOLDED_NAME = re.compile(r"onnx::\w+_\d+|val_\d+")
#: How the node standing for a stored copy is named: the copy's name and one of these
TIED, FOLDED = "/tied", "/folded"
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


#: The node metadata where the dynamo exporter records the torch.export node an ONNX node lowers
FX_NODE_KEY = "pkg.torch.onnx.fx_node"
#: Its first argument, where that is a placeholder: "call_function[target=torch.ops.aten.index.Tensor](args =
#: (%p_model_layers_0_mlp_experts_gate_up_proj, [%view_8])...". Not where an index skips the leading dim
#: ("[None, %idx]"): the lowering may then transpose the tensor before it gathers, and the copy be transposed.
_FX_FIRST_ARG = re.compile(r"\(args = \(%(\w+)(?:\)|, (?!\[None))")
#: Ops that read their first input as data, element for element as stored (gathers and slices by expert)
_AS_STORED = frozenset({"Gather", "GatherND", "GatherElements", "Slice"})


def unrename(skel: onnx.ModelProto, original: onnx.ModelProto, scopes: list[str], placeholders: dict[str, str]) -> str:
    """Give back its parameter's name to each tensor the dynamo exporter's optimiser renamed unchanged (module
    docstring); `placeholders`: the signature's placeholders (`onnx_params.declared_placeholders`). Run first,
    while `skel`'s nodes are `original`'s one for one. A note, or ""."""
    g = skel.graph
    stored = {t.name: (t.data_type, list(t.dims)) for t in g.initializer}
    names = _tensor_names(g)
    found: dict[str, dict[int, str]] = {}  # file name -> its gathering readers -> the parameter each gathers from
    for i, (n, record) in enumerate(zip(g.node, original.graph.node)):
        w = n.input[0] if n.op_type in _AS_STORED and n.input else ""
        if w not in stored or not FOLDED_NAME.fullmatch(w):
            continue
        fx = next((p.value for p in record.metadata_props if p.key == FX_NODE_KEY), "")
        arg = _FX_FIRST_ARG.search(fx)
        found.setdefault(w, {})[i] = placeholders.get(arg.group(1), "") if arg else ""
    claimed = [t for readers in found.values() for t in set(readers.values())]
    renamed = {w: readers for w, readers in found.items()
               if all(t and t not in names and claimed.count(t) == 1 for t in readers.values())}
    if not renamed:
        return ""
    shared = {w for w, readers in renamed.items() if len(set(readers.values())) > 1}
    for w in sorted(shared):  # equal values stored once for several parameters (zeros): a copy each
        for t in sorted(set(renamed[w].values())):
            g.initializer.append(shell(t, *stored[w]))
        for i, t in renamed[w].items():
            g.node[i].input[0] = t
    single = {w: next(iter(r.values())) for w, r in renamed.items() if w not in shared}
    for t in g.initializer:
        t.name = single.get(t.name, t.name)
    for w, target in sorted(single.items(), key=lambda x: -min(renamed[x[0]])):
        first = min(renamed[w])
        g.node.insert(first, helper.make_node("Identity", [target], [w], name=w + FOLDED))
        scopes.insert(first, scopes[first])
    some = sorted((w, t) for w, r in renamed.items() for t in sorted(set(r.values())))
    return (f"the exporter renamed {len(some)} weights it reads as stored ("
            + ", ".join(f"'{w}' is {t}" for w, t in some[:2]) + (", ..." if len(some) > 2 else "")
            + (f"; {len(shared)} of its tensors stood for several, equal at export" if shared else "")
            + "): read under the parameters' names")


def unfold(skel: onnx.ModelProto, scopes: list[str], roles: dict[str, str]) -> str:
    """Rewrite in `skel` each linear weight the exporter folded under a new name ([in, out], read by a MatMul) as
    its module's `.weight` ([out, in]) and a Transpose (module docstring); `roles`: the exporter's signature
    (`onnx_params.declared_roles`, empty without one). A note, or ""."""
    g = skel.graph
    inits = {t.name: t for t in g.initializer}
    bare = {vi.name: vi for vi in g.input if vi.name not in inits and len(vi.type.tensor_type.shape.dim) == 2}
    names = _tensor_names(g)
    found: dict[str, tuple[str, int]] = {}  # folded name -> (the module's weight, its first reader)
    skip: set[str] = set()
    for i, n in enumerate(g.node):
        slot = _HEADS.get(n.op_type)
        w = n.input[slot] if slot is not None and len(n.input) > slot else ""
        if not FOLDED_NAME.fullmatch(w) or not (w in bare or (w in inits and len(inits[w].dims) == 2)) or any(
                a.name == "transB" and a.i for a in n.attribute):
            continue
        target = f"{scopes[i]}.weight" if scopes[i] else ""
        free = roles.get(target) == "PARAMETER" if roles else bool(target)
        if not target or not free or target in names or (w in found and found[w][0] != target):
            skip.add(w)
        found.setdefault(w, (target, i))
    targets = [t for w, (t, _) in found.items() if w not in skip]
    renamed = {w: (t, i) for w, (t, i) in found.items() if w not in skip and targets.count(t) == 1}
    if not renamed:
        return ""
    kept = [shell(renamed[t.name][0], t.data_type, list(t.dims)[::-1]) if t.name in renamed else t
            for t in g.initializer]
    del g.initializer[:]
    g.initializer.extend(kept)
    for w in sorted(set(renamed) & set(bare)):  # a weight given as a graph input (export_params=False): its entry
        vi = bare[w]
        vi.name = renamed[w][0]
        dims = vi.type.tensor_type.shape.dim
        flipped = [onnx.TensorShapeProto.Dimension() for _ in dims]
        for new, old in zip(flipped, reversed(list(dims))):
            new.CopyFrom(old)
        del dims[:]
        dims.extend(flipped)
    for w, (target, first) in sorted(renamed.items(), key=lambda x: -x[1][1]):
        g.node.insert(first, helper.make_node("Transpose", [target], [w], perm=[1, 0], name=w + FOLDED))
        scopes.insert(first, scopes[first])
    some = sorted(renamed.items(), key=lambda x: x[1][1])[:2]
    return (f"the exporter folded {len(renamed)} linear weights' transposes into tensors of their own ("
            + ", ".join(f"'{w}' is {t}" for w, (t, _) in some) + (", ..." if len(renamed) > 2 else "")
            + "): read as the modules' weights, [out, in] as torch holds them")


#: Ops that read a module's own elementwise parameter, and by input slot which one it is (None: any slot)
_SCALES = {"Mul": (None, ".weight"), "Add": (None, ".bias"), "LayerNormalization": (1, ".weight"),
           "SimplifiedLayerNormalization": (1, ".weight"), "RMSNormalization": (1, ".weight")}
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def unshare(skel: onnx.ModelProto, scopes: list[str], roles: dict[str, str]) -> str:
    """Give each module its own copy of a vector parameter the exporter stored once for several modules: both
    exporters keep one initializer for equal constants, so a freshly initialised model's norm weights (all ones)
    and biases (all zeros) come out as one tensor read by every layer's norm, its parameter count short and its
    layers no longer alike. A vector read elementwise (`_SCALES`) from two or more module scopes becomes, for each
    reader, `{scope}.weight` (or `.bias`), where the exporter's signature lists that parameter (without one, where
    the name is free); a note, or ""."""
    g = skel.graph
    inits = {t.name: t for t in g.initializer}
    names = _tensor_names(g)
    readers: dict[str, dict[int, str]] = {}
    # TorchScript hands the one tensor to the other modules through Identity nodes of no scope
    alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input and n.input[0] in inits}
    for i, n in enumerate(g.node):
        slot, suffix = _SCALES.get(n.op_type, (-1, ""))
        for k, x in enumerate(n.input):
            x = alias.get(x, x)
            t = inits.get(x)
            if t is not None and (slot is None or k == slot) and len(t.dims) == 1 and t.dims[0] > 1 \
                    and t.data_type in _FLOATS and scopes[i]:
                readers.setdefault(x, {})[i] = scopes[i] + suffix
    made, dropped = [], set()
    for w, targets in readers.items():
        new = {i: t for i, t in targets.items() if t != w}
        wanted = set(new.values())
        if len(set(targets.values())) < 2 or not all(
                (roles.get(t) == "PARAMETER") if roles else (t not in names or alias.get(t) == w) for t in wanted):
            continue
        for t in sorted(wanted):
            g.initializer.append(shell(t, inits[w].data_type, inits[w].dims))
            names.add(t)
        for i, t in new.items():
            node = g.node[i]
            node.input[:] = [t if alias.get(x, x) == w else x for x in node.input]
        made.append((w, len(targets)))
        dropped.update(t for t in wanted if alias.get(t) == w)  # an Identity TorchScript named as the parameter
    for k in reversed(range(len(g.node))):
        if g.node[k].op_type == "Identity" and g.node[k].output[0] in dropped:
            del g.node[k]
            del scopes[k]
    if not made:
        return ""
    w, n = made[0]
    return (f"the exporter stored equal parameters once ('{w}' for {n} modules' norms"
            + (f", and {len(made) - 1} more" if len(made) > 1 else "") + "): read as each module's own, as the "
            "model trains them")


#: How torch.export names a view's output (`view_3`, `unsqueeze_12`): a folded view keeps that name in the file
_VIEW_NAME = re.compile(r"(?:view|_unsafe_view|reshape|unsqueeze|squeeze|expand|permute|t|transpose)_\d+")


def unview(skel: onnx.ModelProto, scopes: list[str], placeholders: dict[str, str]) -> str:
    """Read each constant the dynamo exporter's optimiser folded from a view of a parameter as that parameter
    (module docstring); `placeholders`: the signature's (`onnx_params.declared_placeholders`). Run after the other
    readings, so that a parameter they restored is not missing. A note, or ""."""
    g = skel.graph
    names = _tensor_names(g)
    missing: dict[str, list[str]] = {}  # module scope -> the parameters of it the signature lists and no tensor holds
    for target in sorted(set(placeholders.values()) - names):
        missing.setdefault(target.rpartition(".")[0], []).append(target)
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(g.node):
        for x in dict.fromkeys(n.input):
            if x in inits and _VIEW_NAME.fullmatch(x) and inits[x].data_type in _FLOATS:
                readers.setdefault(x, []).append(i)
    folded: dict[str, list[str]] = {}  # module scope -> the folded views its nodes alone read
    for w, idx in readers.items():
        if len({scopes[i] for i in idx}) == 1:
            folded.setdefault(scopes[idx[0]], []).append(w)
    found = {ws[0]: missing[sc][0] for sc, ws in folded.items() if len(ws) == 1 and len(missing.get(sc, ())) == 1}
    if not found:
        return ""
    for w, target in sorted(found.items(), key=lambda x: -readers[x[0]][0]):
        t, first = inits[w], readers[w][0]
        g.initializer.remove(t)
        g.initializer.append(shell(target, t.data_type, [d for d in t.dims if d != 1] or [1]))
        g.initializer.append(numpy_helper.from_array(np.array(list(t.dims), dtype=np.int64), w + FOLDED))
        g.node.insert(first, helper.make_node("Reshape", [target, w + FOLDED], [w], name=w + FOLDED))
        scopes.insert(first, scopes[first])
    some = sorted(found.items())
    return (f"the exporter folded {len(some)} parameters read through a view into constants ("
            + ", ".join(f"'{w}' is {t}" for w, t in some[:2]) + (", ..." if len(some) > 2 else "")
            + "): read as the parameters, each of the view's dims but its unit ones (ASSUMPTION: torch's shape)")


def _tensor_names(g: onnx.GraphProto) -> set[str]:
    """Every tensor name the graph uses: node inputs and outputs, initializers, graph inputs."""
    return ({x for n in g.node for x in (*n.input, *n.output)} | {t.name for t in g.initializer}
            | {v.name for v in g.input})


def stored_copies(graph) -> dict[str, tuple[str, str]]:
    """In an imported `Graph`, each file tensor `untie`, `unfold`, `unrename` or `unview` read as a parameter: that
    parameter, and how the file holds it: "Identity" (as it is), "Transpose" or "Reshape" (with unit dims)."""
    return {n.outputs[0]: (n.inputs[0], n.op_type) for n in graph.nodes
            if n.op_type in ("Transpose", "Identity", "Reshape") and n.name in (n.outputs[0] + TIED,
                                                                             n.outputs[0] + FOLDED)}


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
        if (span := external_span(t, base_dir)) is None:
            return None
        return np.memmap(span[0], dtype=as_bits, mode="r", offset=span[1], shape=shape)
    if t.raw_data:
        if len(t.raw_data) != int(np.prod(shape)) * width:
            return None
        return np.frombuffer(t.raw_data, dtype=as_bits).reshape(shape)
    try:
        return numpy_helper.to_array(t).view(as_bits).reshape(shape)
    except (ValueError, TypeError):
        return None


__all__ = ["FOLDED", "FOLDED_NAME", "SAMPLE", "TIED", "stored_copies", "unfold", "unrename", "unshare", "untie",
           "unview"]
