"""What the costing knows of a graph that no strategy changes, computed once per graph.

The planner scores hundreds of strategies of one graph; everything here
(work per node, attention cores, gradients, saved tensors, fused chains,
tying keys, and the layout problems and solutions per tensor-axis size) is
shared by all of them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.costing.activations import (
    attention_core, layer_inputs, loss_inputs, requires_grad, saved_tensors, view_roots,
)
from planner.costing.attention import AttentionRegion, attention_regions, kept_fraction, mask_builders
from planner.costing.fusion import absorbed_nodes, folded_permutes, fused_act_bytes, recomputed_in_fused_backward
from planner.costing.rotary import VIEWS as ROPE_VIEWS
from planner.costing.rotary import scaled_rotary_nodes
from planner.costing.graph_capture import captured_nodes
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import MoeFacts, moe_blocks, routed_region, token_wide_params
from planner.graph.mtp import mtp_depths
from planner.graph.walk import index_graph, is_weight_matmul
from planner.costing.node_work import node_work
from planner.search.tying import tie_keys


def sibling_gemms(graph: Graph, index, candidates: np.ndarray) -> dict[int, tuple[int, ...]]:
    """Groups of two or more of the `candidates` (weight GEMMs) that read the same single activation and
    whose results meet again before any other weight GEMM, each node mapped to its group in graph order.

    Megatron-Core builds such siblings as one layer: linear_qkv projects query, key and value at once (they
    meet in the attention core), linear_fc1 the gate and up halves of a gated MLP (they meet in its
    product), where an exported graph shows a GEMM per weight. Projections of one input whose results go
    their own ways through further projections, as MLA's query and key-value down-projections, stay apart
    (Megatron-Core fuses those only with its opt-in mla_down_proj_fusion, default off)."""
    by_input: dict[str, list[int]] = defaultdict(list)
    for i in map(int, np.flatnonzero(candidates)):
        acts = [x for x in graph.nodes[i].inputs if x and not index.is_weight(x)]
        if len(acts) == 1:
            by_input[acts[0]].append(i)
    stop = frozenset(int(j) for j in np.flatnonzero(candidates))

    def reach(i: int) -> set[int]:
        """Nodes that use node i's result before another weight GEMM does."""
        seen: set[int] = set()
        todo = [i]
        while todo:
            for o in graph.nodes[todo.pop()].outputs:
                for j in index.consumers.get(o, ()):
                    if j not in seen and j not in stop:
                        seen.add(j)
                        todo.append(j)
        return seen

    out: dict[int, tuple[int, ...]] = {}
    for members in by_input.values():
        if len(members) > 1 and set.intersection(*map(reach, members)):
            out.update({i: tuple(members) for i in members})
    return out


def _scalar_clamp(graph: Graph, node, producer: dict[str, tuple[int, int]]) -> bool:
    """Whether `node` clamps one half of a gated activation's input between scalar bounds: a Clip, or a Min or Max
    against a scalar, of a Slice or Split's output (not a Relu6 or hardtanh lowered to a Clip)."""
    bounds = [x for x in node.inputs[1:] if x]
    source = producer.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
    return (node.op_type in ("Clip", "Min", "Max") and bool(bounds)
            and all(x in graph.tensors and graph.tensors[x].numel == 1 for x in bounds)
            and source is not None and graph.nodes[source[0]].op_type in ("Slice", "Split"))


