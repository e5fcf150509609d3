"""Block discovery: which nodes form each layer, which layers repeat, which towers a model has.

Why: the planner ties the strategy of every instance of a repeated layer
(searching one decoder layer, not eighty), and plans each sub-model (vision
tower, language model...) on its own device group. Everything is derived
from module paths (the exporter's scopes or parameter names) and from graph
structure, never from a list of known architectures.

Steps, each O(nodes + edges):
1. a module path per node: its scope, else the path of a parameter it reads;
2. layers are `<container>.<int>` paths (`model.layers.3`, `transformer.h.0`)
   holding modules of their own (numbered leaves, as in `nn.Sequential(Linear,
   GELU, Linear)`, are parts of their parent's block);
   other nodes form named blocks one level below the stacks' common parent;
3. nodes with no path take the block they sit between (`_propagate`);
4. a structural hash per block ties identical layers into one type (`block_hash`);
5. towers (sub-models) from the stack paths (`planner.graph.towers`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from planner.graph.block_hash import shared_between_layers, skipped, structural_hash
from planner.graph.block_kinds import TypeFacts, block_kind, labels, mixer
from planner.graph.ir import Graph
from planner.graph.towers import assign_submodels, stack_ancestors

#: A node outside every module path and every block's neighbourhood.
ROOT_BLOCK = "(root)"
_IDENT = re.compile(r"^\w+$")


@dataclass(frozen=True, slots=True)
class Block:
    """One layer (`index` set) or one named non-repeated part of the model."""

    name: str
    type_id: str
    submodel: str
    index: int | None
    nodes: tuple[int, ...]
    params: tuple[str, ...]
    flops: float
    param_count: int
    stack: str = ""

    @property
    def is_layer(self) -> bool:
        return self.index is not None


@dataclass(frozen=True, slots=True)
class BlockType:
    """Blocks with the same structure; the planner gives them one strategy.

    `param_count` and `flops` are per instance (of the first one: instances
    differ at most by shared parameters such as tied embeddings).
    """

    type_id: str
    label: str
    kind: str
    submodel: str
    instances: tuple[str, ...]
    param_count: int
    flops: float

    @property
    def count(self) -> int:
        return len(self.instances)


@dataclass(frozen=True, slots=True)
class SubModel:
    """A tower (vision, audio, language model, projector) planned as one program."""

    name: str
    blocks: tuple[str, ...]
    param_count: int
    flops: float
    layers: int


@dataclass(frozen=True, slots=True)
class Structure:
    """Blocks, their types and sub-models of one graph, with the lookups the planner needs."""

    blocks: tuple[Block, ...]
    types: tuple[BlockType, ...]
    submodels: tuple[SubModel, ...]
    node_block: tuple[int, ...]
    _by_name: Mapping[str, Block] = field(default_factory=dict, repr=False, compare=False)
    _by_type: Mapping[str, BlockType] = field(default_factory=dict, repr=False, compare=False)
    _first: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({b.name: b for b in self.blocks}))
        object.__setattr__(self, "_by_type", MappingProxyType({t.type_id: t for t in self.types}))
        object.__setattr__(self, "_first", MappingProxyType({b.name: min(b.nodes, default=0) for b in self.blocks}))

    def first_node(self, name: str) -> int:
        """The first node (in graph order) of the block called `name`, 0 for a block without nodes."""
        return self._first[name]

    def block_of_node(self, i: int) -> Block | None:
        b = self.node_block[i] if 0 <= i < len(self.node_block) else -1
        return self.blocks[b] if b >= 0 else None

    def block(self, name: str) -> Block:
        """The block called `name` (KeyError if none)."""
        return self._by_name[name]

    def type(self, type_id: str) -> BlockType:
        """The block type `type_id` (KeyError if none)."""
        return self._by_type[type_id]

    def type_of(self, block_name: str) -> BlockType:
        return self._by_type[self._by_name[block_name].type_id]

    def submodel(self, name: str) -> SubModel:
        for s in self.submodels:
            if s.name == name:
                return s
        raise KeyError(name)

    def layers(self) -> tuple[Block, ...]:
        """The numbered layers, in graph order."""
        return tuple(b for b in self.blocks if b.is_layer)

    def blocks_of(self, submodel: str) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.submodel == submodel)

    def types_of(self, submodel: str) -> tuple[BlockType, ...]:
        return tuple(t for t in self.types if t.submodel == submodel)

    def repeated_types(self) -> tuple[BlockType, ...]:
        """Types with more than one instance: where tying strategies saves search."""
        return tuple(t for t in self.types if t.count > 1)


# -- 1. module paths -------------------------------------------------------------------------

def _path_of_param(name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` -> `model.layers.3.mlp.up_proj`; '' if not a module path."""
    parts = name.split(".")
    if len(parts) < 2 or not all(_IDENT.match(p) for p in parts):
        return ""
    return ".".join(parts[:-1])


