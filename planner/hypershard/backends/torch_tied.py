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

#: The generated source; it uses CHUNKS. Stages of different widths are refused (`pipeline_schedule`).
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
        ranks = mesh.mesh  # [pp, ...] global ranks of this program's mesh
        first, last = ranks[0].flatten().tolist(), ranks[(len(CHUNKS) - 1) % ranks.shape[0]].flatten().tolist()
        me = dist.get_rank()
        pair = next(sorted({a, b}) for a, b in zip(first, last) if me in (a, b)) if me in first + last else None
        # only the pair makes its group (other programs' ranks make theirs, or none)
        self.group = dist.new_group(pair, use_local_synchronization=True) if pair and len(pair) > 1 else None

    def _held(self):
        return [p for st in self.stages for n, p in st.submod.named_parameters()
                if _clean_name(n).split(".", 1)[-1] in self.tied]

    def step(self, *args, **kwargs):
        """The schedule's step; then each copy of a tied weight gets the sum of the copies' gradients. Clear the
        gradients between steps, as torch's schedules expect (a step rescales what the gradients already hold)."""
        out = self.schedule.step(*args, **kwargs)
        held = self._held()
        for p in held:  # a split lookup's gradient can come back whole: as its weight is split, on both ends
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        if held and all(p.grad is not None for p in held):
            local = [_local(p.grad) for p in held]
            total = sum(local[1:], local[0].clone())
            if self.group is not None:
                on = total.device
                if on.type == "cpu" and dist.get_backend(self.group) == "nccl":  # offloaded gradients
                    total = total.to(torch.device("cuda", torch.cuda.current_device()))
                dist.all_reduce(total, group=self.group)
                total = total.to(on)
            for g in local:
                g.copy_(total)
        return out


def _local(grad):
    return grad.to_local() if isinstance(grad, DTensor) else grad
'''

__all__ = ["TIED_SRC"]