class GraphFacts:
    """What the costing needs to know of a graph that no strategy changes: computed once, reused by every
    strategy the planner scores (work per node, attention cores, gradients, saved tensors, tying keys)."""

    def __init__(self, graph: Graph, structure: Structure) -> None:
        self.graph, self.structure = graph, structure
        self.index = index_graph(graph)
        self.work = node_work(graph, self.index.weight_of)
        self.params = set(graph.params)
        self.core = attention_core(graph, self.index)
        self.grad = requires_grad(graph)
        #: per node, whether a gradient flows back through it (an output carries one): the ops with a backward
        self.carries_grad = np.array([any(o in self.grad for o in n.outputs if o) for n in graph.nodes], dtype=bool)
        self.in_layer = np.zeros(len(graph.nodes), dtype=bool)
        for b in structure.blocks:
            if b.is_layer:
                self.in_layer[list(b.nodes)] = True
        core_mask = np.zeros(len(graph.nodes), dtype=bool)
        core_mask[sorted(self.core)] = True
        self.core_in_layer = core_mask & self.in_layer
        self.layer_inputs = {b.name: layer_inputs(graph, set(b.nodes), self.grad) for b in structure.blocks if b.is_layer}
        self.skeletons: dict = {}
        self.choices: dict = {}
        #: Priced layout programs per tensor-axis costing, and under each of their choices the vars' and blocks'
        #: seconds and the blocks' weights (`stage_costs`): strategies that differ only where the program does
        #: not look share them.
        self.priced: dict = {}
        self.var_seconds: dict = {}
        self.derived: dict = {}  # structural facts other modules find once per graph, by their own keys
        #: The planner sets this: layouts solved for one micro-batch and recompute policy are reused for the
        #: others of the same tensor axis (the final plan is re-estimated with its own solve).
        self.reuse_layouts = False
        self._saved: dict[tuple[float, bool, bool], dict[str, list]] = {}
        self._fused: dict[tuple, np.ndarray] = {}
        self.producer: dict[str, tuple[int, int]] = {}
        for i, n in enumerate(graph.nodes):
            for j, o in enumerate(n.outputs):
                if o:
                    self.producer[o] = (i, j)
        self.in_core_output = {o for i in self.core for o in graph.nodes[i].outputs if o}
        #: per node, part of a rotary embedding applied with scaled tables (YaRN's attention factor), which a stack
        #: may run unfused (`planner.costing.rotary`, `Execution.scaled_rope_unfused`)
        self.scaled_rope = scaled_rotary_nodes(graph, self.index)
        #: ... of which the slices: views when the stack runs it eagerly (no kernel, no bytes)
        self.scaled_rope_view = self.scaled_rope & np.array([n.op_type in ROPE_VIEWS for n in graph.nodes], dtype=bool)
        self.roots = view_roots(graph)
        #: the roots saved tensors are named by (`activations.saved_tensors` at the step's width): float casts too
        self.saved_roots = view_roots(graph, casts=True)
        #: per node, elements (at the imported batch) of the outputs a training loss reads from it (the logits),
        #: charged to the op that computes them (through views such as an Identity)
        self.loss_numel = np.zeros(len(graph.nodes))
        for name, producer in loss_inputs(graph, self.grad):
            root = self.roots.get(name, name)
            self.loss_numel[self.producer[root][0] if root in self.producer else producer] += graph.tensors[name].numel
        # fused (flash) attention: one region per attention core, and the nodes of all of them
        self.regions: tuple[AttentionRegion, ...] = tuple(attention_regions(graph, self.index))
        self.region_of: dict[int, AttentionRegion] = {i: r for r in self.regions for i in r.nodes}
        self.in_region = np.zeros(len(graph.nodes), dtype=bool)
        self.in_region[sorted(self.region_of)] = True
        self.flash_core = self.in_region & self.in_layer
        # tied instances are timed as their first: layers whose cores take different masks are tied apart
        self.node_keys, self.param_keys = tie_keys(
            graph, structure, {r.anchor: (r.causal, r.window, r.q_len, r.kv_len) for r in self.regions})
        #: ops that only build the cores' masks, which a flash kernel does not run (`attention.mask_builders`)
        self.mask_built = np.zeros(len(graph.nodes), dtype=bool)
        self.mask_built[sorted(mask_builders(graph, self.index, self.regions))] = True
        self.lse_outputs = {f"{graph.nodes[r.anchor].name or r.anchor}::lse" for r in self.regions}
        self._absorbed: dict[bool, np.ndarray] = {}
        self._captured: dict[tuple[str, ...], np.ndarray] = {}
        # mixture of experts, found from each block's router (planner.graph.moe), not from parameter names
        self.moe: dict[str, MoeFacts] = moe_blocks(graph, self.index, structure)
        self.expert_params: frozenset[str] = frozenset(p for f in self.moe.values() for p in f.params)
        #: per MoE block, the nodes that run on routed tokens (costed by the expert-parallel model)
        self.routed: dict[str, frozenset[int]] = {
            b: routed_region(graph, self.index, frozenset(structure.block(b).nodes), f) for b, f in self.moe.items()}
        #: the routed nodes by tied position (`node_keys`), each position timed once (`attribution.add_routed`)
        self.routed_positions = routed_positions(self.routed, self.node_keys)
        self.in_routed = np.zeros(len(graph.nodes), dtype=bool)
        for nodes in self.routed.values():
            self.in_routed[sorted(nodes)] = True
        #: per node on routed tokens, its layer's routed expert count (0 elsewhere)
        self.routed_experts = np.zeros(len(graph.nodes), dtype=np.int64)
        for b, nodes in self.routed.items():
            self.routed_experts[sorted(nodes)] = self.moe[b].experts
        #: per node on routed tokens, whether it adds the experts' output bias: the last add in the layer of a
        #: weight of its experts holding a token's width per expert (E x hidden; gpt-oss's down_proj_bias; an up
        #: projection as wide comes before it)
        self.expert_out_bias = np.zeros(len(graph.nodes), dtype=bool)
        for b, nodes in self.routed.items():
            widths = token_wide_params(graph, self.moe[b])
            adds = [i for i in nodes if graph.nodes[i].op_type == "Add" and any(
                self.index.weight_of.get(x, frozenset()) & widths for x in graph.nodes[i].inputs if x)]
            if adds:
                self.expert_out_bias[max(adds)] = True
        #: per node on routed tokens, whether it clamps its input between scalar bounds (gpt-oss's clamped gated
        #: activation: a Min on the gate half, a Clip on the linear half)
        self.glu_clamp = np.zeros(len(graph.nodes), dtype=bool)
        for i in np.flatnonzero(self.in_routed):
            self.glu_clamp[i] = _scalar_clamp(graph, graph.nodes[i], self.producer)
        self.weight_matmul = np.array([is_weight_matmul(graph, self.index, i) for i in range(len(graph.nodes))],
                                      dtype=bool)
        self.router_params = router_params = frozenset(p for f in self.moe.values() for p in f.router_params)
        routers = [i for i in np.flatnonzero(self.weight_matmul)
                   if self.index.weight_params(graph.nodes[i].inputs) & router_params] if router_params else []
        #: the projections FP8 training runs in FP8: weight GEMMs of the layers (not the embedding, the output
        #: head or a router, which Transformer Engine and torchao's float8 leave in 16 bits)
        self.router_node = np.zeros(len(graph.nodes), dtype=bool)
        self.router_node[list(routers)] = True
        self.fp8_gemm = self.weight_matmul & self.in_layer & ~self.router_node
        self.fp8_weights: frozenset[str] = frozenset(
            p for i in np.flatnonzero(self.fp8_gemm) for p in self.index.weight_params(graph.nodes[i].inputs))
        self.kept_cache: dict = {}  # recompute.kept_tensors per (block, policy, stack choices, width)
        #: ops that only re-lay out or select weights (a transposed weight, the routed experts' stack): the GEMM
        #: reads the stored weight in that layout, so they cost nothing
        self.weight_view = np.array([bool(n.outputs) and all(not o or o in self.index.weight_of for o in n.outputs)
                                     and not self.weight_matmul[i] for i, n in enumerate(graph.nodes)], dtype=bool)

        #: Transposes a fusing stack folds into their readers' strides (`planner.costing.fusion.folded_permutes`)
        self.folded_permute = folded_permutes(graph)
        #: weight GEMMs sharing their one activation input (a layer's query, key and value projections, a gated
        #: MLP's gate and up): node -> its group in graph order, which `Execution.fuse_sibling_gemms` runs as one
        self.siblings = sibling_gemms(graph, self.index, self.weight_matmul & ~self.router_node)

    def model_flops_per_sample(self) -> float:
        """Forward FLOPs one sample needs: every op's, attention's over the (query, key) pairs its mask keeps
        (causal: s(s+1)/2 of s^2, a sliding window its band), the FLOPs a step does whatever kernel runs it,
        so that MFU cannot pass 100 % on long causal sequences (the graph writes every pair)."""
        masked = sum(r.flops * (1.0 - kept_fraction(r.q_len, r.q_len, r.causal, r.window, tile=1))
                     for r in self.regions)
        return (float(self.work.flops.sum()) - masked) / self.work.batch

    def is_expert(self, param: str) -> bool:
        """Whether `param` is a routed expert's weight (split over the expert-parallel group)."""
        return param in self.expert_params

    def routed_load(self, i: int, execution, ep: int) -> float:
        """How much more of node i's work the busiest expert-parallel rank does than the mean: its layer's
        `Execution.routed_load` for a node on routed tokens, 1 for any other (or for no node, i < 0)."""
        if 0 <= i < len(self.in_routed) and self.in_routed[i]:
            return execution.routed_load(ep, int(self.routed_experts[i]))
        return 1.0

    def mtp_layers(self) -> int:
        """How many of the model's last layers are multi-token-prediction depths (`planner.graph.mtp`)."""
        if "mtp_layers" not in self.derived:
            self.derived["mtp_layers"] = mtp_depths(self.graph, self.structure)
        return self.derived["mtp_layers"]

    def block_numels(self) -> dict[str, tuple[float, float, float]]:
        """Per block, the elements of its dense weights, of its routed experts' weights, and of those expert
        weights that feed FP8 GEMMs."""
        if "block_numels" not in self.derived:
            def numel(params) -> float:
                return float(sum(self.graph.tensors[p].numel for p in params))

            self.derived["block_numels"] = {
                b.name: (numel(p for p in b.params if not self.is_expert(p)),
                         numel(p for p in b.params if self.is_expert(p)),
                         numel(p for p in b.params if self.is_expert(p) and p in self.fp8_weights))
                for b in self.structure.blocks}
        return self.derived["block_numels"]

    def saved(self, width: float, flash: bool = False, fused: bool = False) -> dict[str, list]:
        """Saved tensors by the block of the op that saves them (`flash`: attention as fused kernels; `fused`:
        pointwise chains as fused kernels, whose backward recomputes their intermediates)."""
        key = (width, flash, fused)
        if key not in self._saved:
            by_block: dict[str, list] = defaultdict(list)
            saved = saved_tensors(self.graph, width, self.grad, self.regions if flash else None,
                                  self.index.weight_of)
            if fused:
                dropped = recomputed_in_fused_backward(self.graph, saved, ())
                saved = [sv for sv in saved if sv.tensor not in dropped]
            for sv in saved:
                blk = self.structure.block_of_node(sv.saver)
                if blk is not None:
                    by_block[blk.name].append(sv)
            self._saved[key] = dict(by_block)
        return self._saved[key]

    def saved_by_node(self, width: float, flash: bool = False, fused: bool = False) -> dict[int, list]:
        """Saved tensors by the node that saves them."""
        key = ("by_node", width, flash, fused)
        if key not in self._fused:
            out: dict[int, list] = defaultdict(list)
            for svs in self.saved(width, flash, fused).values():
                for sv in svs:
                    out[sv.saver].append(sv)
            self._fused[key] = dict(out)  # type: ignore[assignment]
        return self._fused[key]  # type: ignore[return-value]

    def act_bytes(self, training: bool, width: float, flash: bool = False, fused: bool = False,
                  eager_rope: bool = False) -> np.ndarray:
        """Per-node activation bytes once chains of memory-bound ops are fused (see `planner.costing.fusion`):
        inside a chain only what backward keeps is written, the tensors `saved(width, flash, fused)` lists
        (with `fused`, a fused kernel's pointwise intermediates are recomputed in its backward, not kept). With
        `eager_rope`, a scaled rotary embedding's ops (`scaled_rope`) run as kernels of their own: nothing fuses
        into or out of them."""
        key = (training, width, flash, fused, eager_rope)
        if key not in self._fused:
            stored = ({sv.tensor for svs in self.saved(width, flash, fused).values() for sv in svs} if training
                      else set())
            self._fused[key] = fused_act_bytes(self.graph, self.work.act_bytes, self._kernels(eager_rope), stored)
        return self._fused[key]

    def _kernels(self, eager_rope: bool) -> np.ndarray:
        """The nodes no chain fuses across: the matrix ops, and with `eager_rope` a scaled RoPE's."""
        return self.work.matrix | self.scaled_rope if eager_rope else self.work.matrix

    def absorbed(self, eager_rope: bool = False) -> np.ndarray:
        """Per node: a memory-bound op that runs inside its readers' fused kernel and launches none of its own
        (`planner.costing.fusion.absorbed_nodes`; an attention kernel is not such a reader: it reads its queries,
        keys and values from HBM). Tied instances are costed as their first (a last layer whose residual sum
        feeds the final norm takes its siblings' launches). Found on first use: only a stack of fused launches
        asks."""
        if eager_rope not in self._absorbed:
            absorbed = absorbed_nodes(self.graph, self._kernels(eager_rope) | self.in_region)
            first: dict = {}
            self._absorbed[eager_rope] = np.array(
                [absorbed[first.setdefault(key, i)] for i, key in enumerate(self.node_keys)], dtype=bool)
        return self._absorbed[eager_rope]

    def captured(self, scopes: tuple[str, ...]) -> np.ndarray:
        """Per node: replayed from the stack's CUDA graphs of these scopes (`planner.costing.graph_capture`), once
        per scopes."""
        if scopes not in self._captured:
            self._captured[scopes] = captured_nodes(self.graph, self, scopes)
        return self._captured[scopes]