def _clean_scope(scope: str) -> str:
    parts = scope.split(".") if scope else []
    return scope if parts and all(_IDENT.match(p) for p in parts) else ""


def _node_paths(graph: Graph) -> list[str]:
    """A dotted module path per node: scope first, then the first parameter it reads.

    A scope that names the parameter's module by a shorter path (the call site
    `model.embed_tokens` of `model.language_model.embed_tokens`, reached
    through a getter) gives way to the parameter's path: that is where the
    module lives.
    """
    tensors = graph.tensors
    cache: dict[str, str] = {}
    out: list[str] = []
    for node in graph.nodes:
        path = cache.get(node.scope)
        if path is None:
            path = cache.setdefault(node.scope, _clean_scope(node.scope))
        for name in node.inputs:
            t = tensors.get(name)
            if t is not None and t.is_param:
                owner = _path_of_param(name)
                if owner and (not path or _shortened(path, owner)):
                    path = owner
                    break
        out.append(path)
    return out


def _shortened(scope: str, owner: str) -> bool:
    """`model.embed_tokens` for `model.language_model.embed_tokens`: same module name, a sub-sequence of its path."""
    a, b = scope.split("."), owner.split(".")
    if len(a) >= len(b) or a[-1] != b[-1]:
        return False
    rest = iter(b)
    return all(part in rest for part in a)


def layer_of_path(path: str) -> tuple[str, int] | None:
    """(`container`, index) of the outermost numbered component: `model.layers.3.mlp` -> (`model.layers`, 3)."""
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i]), int(part)
    return None


def _layer_path(layer: tuple[str, int]) -> str:
    return f"{layer[0]}.{layer[1]}" if layer[0] else str(layer[1])


# -- 2 and 3. blocks per node ----------------------------------------------------------------

def _block_names(paths: list[str]) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """Block name per node ('' when unknown) and, per layer name, its (container, index)."""
    layer_cache: dict[str, tuple[str, int] | None] = {}
    for p in set(paths):
        layer_cache[p] = layer_of_path(p)
    deep = {lay[0] for p, lay in layer_cache.items() if lay is not None and p != _layer_path(lay)}
    for p, lay in layer_cache.items():
        if lay is not None and lay[0] not in deep:
            layer_cache[p] = None  # nn.Sequential(Linear, GELU, Linear): numbered leaves are not layers
    containers = sorted({lay[0] for lay in layer_cache.values() if lay is not None})
    ancestors = stack_ancestors(containers)
    names: dict[str, str] = {}
    layers: dict[str, tuple[str, int]] = {}
    for p in sorted(layer_cache):
        lay = layer_cache[p]
        if lay is not None:
            name = _layer_path(lay)
            layers[name] = lay
        elif p:
            parts = p.split(".")
            k = 1
            while k < len(parts) and ".".join(parts[:k]) in ancestors:
                k += 1
            name = ".".join(parts[:k])
        else:
            name = ""
        names[p] = name
    return [names[p] for p in paths], layers


def _propagate(graph: Graph, names: list[str], producer: dict[str, int]) -> list[str]:
    """Give each unnamed node the block it sits between.

    `up` is the block of its latest named producer, `down` that of its
    earliest named consumer, both inherited through chains of unnamed nodes.
    A node inside a block has up == down; a node at a boundary joins the
    block before it (so every layer owns the same boundary ops); a node with
    one side only (constants, shape ops, output tails) joins that side.
    """
    n = len(graph.nodes)
    up = list(names)
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(graph.nodes):
        best = -1
        for name in node.inputs:
            j = producer.get(name, -1)
            if j >= 0:
                consumers[j].append(i)
                if j > best and up[j]:
                    best = j
        if not up[i] and best >= 0:
            up[i] = up[best]
    down = list(names)
    for i in range(n - 1, -1, -1):
        if down[i]:
            continue
        for c in consumers[i]:  # ascending: the earliest named consumer wins
            if down[c]:
                down[i] = down[c]
                break
    return [names[i] or up[i] or down[i] or ROOT_BLOCK for i in range(n)]


