"""The tensor-parallel plan of the torch exports (training's `torch`, serving's `serving_py`): torch's
parallel styles chosen per module from its weight's declared layout, as torchtitan writes its plans.

A linear split on its output features is ColwiseParallel, split on the features it sums over
(`output_partial`) RowwiseParallel; an embedding split on the vocabulary is RowwiseParallel, on the hidden
dim ColwiseParallel; under sequence parallelism norms on the residual stream are SequenceParallel and the
stream stays a DTensor split by sequence (Korthikanti et al. 2022). A weight the model holds under two names
(a head tied to its embedding) is declared once; each module using it takes the style of its own op
(`_as_used_by`), so the lookup splits the vocabulary as a RowwiseParallel embedding and the head as a
ColwiseParallel linear; a lookup split on the hidden dim makes the head a RowwiseParallel linear, whose
logits leave whole (a plain tensor, not the stream's sequence split: the loss and the pipeline read whole
logits). The styles assume torch's conventions (nn.Linear weights [out, in]); `_check` says
so in one sentence where a module breaks them. A module's own parameter split over tp that no style takes
(GPT-OSS's attention sinks, one a head) is split as declared and read as this rank's shard (`shard_own_params`).
"""

from __future__ import annotations

import inspect


def own_param(name, entry):
    """A module's own vector, not a weight or bias a parallel style splits (GPT-OSS's attention sinks, one a head)."""
    last = name.rsplit(".", 1)[-1]
    return entry.get("op") == "other" and len(entry["dims"]) == 1 and last != "weight" and not last.endswith("bias")


#: The generated source; it uses SEQUENCE_PARALLEL and `layout_of` (and `_tied_names` where given ties), and
#: `own_param` (its source appended: the export's NOT_EXPRESSED list reads the same rule).
TP_SRC = r'''
def _axes(spec):
    return () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)


def _tp_dim(entry):
    return next((d for d, spec in enumerate(entry["dims"]) if "tp" in _axes(spec)), None)


def _seq_split(entry):
    seen = entry.get("input") or []
    return len(seen) > 1 and "tp" in _axes(seen[1])


def _style(entry):
    """The torch parallel style of a module whose weight has this declared layout (None: leave it replicated)."""
    op, dim = entry["op"], _tp_dim(entry)
    stream = Shard(1) if SEQUENCE_PARALLEL else Replicate()
    arrives = Shard(1) if _seq_split(entry) else Replicate()
    if op == "linear" and dim is not None:
        if entry.get("output_partial") and entry.get("model_output"):  # the logits leave whole, as a tensor
            return RowwiseParallel(input_layouts=arrives, output_layouts=Replicate(), use_local_output=True)
        if entry.get("output_partial"):
            return RowwiseParallel(output_layouts=stream, use_local_output=not SEQUENCE_PARALLEL)
        if entry.get("model_output"):
            return ColwiseParallel(input_layouts=arrives, output_layouts=Replicate())
        return ColwiseParallel(input_layouts=arrives)
    if op == "embedding":
        if dim == 0:
            return RowwiseParallel(input_layouts=Replicate(), output_layouts=stream,
                                   use_local_output=not SEQUENCE_PARALLEL)
        if dim == 1:
            return ColwiseParallel(input_layouts=Replicate(), output_layouts=stream,
                                   use_local_output=not SEQUENCE_PARALLEL)
        if SEQUENCE_PARALLEL:
            return PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                       use_local_output=False)
    if op == "scale" and SEQUENCE_PARALLEL and _seq_split(entry):
        return SequenceParallel()
    return None


def _declared(name):
    try:
        return layout_of(name)
    except KeyError:
        return None


def _as_used_by(entry, module, head):
    """A tied weight's declared layout as the module using it under another name sees it (a head tied to its
    embedding is declared once): that module's op, and the pending sum, output and input its split gives."""
    dim = _tp_dim(entry)
    if isinstance(module, nn.Embedding):
        return dict(entry, op="embedding", output_partial=["tp"] if dim == 0 else [], model_output=False)
    if isinstance(module, nn.Linear):
        seen = ["dp", "tp" if SEQUENCE_PARALLEL else None, None]
        return dict(entry, op="linear", output_partial=["tp"] if dim == 1 else [], model_output=head, input=seen)
    return entry


def _entry(model, path, module, tied):
    """The declared layout of a module's weight, under its own name or one it is tied to (`tied`: the names of
    each weight the whole model holds twice), as that module uses it."""
    own = f"{path}.weight"
    names = next((group for group in tied if own in group), (own,))
    entry = next((e for e in map(_declared, (own, *names)) if e is not None), None)
    if entry is None:
        return layout_of(own)  # declared under no name: says which
    if len(names) == 1:
        return entry
    return _as_used_by(entry, module, getattr(model, "get_output_embeddings", lambda: None)() is module)


def _inside(path, modules):
    """Whether module `path` is one of `modules` or a submodule of one."""
    return any(path == m or path.startswith(m + ".") for m in modules)


def tp_plan(model, tied=(), whole=()):
    """Module path -> parallel style for every module with a weight: torchtitan's plan, built from the layouts
    (`whole`: paths of modules whose every weight stays whole, and the weights of their submodules)."""
    plan = {}
    for path, module in model.named_modules():
        weight = module._parameters.get("weight") if path else None
        if weight is None or _inside(path, whole):
            continue
        entry = _entry(model, path, module, tied)
        style = _style(entry)
        if style is not None:
            _check(path, module, entry)
            plan[path] = style
    return plan


def _local_view(module, args, name):
    module.__dict__[name] = module._parameters[name].to_local()  # read before the parameter: this rank's shard


def shard_own_params(model, mesh, whole=()):
    """Each module's own parameter declared split over tp (`own_param`: GPT-OSS's attention sinks, one a head)
    becomes a DTensor split as declared, and its module reads this rank's shard, a plain tensor beside the heads
    the rank computes (its gradient flows back into the DTensor); not in `whole`'s modules (MoE blocks run whole)."""
    for path, module in model.named_modules():
        if _inside(path, whole):
            continue
        for name, p in list(module._parameters.items()):
            full = f"{path}.{name}" if path else name
            entry = None if p is None or isinstance(p, DTensor) else _declared(full)
            dim = None if entry is None or not own_param(full, entry) else _tp_dim(entry)
            if dim is not None:
                split = distribute_tensor(p.detach(), mesh, [Shard(dim)])
                module._parameters[name] = nn.Parameter(split, requires_grad=p.requires_grad)
                module.register_forward_pre_hook(partial(_local_view, name=name))


def _check(path, module, entry):
    """The styles assume torch's conventions: nn.Linear weights are [out, in], nn.Embedding's [vocab, dim]."""
    dim = _tp_dim(entry)
    if entry["op"] == "linear" and dim is not None:
        want = 1 if entry.get("output_partial") else 0
        if not isinstance(module, nn.Linear) or dim != want:
            raise ValueError(f"{path} ({type(module).__name__}) is declared split on weight dim {dim}; torch's "
                             f"Colwise/RowwiseParallel need an nn.Linear split on dim {want}")
    if entry["op"] == "embedding" and dim is not None and not isinstance(module, nn.Embedding):
        raise ValueError(f"{path} ({type(module).__name__}) is declared as a split embedding but is no nn.Embedding")
'''

TP_SRC += "\n\n" + inspect.getsource(own_param)

__all__ = ["TP_SRC", "own_param"]
