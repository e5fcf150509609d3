"""Layouts in the declaration's notation: per tensor dim a mesh axis, a list of axes, or null; plus partial axes.

The estimate names a parameter's tensor-axis layout `S<d>` (split on dim d
over "tp") or `R`; here it becomes the full placement on the named mesh, as
in JAX's PartitionSpec and MindSpore's Layout: stacked expert weights
(the weights a router feeds, `planner.graph.moe`) add "ep" on their experts dim; activations split
the batch over "dp" and the sequence over "cp" (and "tp" under sequence
parallelism, Korthikanti 2022). Axes of size 1 are left out: a null dim
means whole on every rank. ZeRO's sharding of the stored state is declared
apart (`zero`), as FSDP keeps it apart from the compute layout.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from planner.costing.activations import layer_inputs, requires_grad
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import expert_params, router_params
from planner.hypershard.roles import ParamRole
from planner.strategy import Strategy

DimSpec = str | list[str] | None


def dim_axes(spec: DimSpec) -> tuple[str, ...]:
    """The mesh axes a dim is split over, major first: None -> (), 'tp' -> ('tp',), ['cp', 'tp'] -> ('cp', 'tp')."""
    if spec is None:
        return ()
    if isinstance(spec, str):
        return (spec,)
    return tuple(spec)


def _join(axes: Sequence[str]) -> DimSpec:
    axes = list(axes)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def sizes(s: Strategy) -> dict[str, int]:
    return {"tp": s.tp, "cp": s.cp, "dp": s.dp, "pp": s.pp, "ep": s.ep}


def activation_dims(shape: Sequence[int] | None, s: Strategy, seq_len: int, *, residual: bool) -> list[DimSpec] | None:
    """Batch over dp, sequence over cp (and tp for the residual stream under --sp); None when not batch-shaped.

    Shapes are those of the imported graph (batch 1): [1, seq, ...] or the
    flattened [seq, ...] of token-wise ops (MoE routing).
    """
    if not shape:
        return None
    batch = ["dp"] if s.dp > 1 else []
    seq = (["cp"] if s.cp > 1 else []) + (["tp"] if residual and s.sp and s.tp > 1 else [])
    if len(shape) >= 2 and shape[0] == 1 and shape[1] == seq_len:
        return [_join(batch), _join(seq)] + [None] * (len(shape) - 2)
    if shape[0] == seq_len:
        return [_join(batch + seq)] + [None] * (len(shape) - 1)
    return None


def expert_tensor_dim(shape: Sequence[int], role: ParamRole, hidden: int) -> int | None:
    """The dim of a stacked expert weight [experts, ...] that expert tensor parallelism splits, as Megatron-Core's
    grouped GEMMs do: the first GEMM (it sums over the hidden size) column-wise, its output features; the second
    (it sums over the expert's features) row-wise, the dim it sums over. None for other shapes."""
    if len(shape) != 3 or role.partial_dim not in (1, 2):
        return None
    other = 3 - role.partial_dim
    return other if shape[role.partial_dim] == hidden and shape[other] != hidden else role.partial_dim


def param_layout(shape: Sequence[int], estimated: str, role: ParamRole, s: Strategy, seq_len: int,
                 hidden: int = 0, routed: bool = False) -> dict[str, Any]:
    """One parameter's entry: dims, partial (always empty for a stored parameter), op, and what the op sees;
    `routed`: a routed expert's weight (stacked [experts, ...])."""
    dims: list[list[str]] = [[] for _ in shape]
    expert = s.ep > 1 and routed and bool(dims)
    # the estimate splits a stacked expert [experts, ...] over etp x ep whatever ep is, and any expert under ep
    by_etp = expert or (routed and len(shape) == 3)
    if by_etp and s.tp > 1 and s.expert_tp == s.tp:  # experts keep the tensor axis (etp = tp)
        d = expert_tensor_dim(shape, role, hidden)
        if d is not None:
            dims[d].append("tp")
    elif estimated.startswith("S") and s.tp > 1 and not (by_etp and s.expert_tp == 1):
        d = int(estimated[1:])
        if 0 <= d < len(dims):
            dims[d].append("tp")
    if expert:
        dims[0].insert(0, "ep")
    entry: dict[str, Any] = {"dims": [_join(a) for a in dims], "partial": [], "op": role.op}
    if partial := output_partial(entry["dims"], role):
        entry["output_partial"] = partial
    if role.model_output:
        entry["model_output"] = True
    seen = activation_dims(role.input_shape, s, seq_len, residual=role.reads_residual)
    if seen is not None:
        entry["input"] = seen
    return entry


def output_partial(dims: Sequence[DimSpec], role: ParamRole) -> list[str]:
    """The axes a weight's op output is a pending sum over: tp when tp splits the dim the op sums over (a
    row-parallel linear, a vocabulary-split embedding)."""
    split = [d for d, spec in enumerate(dims) if "tp" in dim_axes(spec)]
    return ["tp"] if split and role.partial_dim is not None and split[0] == role.partial_dim else []


def partial_problems(entries: Mapping[str, Mapping[str, Any]], roles: Mapping[str, ParamRole]) -> list[str]:
    """Entries whose `output_partial` contradicts their dims (at most three): a backend runs what the file says, and
    a column split declared a pending sum has some ranks reduce what the others never send."""
    out = []
    for p, e in entries.items():
        role, have = roles.get(p), sorted(e.get("output_partial") or [])
        want = output_partial(e["dims"], role) if role is not None else have
        if have == want:
            continue
        out.append(f"{p}: with these dims its {role.op} output is {'a pending sum over tp' if want else 'whole'}, "
                   f"so output_partial must be {want}, not {have}; fix output_partial or the dims")
        if len(out) == 3:
            break
    return out


def estimated_by_param(structure: Structure, estimated: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The estimate's per-block-type `S<d>`/`R` table, per parameter name (absent: replicated)."""
    by_label = {t.label: t for t in structure.types}
    flat: dict[str, str] = {}
    for label, rows in estimated.items():
        btype = by_label.get(label)
        if btype is None:
            continue
        for inst in btype.instances:
            for rel, lay in rows.items():
                flat[f"{inst}.{rel}"] = lay
            for p in structure.block(inst).params:  # absolute names (a tied parameter read elsewhere)
                if p in rows:
                    flat[p] = rows[p]
    return flat


def param_layouts(graph: Graph, structure: Structure, estimated: Mapping[str, Mapping[str, str]],
                  roles: Mapping[str, ParamRole], s: Strategy, seq_len: int) -> dict[str, dict[str, Any]]:
    """Every parameter's entry, in graph order, from the estimate's per-block-type `S<d>`/`R` table."""
    flat = estimated_by_param(structure, estimated)
    widths = [r.input_shape[-1] for r in roles.values() if r.reads_residual and r.input_shape]
    hidden = max(sorted(set(widths)), key=widths.count) if widths else 0  # the residual stream's width
    experts, routers = expert_params(graph, structure), router_params(graph, structure)
    out: dict[str, dict[str, Any]] = {}
    for p in graph.params:
        shape = graph.tensors[p].shape or ()
        out[p] = param_layout(shape, flat.get(p, "R"), roles[p], s, seq_len, hidden, p in experts)
        if p in routers:  # a MoE router's weight: launch frameworks keep it whole (`launch.layout_notes`)
            out[p]["router"] = True
    return out


def activation_layouts(graph: Graph, structure: Structure, s: Strategy, seq_len: int) -> dict[str, Any]:
    """The model inputs and each layer stack's input (the pipeline boundary): what crosses between programs."""
    out: dict[str, Any] = {}
    for name in graph.inputs:
        t = graph.tensors.get(name)
        dims = activation_dims(t.shape if t else None, s, seq_len, residual=False)
        if dims is not None:
            out[name] = {"dims": dims, "partial": []}
    grad = requires_grad(graph)
    firsts: dict[str, Any] = {}
    for b in structure.layers():
        firsts.setdefault(b.stack, b)
    for stack, first in firsts.items():
        shapes = [graph.tensors[x].shape for x in layer_inputs(graph, set(first.nodes), grad)]
        shape = next((sh for sh in shapes if sh and len(sh) >= 2 and sh[0] == 1 and sh[1] == seq_len), None)
        dims = activation_dims(shape, s, seq_len, residual=True)
        if dims is not None:
            out[f"{stack}.*" if stack else "*"] = {"dims": dims, "partial": [], "tensor": "layer input"}
    return out
