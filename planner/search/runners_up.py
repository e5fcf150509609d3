"""The runners-up a plan shows: a strategy on each of the closest other meshes, one that fits where one does.

The search scores a mesh only as far as its bound lets it; a mesh it closed unscored, or scored only at a
micro-batch too large to fit, would be shown as "not searched" or "does not fit" though it runs. These pick
what to score after the search so that each shown mesh says why it lost: the best plan's policies on the
closest unscored meshes (`closest_unscored`), and smaller micro-batches of a shown strategy that does not fit
(`smaller_micro_batches`), largest first.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import replace

from planner.search import grid
from planner.search.constraints import Constraints
from planner.strategy import Strategy


def closest_unscored(schedules: Mapping[tuple, float], scored: Container[tuple], n: int) -> list[tuple]:
    """The schedule keys (cp, tp, mb, ep, etp, pp, dp, vpp) of least bound of up to `n` meshes (tp, cp, pp, dp, ep,
    etp) not in `scored`, one per mesh, closest first."""
    out: list[tuple] = []
    seen: set[tuple] = set()
    for _, key in sorted((bound, key) for key, bound in schedules.items()):
        cp, tp, _mb, ep, etp, pp, dp, _vpp = key
        mesh = (tp, cp, pp, dp, ep, etp)
        if mesh in scored or mesh in seen:
            continue
        if len(seen) == n:
            break
        seen.add(mesh)
        out.append(key)
    return out


def smaller_micro_batches(s: Strategy, global_batch: int, c: Constraints,
                          base_offload: tuple = ()) -> Iterator[Strategy]:
    """`s` at each smaller micro-batch the constraints allow, largest first (an interleaved schedule only where the
    micro-batches still come in whole rounds of its stages): first without the offload the search added to fit it
    at its own micro-batch (`base_offload`: what the user fixed), then with it."""
    for mb in sorted((d for d in grid.micro_batches(global_batch // s.dp, c) if d < s.micro_batch), reverse=True):
        if s.vpp == 1 or (global_batch // (s.dp * mb)) % s.pp == 0:
            if tuple(s.offload) != tuple(base_offload):
                yield replace(s, micro_batch=mb, offload=tuple(base_offload))
            yield replace(s, micro_batch=mb)


__all__ = ["closest_unscored", "smaller_micro_batches"]
