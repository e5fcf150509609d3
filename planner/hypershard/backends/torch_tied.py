"""Tied weights across pipeline stages in the torch export: an output head sharing the input embedding.

A model that ties its head to its embedding (GPT-2, Gemma, small Llama and Qwen models) uses one weight in
its first pipeline chunk (the lookup) and in its last (the head). Cut into chunks, each stage holds its own
copy and gets only its own use's gradient, and torch's pipelining schedules do not join them: left alone
the two copies would be updated apart and the model would train on wrong gradients. Megatron-LM sums the
two gradients over an "embedding group" of the first and last pipeline ranks after the backward pass
(`_allreduce_word_embedding_grads` in megatron/core/distributed/finalize_model_grads.py); the generated file
does the same after each schedule step, over a process group per pair of first- and last-stage ranks at the
same data, context and tensor coordinates (both copies are split the same way on those axes, so their local
shards hold the same elements). Both copies then take the same step and stay equal.

Within one stage the tie survives tensor parallelism the same way: torch's styles give each module's weight
a DTensor parameter of its own, so the file shares the first one again (`_retie`), and a head that uses the
embedding's weight under another name is given the style of its own op (`_as_used_by` in the torch export).
"""

from __future__ import annotations

#: The generated source; it uses CHUNKS, `clean_name` is its own. Stages of different widths are refused.
TIED_SRC = r'''
def _tied_names(model):
    """The names of each weight the model holds under more than one (a head tied to its embedding)."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(n) for n in names.values() if len(n) > 1]


def _retie(model, tied):
    """Share each tied weight again after the styles have made each use's DTensor its own parameter: every name
    takes the first one's (both uses split the same way, the embedding's lookup and the head's vocabulary)."""
    held = dict(model.named_parameters(remove_duplicate=False))
    for names in tied:
        here = [n for n in names if n in held]  # a pipeline chunk may hold one use only
        for name in here[1:]:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, held[here[0]])


def _clean_name(name):
    return name.replace("._checkpoint_wrapped_module", "").replace("._fsdp_wrapped_module", "")


class TiedSchedule:
    """A pipeline schedule whose step ends by summing the gradients of the tied weights' copies: the first and
    last stages' ranks of each (data, context, tensor) coordinate meet in a group of their own."""

    def __init__(self, schedule, stages, tied, mesh):
        self.schedule, self.stages, self.tied = schedule, stages, {n for names in tied for n in names}
        ranks = mesh.mesh  # [pp, ...] global ranks, this program's mesh
        first, last = ranks[0].flatten().tolist(), ranks[(len(CHUNKS) - 1) % ranks.shape[0]].flatten().tolist()
        self.group = None
        for a, b in zip(first, last):  # every rank makes every group, in the same order
            group = dist.new_group(sorted({a, b})) if a != b else None
            if dist.get_rank() in (a, b):
                self.group = group

    def step(self, *args, **kwargs):
        out = self.schedule.step(*args, **kwargs)
        held = [p for st in self.stages for n, p in st.submod.named_parameters()
                if p.grad is not None and _clean_name(n).split(".", 1)[-1] in self.tied]
        for p in held:  # a split lookup's gradient can come back whole: as its weight is split, on both ends
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        if held:
            local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in held]
            total = torch.stack(local).sum(0) if len(local) > 1 else local[0].clone()
            if self.group is not None:
                dist.all_reduce(total, group=self.group)
            for g in local:
                g.copy_(total)
        return out
'''

__all__ = ["TIED_SRC"]
