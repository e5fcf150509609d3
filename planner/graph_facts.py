"""What the costing knows of a graph that no strategy changes, computed once per graph.

The planner scores hundreds of strategies of one graph; everything here
(work per node, attention cores, gradients, saved tensors, fused chains,
tying keys, and the layout problems and solutions per tensor-axis size) is
shared by all of them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from planner.activations import attention_core, layer_inputs, requires_grad, saved_tensors
from planner.fusion import fused_act_bytes
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.node_work import node_work
from planner.search.tying import tie_keys


class GraphFacts:
    """What the costing needs to know of a graph that no strategy changes: computed once, reused by every
    strategy the planner scores (work per node, attention cores, gradients, saved tensors, tying keys)."""

    def __init__(self, graph: Graph, structure: Structure) -> None:
        self.graph, self.structure = graph, structure
        self.work = node_work(graph)
        self.params = set(graph.params)
        self.core = attention_core(graph)
        self.grad = requires_grad(graph)
        self.in_layer = np.zeros(len(graph.nodes), dtype=bool)
        for b in structure.blocks:
            if b.is_layer:
                self.in_layer[list(b.nodes)] = True
        core_mask = np.zeros(len(graph.nodes), dtype=bool)
        core_mask[sorted(self.core)] = True
        self.core_in_layer = core_mask & self.in_layer
        self.node_keys, self.param_keys = tie_keys(graph, structure)
        self.layer_inputs = {b.name: layer_inputs(graph, set(b.nodes), self.grad) for b in structure.blocks if b.is_layer}
        self.skeletons: dict = {}
        self.choices: dict = {}
        #: The planner sets this: layouts solved for one micro-batch and recompute policy are reused for the
        #: others of the same tensor axis (the final plan is re-estimated with its own solve).
        self.reuse_layouts = False
        self._saved: dict[float, dict[str, list]] = {}
        self._fused: dict[tuple[bool, float], np.ndarray] = {}
        self.producer: dict[str, tuple[int, int]] = {}
        for i, n in enumerate(graph.nodes):
            for j, o in enumerate(n.outputs):
                if o:
                    self.producer[o] = (i, j)
        self.in_core_output = {o for i in self.core for o in graph.nodes[i].outputs if o}
        self._exchange: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None

    def saved(self, width: float) -> dict[str, list]:
        """Saved tensors by the block of the op that saves them."""
        if width not in self._saved:
            by_block: dict[str, list] = defaultdict(list)
            for sv in saved_tensors(self.graph, width, self.grad):
                blk = self.structure.block_of_node(sv.saver)
                if blk is not None:
                    by_block[blk.name].append(sv)
            self._saved[width] = dict(by_block)
        return self._saved[width]

    def saved_by_node(self, width: float) -> dict[int, list]:
        """Saved tensors by the node that saves them."""
        key = ("by_node", width)
        if key not in self._fused:
            out: dict[int, list] = defaultdict(list)
            for svs in self.saved(width).values():
                for sv in svs:
                    out[sv.saver].append(sv)
            self._fused[key] = dict(out)  # type: ignore[assignment]
        return self._fused[key]  # type: ignore[return-value]

    def expert_exchange(self) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Per MoE block (in block order), the tensors its expert ops read from outside them (dispatched to the
        experts) and the expert outputs the rest of the block reads (combined back)."""
        if self._exchange is None:
            graph, params = self.graph, self.params
            out = {}
            for blk in self.structure.blocks:
                experts = {i for i in blk.nodes
                           if any(".experts." in x for x in graph.nodes[i].inputs if x in params)}
                if not experts:
                    continue
                made = {o for i in experts for o in graph.nodes[i].outputs if o}
                dispatch = {x for i in experts for x in graph.nodes[i].inputs if x and x not in params and x not in made}
                combine = {x for i in blk.nodes if i not in experts for x in graph.nodes[i].inputs if x in made}
                out[blk.name] = (tuple(sorted(dispatch)), tuple(sorted(combine)))
            self._exchange = out
        return self._exchange

    def act_bytes(self, training: bool, width: float) -> np.ndarray:
        """Per-node activation bytes once chains of memory-bound ops are fused (see `planner.fusion`)."""
        key = (training, width)
        if key not in self._fused:
            stored = {sv.tensor for svs in self.saved(width).values() for sv in svs} if training else set()
            self._fused[key] = fused_act_bytes(self.graph, self.work.act_bytes, self.work.matrix, stored)
        return self._fused[key]