@dataclass(frozen=True, slots=True)
class RoutedPositions:
    """The routed nodes of a graph by tied position: the first node of each position (blocks in order, nodes
    ascending), and, flat over the MoE blocks (`names`) in that order, each routed node, the index of its position
    in `firsts` and the index of its block in `names`."""

    firsts: tuple[int, ...]
    names: tuple[str, ...]
    nodes: np.ndarray
    positions: np.ndarray
    owners: np.ndarray


def routed_positions(routed: dict[str, frozenset[int]], node_keys: Sequence[Hashable]) -> RoutedPositions:
    """`RoutedPositions` of the routed nodes per block, a position being a node's tie key (`tie_keys`)."""
    firsts: list[int] = []
    index_of: dict[Hashable, int] = {}
    nodes: list[int] = []
    owners: list[int] = []
    for b, name in enumerate(routed):
        for i in sorted(routed[name]):
            if node_keys[i] not in index_of:
                index_of[node_keys[i]] = len(firsts)
                firsts.append(i)
            nodes.append(i)
            owners.append(b)
    return RoutedPositions(tuple(firsts), tuple(routed), np.array(nodes, dtype=np.int64),
                           np.array([index_of[node_keys[i]] for i in nodes], dtype=np.int64),
                           np.array(owners, dtype=np.int64))