# -- 5. putting it together ------------------------------------------------------------------

def _facts(graph: Graph, blocks: list[Block]) -> TypeFacts:
    first = blocks[0]
    ops = {graph.nodes[i].op_type for i in first.nodes}
    ranks = [len(graph.tensors[p].shape or ()) for p in first.params]
    return TypeFacts(names=tuple(b.name for b in blocks), stack=first.stack if first.is_layer else None,
                     kind=block_kind(ops, first.params, ranks), mixer=mixer(ops))


def discover_blocks(graph: Graph) -> Structure:
    """Find layers, tie identical ones into types and group blocks into sub-models."""
    nodes = graph.nodes
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.outputs:
            if name:
                producer[name] = i
    names, layers = _block_names(_node_paths(graph))
    names = _propagate(graph, names, producer)

    order: dict[str, int] = {}
    for name in names:
        order.setdefault(name, len(order))
    node_block = [order[name] for name in names]
    members: list[list[int]] = [[] for _ in order]
    for i, b in enumerate(node_block):
        members[b].append(i)
    block_names = list(order)

    # Each parameter belongs to the first block that reads it (tied embeddings count once).
    owned: list[list[str]] = [[] for _ in order]
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        for name in node.inputs:
            t = graph.tensors.get(name)
            if t is not None and t.is_param and name not in seen:
                seen.add(name)
                owned[node_block[i]].append(name)

    skip = [skipped(graph, node) for node in nodes]
    producers: list[dict[int, int]] = [{} for _ in order]
    consumers: list[dict[int, int]] = [{} for _ in order]
    for i, node in enumerate(nodes):
        b = node_block[i]
        for name in node.inputs:
            j = producer.get(name, -1)
            if j >= 0 and node_block[j] != b and not skip[j]:
                a = node_block[j]
                producers[b][a] = producers[b].get(a, 0) + 1
                consumers[a][b] = consumers[a].get(b, 0) + 1
    stacks = [layers[n][0] if n in layers else None for n in block_names]
    subs = assign_submodels(block_names, stacks, producers, consumers)

    shared = shared_between_layers(graph, node_block, stacks, producer, skip)
    hashes = [structural_hash(graph, [i for i in members[b] if i not in shared], producer, skip)
              for b in range(len(order))]
    hash_subs: dict[str, set[str]] = {}
    for h, s in zip(hashes, subs):
        hash_subs.setdefault(h, set()).add(s)
    type_ids = [h if len(hash_subs[h]) == 1 else f"{h}:{s}" for h, s in zip(hashes, subs)]

    blocks = tuple(
        Block(
            name=name, type_id=type_ids[b], submodel=subs[b],
            index=layers[name][1] if name in layers else None,
            nodes=tuple(members[b]), params=tuple(owned[b]),
            flops=float(sum(nodes[i].flops for i in members[b])),
            param_count=sum(graph.tensors[p].numel for p in owned[b]),
            stack=layers[name][0] if name in layers else "",
        )
        for b, name in enumerate(block_names)
    )
    grouped: dict[str, list[Block]] = {}
    for blk in blocks:
        grouped.setdefault(blk.type_id, []).append(blk)
    facts = [_facts(graph, bl) for bl in grouped.values()]
    types = tuple(
        BlockType(type_id=tid, label=label, kind=f.kind, submodel=bl[0].submodel,
                  instances=f.names, param_count=bl[0].param_count, flops=bl[0].flops)
        for (tid, bl), f, label in zip(grouped.items(), facts, labels(facts))
    )
    sub_order: dict[str, list[Block]] = {}
    for blk in blocks:
        sub_order.setdefault(blk.submodel, []).append(blk)
    submodels = tuple(
        SubModel(name=s, blocks=tuple(b.name for b in bl), param_count=sum(b.param_count for b in bl),
                 flops=float(sum(b.flops for b in bl)), layers=sum(1 for b in bl if b.is_layer))
        for s, bl in sub_order.items()
    )
    return Structure(blocks=blocks, types=types, submodels=submodels, node_block=tuple(node_block))
