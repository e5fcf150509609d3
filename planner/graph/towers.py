"""Sub-models (towers) from module paths: vision tower, audio tower, projector, language model.

Why from paths: a multimodal model's towers are the module subtrees that hold
the stacks of numbered layers (`model.vision_tower...layers`,
`model.language_model.layers`). Below the stacks' common parent, the first
component that tells stacks apart names the tower. Stacks whose names differ
only by a trailing number (ResNet's `layer1`..`layer4`) are stages of one
tower, not separate towers. Blocks outside every tower attach by data flow,
except projectors/connectors between towers, which are planned on their own.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

#: Name parts of a module that joins two towers (a multimodal projector); planned as its own sub-model.
_CONNECTOR = re.compile(r"projector|connector|merger|resampler|adapter", re.IGNORECASE)
#: The sub-model of a model with one tower or none, when no better name exists.
DEFAULT_SUBMODEL = "model"


def stack_ancestors(containers: Iterable[str]) -> frozenset[str]:
    """Every path prefix of every stack container (`model.layers` -> {`model`, `model.layers`})."""
    out: set[str] = set()
    for c in containers:
        parts = c.split(".") if c else []
        for k in range(1, len(parts) + 1):
            out.add(".".join(parts[:k]))
    return frozenset(out)


def _common_prefix(paths: Sequence[list[str]]) -> list[str]:
    first = paths[0]
    k = 0
    while k < len(first) and all(len(p) > k and p[k] == first[k] for p in paths):
        k += 1
    return first[:k]


def towers_of_stacks(containers: Sequence[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per stack container: (tower name, the tower's key paths); one tower when nothing tells them apart."""
    if not containers:
        return {}
    split = [c.split(".") if c else [] for c in containers]
    root = _common_prefix(split)
    single_name = root[0] if root else DEFAULT_SUBMODEL
    if len(containers) == 1:
        return {containers[0]: (single_name, (".".join(root),))}
    comps: dict[str, str] = {}
    for c, parts in zip(containers, split):
        comps[c] = parts[len(root)] if len(parts) > len(root) else (root[-1] if root else c)
    groups: dict[str, list[str]] = {}
    for c in containers:
        groups.setdefault(re.sub(r"_?\d+$", "", comps[c]) or comps[c], []).append(c)
    if len(groups) == 1:
        return {c: (single_name, (".".join(root),)) for c in containers}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for norm, members in sorted(groups.items()):
        distinct = sorted({comps[c] for c in members})
        name = distinct[0] if len(distinct) == 1 else norm
        keys = tuple(".".join(root + [d]) for d in distinct)
        for c in members:
            out[c] = (name, keys)
    return out


def _under(path: str, key: str) -> bool:
    return key == "" or path == key or path.startswith(key + ".")


def assign_submodels(
    names: Sequence[str],
    stacks: Sequence[str | None],
    producers: Sequence[Mapping[int, int]],
    consumers: Sequence[Mapping[int, int]],
) -> list[str]:
    """Sub-model name per block.

    `names` are block names in graph order, `stacks` their stack container
    (None for non-layer blocks); `producers[b]`/`consumers[b]` count the
    edges from/to other blocks. Layers go to their stack's tower; other
    blocks to the tower whose key path holds them, else (connectors aside)
    to the tower they most exchange data with.
    """
    containers = sorted({s for s in stacks if s is not None})
    towers = towers_of_stacks(containers)
    tower_names = {t[0] for t in towers.values()}
    if len(tower_names) <= 1:
        only = next(iter(tower_names)) if tower_names else DEFAULT_SUBMODEL
        return [only] * len(names)
    keys = sorted(((k, t[0]) for t in towers.values() for k in t[1]), key=lambda kv: -len(kv[0]))
    out: list[str | None] = [None] * len(names)
    for b, (name, stack) in enumerate(zip(names, stacks)):
        if stack is not None:
            out[b] = towers[stack][0]
            continue
        for key, tower in keys:
            if key and _under(name, key):
                out[b] = tower
                break
        else:
            last = name.split(".")[-1]
            if _CONNECTOR.search(last):
                out[b] = last
    # Data flow: a block feeding from (or, failing that, into) a placed block joins it.
    for edges, order in ((producers, range(len(names))), (consumers, range(len(names) - 1, -1, -1))):
        changed = True
        while changed:
            changed = False
            for b in order:
                if out[b] is not None:
                    continue
                votes: dict[str, int] = {}
                for other, count in sorted(edges[b].items()):
                    tower = out[other]
                    if tower is not None:
                        votes[tower] = votes.get(tower, 0) + count
                if votes:
                    out[b] = max(sorted(votes), key=lambda t: votes[t])
                    changed = True
    first = next((t for t in out if t is not None), DEFAULT_SUBMODEL)
    return [t if t is not None else first for t in out]
