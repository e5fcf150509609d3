"""The torch pipeline schedule over stages of different widths, as source for the generated torch module.

torch.distributed.pipelining pairs one rank per stage over a pp process
group, which stages of different tensor widths do not have: a rank of a
wide stage has no one peer in a narrow one. So the generated module runs
its own 1F1B (Narayanan 2021, section 2.2) or GPipe: activations go
forward and gradients back point to point between the ranks
`stage_peers` pairs (every rank receives exactly one copy; the boundary
is whole over tp), sends are non-blocking and receives blocking, so a
stage waits only on what it needs and the schedule cannot deadlock. It
is called like torch's schedules (`step(inputs)` on the first stage,
`step(target=..., losses=[...])` on the last) and scales gradients by
1/m as they do.
"""

from __future__ import annotations

WIDTH_SRC = r'''class WidthStage:
    """A pipeline stage on a mesh of its own width: its chunk (`submod`) and place in the pipeline."""

    def __init__(self, submod, index, num_stages):
        self.submod, self.stage_index, self.num_stages = submod, index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1


_DTYPE_CODES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _send(tensor, ranks, device, pending):
    """Non-blocking sends of a shape header and the tensor (kept alive in `pending` until the step ends)."""
    tensor = tensor.detach().contiguous()
    head = torch.zeros(8, dtype=torch.int64, device=device)
    head[0], head[1] = _DTYPE_CODES.index(tensor.dtype), tensor.dim()
    head[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    for r in ranks:
        pending.append((dist.isend(head, r), dist.isend(tensor, r), head, tensor))


def _recv(rank, device):
    head = torch.empty(8, dtype=torch.int64, device=device)
    dist.recv(head, rank)
    code, ndim = int(head[0]), int(head[1])
    out = torch.empty(head[2:2 + ndim].tolist(), dtype=_DTYPE_CODES[code], device=device)
    dist.recv(out, rank)
    return out


def _order(stage, stages, m):
    """This stage's forward ("f", i) and backward ("b", i) steps: 1F1B (Narayanan 2021) or GPipe."""
    if SCHEDULE == "gpipe":
        return [("f", i) for i in range(m)] + [("b", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    steps = [("f", i) for i in range(warm)]
    for i in range(warm, m):
        steps += [("f", i), ("b", i - warm)]
    return steps + [("b", i) for i in range(m - warm, m)]


class WidthSchedule:
    """The declared schedule over stages of different widths, called like torch's: step(inputs) on the first
    stage, step(target=..., losses=[...]) on the last, step() in between; gradients are scaled by 1/m."""

    def __init__(self, stage, n_microbatches, loss_fn, device):
        self.stage, self.m, self.loss_fn, self.device = stage, n_microbatches, loss_fn, device

    def step(self, *args, target=None, losses=None):
        st, m, rank = self.stage, self.m, dist.get_rank()
        inputs = args[0].tensor_split(m) if st.is_first else None
        targets = target.tensor_split(m) if st.is_last else None
        prev = None if st.is_first else stage_peers(rank, st.stage_index - 1)
        nxt = None if st.is_last else stage_peers(rank, st.stage_index + 1)
        saved, pending = {}, []
        for kind, i in _order(st.stage_index, st.num_stages, m):
            if kind == "f":
                x = inputs[i] if st.is_first else _recv(prev[0], self.device).requires_grad_()
                out = st.submod(x)
                if hasattr(out, "full_tensor"):  # a sequence-split boundary crosses whole
                    out = out.full_tensor()
                if st.is_last:
                    loss = self.loss_fn(out, targets[i])
                    if losses is not None:
                        losses.append(loss.detach())
                    out = loss / m
                else:
                    _send(out, nxt[1], self.device, pending)
                saved[i] = (x, out)
            else:
                x, out = saved.pop(i)
                out.backward() if st.is_last else out.backward(_recv(nxt[0], self.device))
                if not st.is_first:
                    _send(x.grad, prev[1], self.device, pending)
        for send in pending:
            send[0].wait()
            send[1].wait()
'''
