"""Parameter names as glob patterns: one entry per parameter of a repeated layer, not one per instance.

A declaration keys layouts by parameter name, as the framework's modules
name them. Repeated layers share one glob (`model.layers.*.mlp.up_proj.weight`);
where layer types of one stack disagree (DeepSeek's dense and MoE layers),
the glob keeps the most common value and the others are listed by exact name.

The rule every reader follows (validate and each backend): an exact name
wins; otherwise the one glob that matches; two matching globs are an error.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any, Iterable, Mapping, Sequence

from planner.errors import InvalidInput
from planner.graph.blocks import Structure

_WILD = re.compile(r"[*?\[]")


def is_glob(pattern: str) -> bool:
    return bool(_WILD.search(pattern))


class Resolver:
    """Finds the entry of a parameter name among exact names and globs (compiled once)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.globs: list[tuple[str, re.Pattern[str]]] = []
        for p in patterns:
            if is_glob(p):
                self.globs.append((p, re.compile(fnmatch.translate(p))))
            else:
                self.exact.add(p)

    def matches(self, name: str) -> list[str]:
        """Every entry that applies to `name`: [name] when listed exactly, else the matching globs."""
        if name in self.exact:
            return [name]
        return [p for p, rx in self.globs if rx.match(name)]

    def resolve(self, name: str) -> str | None:
        """The one entry for `name`, None if none; InvalidInput if two globs claim it."""
        found = self.matches(name)
        if len(found) > 1:
            raise InvalidInput(f"parameter {name!r} matches {len(found)} layout patterns "
                               f"({', '.join(repr(f) for f in found[:3])}); list it by exact name or narrow a pattern")
        return found[0] if found else None


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def compress(values: Mapping[str, Any], structure: Structure) -> dict[str, Any]:
    """{parameter: value} -> {pattern: value}: globs over the layers of each stack, exact names elsewhere.

    Order: first appearance of each entry in `values` order (the graph's), so
    the file reads from the embedding to the head.
    """
    block_of: dict[str, tuple[str, str]] = {}  # param -> (glob, block name)
    for blk in structure.blocks:
        if not blk.is_layer:
            continue
        prefix = f"{blk.stack}.*." if blk.stack else "*."
        for p in blk.params:
            if p.startswith(blk.name + "."):
                block_of[p] = (prefix + p[len(blk.name) + 1:], blk.name)

    groups: dict[str, list[str]] = {}
    for p in values:
        if p in block_of:
            groups.setdefault(block_of[p][0], []).append(p)

    chosen: dict[str, Any] = {}  # glob -> value of the majority
    for glob, members in groups.items():
        counts: dict[str, int] = {}
        for p in members:
            k = _key(values[p])
            counts[k] = counts.get(k, 0) + 1
        best = max(counts.items(), key=lambda kv: (kv[1], -list(counts).index(kv[0])))[0]
        chosen[glob] = next(values[p] for p in members if _key(values[p]) == best)

    out: dict[str, Any] = {}
    resolver = Resolver(chosen)
    for p, v in values.items():
        glob = block_of[p][0] if p in block_of else None
        if glob is not None and resolver.matches(p) == [glob] and _key(chosen[glob]) == _key(v):
            out.setdefault(glob, chosen[glob])
        else:
            out[p] = v  # an exact name wins over any glob
    return out


def expand(entries: Mapping[str, Any], names: Sequence[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Each name's entry by the resolution rule: ({name: value}, names without an entry, entries matching nothing)."""
    resolver = Resolver(entries)
    out: dict[str, Any] = {}
    missing: list[str] = []
    used: set[str] = set()
    for name in names:
        key = resolver.resolve(name)
        if key is None:
            missing.append(name)
        else:
            out[name] = entries[key]
            used.add(key)
    unused = [k for k in entries if k not in used]
    return out, missing, unused
