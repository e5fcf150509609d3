"""What each layer keeps for its backward pass and what it runs again, by recompute policy and stack.

Policies per layer (`Strategy.layer_policy`):
- none: every op keeps what its gradient needs (`activations.saved_tensors`);
- full: the layer keeps its inputs and runs its whole forward again in the
  backward pass (Megatron-LM's --recompute-granularity full; torchtitan's
  full AC);
- selective, by stack (`Execution.selective`):
  - modules (Megatron-Core's --recompute-modules; Korthikanti 2022
    section 5 is its core_attn): each listed module of the layer is run
    again; what its ops saved is dropped and its inputs are kept instead.
    Modules are found by the graph's module scopes (`module_nodes`):
    core_attn (the attention core; with a flash kernel that drops only its
    log-sum-exp), mlp (a dense layer's MLP block: Megatron-Core's
    TransformerLayer recomputes no MoE layer for it), moe (a MoE layer's
    block), moe_act (the experts' activation: the ops between their two
    GEMMs, experts.py bias_act_func), layernorm (the layer's
    norms), mla_up_proj (MLA's up projections) and shared_experts. layernorm, moe_act and mla_up_proj
    are checkpointed without their outputs (Megatron-Core's
    CheckpointWithoutOutput: transformer_layer.py, moe/experts.py,
    multi_latent_attention.py): what later ops save of those outputs is
    dropped too and rebuilt before their backward;
  - every_other_matmul (torchtitan's op-level SAC,
    torchtitan/distributed/activation_checkpoint.py `SelectiveAC`): the
    outputs of compute-intensive ops are saved (attention kernels, routed
    experts' GEMMs, the router's TopK) except every second projection of the
    layer, counted in execution order, and every other op is recomputed
    from them; the layer keeps its inputs and those outputs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from planner.costing.activations import Saved
from planner.costing.execution import Execution
from planner.costing.node_work import FLOAT_DTYPES
from planner.costing.loss import LOSS_SUFFIX, peak_scale
from planner.graph.blocks import Block, Structure

#: Module scope segments of each recomputable module (transformers' and Megatron's names).
_SEGMENTS = {
    "mlp": ("mlp", "feed_forward", "ffn", "block_sparse_moe"),
    "layernorm": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "pre_mlp_layernorm", "ln_1", "ln_2"),
    "mla_up_proj": ("q_b_proj", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm"),
    "shared_experts": ("shared_experts", "shared_expert"),
}


#: Modules Megatron-Core checkpoints without their outputs (see the module docstring).
_WITHOUT_OUTPUT = frozenset({"layernorm", "moe_act", "mla_up_proj"})


def module_nodes(facts, blk: Block, module: str, flash: bool) -> frozenset[int]:
    """The nodes of one recomputable module of a layer (see the module docstring)."""
    graph = facts.graph
    nodes = blk.nodes
    if module == "core_attn":
        core = facts.region_of if flash else facts.core
        return frozenset(i for i in nodes if i in core)
    if module == "moe_act":
        return _between_expert_gemms(facts, facts.routed.get(blk.name, frozenset()))
    if (module == "moe") != (blk.name in facts.moe) and module in ("mlp", "moe"):
        return frozenset()  # mlp is a dense layer's MLP, moe a MoE layer's (TransformerLayer: not is_moe_layer)
    segments = _SEGMENTS["mlp" if module == "moe" else module]
    found = frozenset(i for i in nodes if any(seg in segments for seg in graph.nodes[i].scope.split(".")))
    if module == "mla_up_proj":  # and what turns their outputs into Q, K and V: rotary, splits, concats
        found = _up_to_attention(facts, blk, found, facts.region_of if flash else facts.core)
    return found


def _between_expert_gemms(facts, routed: frozenset[int]) -> frozenset[int]:
    """The experts' ops a routed GEMM's output reaches before another routed GEMM reads them: what Megatron-Core's
    checkpointed bias_act_func runs (megatron/core/transformer/moe/experts.py, core_v0.16.1), not the output bias
    added after the second GEMM (`_apply_bias`, outside the checkpoint) nor what follows it."""
    graph, matrix = facts.graph, facts.work.matrix
    gemms = [i for i in routed if matrix[i]]
    after: set[int] = set()  # what the routed GEMMs' outputs reach before a routed GEMM
    todo = list(gemms)
    while todo:
        for o in graph.nodes[todo.pop()].outputs:
            for j in facts.index.consumers.get(o, ()) if o else ():
                if j in routed and not matrix[j] and j not in after:
                    after.add(j)
                    todo.append(j)
    out: set[int] = set()  # of those, what a routed GEMM's inputs come from
    todo = list(gemms)
    while todo:
        for j in _producers(facts, todo.pop()):
            if j in after and j not in out:
                out.add(j)
                todo.append(j)
    return frozenset(i for i in out if ".experts" in graph.nodes[i].scope)


def _up_to_attention(facts, blk: Block, seeds: frozenset[int], core) -> frozenset[int]:
    """`seeds` and every op of the layer their outputs reach before the attention core or a weight's GEMM."""
    graph, members = facts.graph, frozenset(blk.nodes)
    out, todo = set(seeds), list(seeds)
    while todo:
        for o in graph.nodes[todo.pop()].outputs:
            for j in facts.index.consumers.get(o, ()) if o else ():
                if j in out or j not in members or j in core or facts.weight_matmul[j]:
                    continue
                out.add(j)
                todo.append(j)
    return frozenset(out)


def _recomputed(facts, blk: Block, execution: Execution) -> frozenset[int]:
    """Nodes a selective policy runs again, by the stack's selective recompute (found once per layer and stack)."""
    flash = execution.attention == "flash"
    key = ("recomputed", blk.name, execution.selective, tuple(execution.recompute_modules), flash)
    hit = facts.derived.get(key)
    if hit is not None:
        return hit
    if execution.selective == "every_other_matmul":
        out = frozenset(blk.nodes) - sac_saved_nodes(facts, blk)
    else:
        out = frozenset().union(*(module_nodes(facts, blk, module, flash) for module in execution.recompute_modules))
    facts.derived[key] = out
    return out


def _outputs_rebuilt(facts, blk: Block, execution: Execution) -> frozenset[str]:
    """Tensors made by modules checkpointed without their outputs: nobody keeps them."""
    if execution.selective == "every_other_matmul":
        return frozenset()
    flash = execution.attention == "flash"
    graph = facts.graph
    out: set[str] = set()
    for module in execution.recompute_modules:
        if module in _WITHOUT_OUTPUT:
            out |= {o for i in module_nodes(facts, blk, module, flash) for o in graph.nodes[i].outputs if o}
    return frozenset(out)


def _expert_outputs(facts, blk: Block) -> frozenset[str]:
    """Outputs of a layer's last expert GEMMs (those no other expert GEMM reads from): what the combine keeps
    to weigh them by the routing probabilities, unless those probabilities scale the activation instead."""
    moe = facts.moe.get(blk.name)
    if moe is None:
        return frozenset()
    graph = facts.graph
    members = frozenset(blk.nodes)
    upstream: set[int] = set()
    todo = [p for e in moe.expert_nodes for p in _producers(facts, e)]
    while todo:
        j = todo.pop()
        if j in upstream or j not in members:
            continue
        upstream.add(j)
        todo.extend(_producers(facts, j))
    return frozenset(o for e in moe.expert_nodes if e not in upstream for o in graph.nodes[e].outputs if o)


def _producers(facts, i: int) -> list[int]:
    return [facts.producer[x][0] for x in facts.graph.nodes[i].inputs if x in facts.producer]


def sac_saved_nodes(facts, blk: Block) -> frozenset[int]:
    """Nodes of a layer whose outputs torchtitan's op-level SAC saves (see the module docstring)."""
    routed = facts.routed.get(blk.name, frozenset())
    saved: set[int] = set()
    count = 0
    for i in sorted(blk.nodes):
        if i in routed:
            if i in facts.moe[blk.name].expert_nodes or i == facts.moe[blk.name].topk_node:
                saved.add(i)
            continue
        if facts.region_of.get(i) is not None and facts.region_of[i].anchor == i:
            saved.add(i)
        elif facts.weight_matmul[i] and not facts.router_node[i]:
            count += 1
            if count % 2 == 1:
                saved.add(i)
    return frozenset(saved)


def recompute_marks(facts, structure: Structure, policy: Mapping[str, str], execution: Execution) -> np.ndarray:
    """Per node, 1 where its forward runs again in the backward pass."""
    again = np.zeros(len(facts.graph.nodes), dtype=np.int64)
    for blk in structure.blocks:
        rc = policy.get(blk.name, "none")
        if rc == "full":
            again[list(blk.nodes)] = 1
        elif rc == "selective" and blk.nodes:
            again[sorted(_recomputed(facts, blk, execution))] = 1
    return again


def kept_tensors(facts, blk: Block, rc: str, execution: Execution, width: float) -> tuple[Saved, ...]:
    """What one layer under policy `rc` keeps for backward, at the imported batch (see the module docstring)."""
    flash = execution.attention == "flash"
    fused = execution.fuse_elementwise
    selective = (execution.selective, execution.recompute_modules) if rc == "selective" else ()
    key = (blk.name, rc, selective, flash, fused, width, execution.loss_kernel)
    hit = facts.kept_cache.get(key)
    if hit is not None:
        return hit
    graph = facts.graph
    if rc == "full" or (rc == "selective" and execution.selective == "every_other_matmul"):
        out = list(_inputs_of(facts, blk, frozenset(blk.nodes), width))
        if rc == "selective":
            for i in sorted(sac_saved_nodes(facts, blk)):
                region = facts.region_of.get(i)
                if region is not None and region.anchor == i:  # the attention kernel: O and its statistics
                    t = graph.tensors[region.out]
                    out.append(Saved(region.out, i, -1, t.numel * width))
                    out.append(Saved(f"{graph.nodes[i].name or i}::lse", i, 0, region.lse_bytes))
                    continue
                for o in graph.nodes[i].outputs:
                    t = graph.tensors.get(o) if o else None
                    if t is not None:
                        out.append(Saved(o, i, -1, t.numel * (width if t.dtype in FLOAT_DTYPES else
                                                              t.nbytes / max(t.numel, 1))))
    else:
        again = _recomputed(facts, blk, execution) if rc == "selective" else frozenset()
        rebuilt = _outputs_rebuilt(facts, blk, execution) if rc == "selective" else frozenset()
        if execution.moe_probs_in_activation:
            rebuilt |= _expert_outputs(facts, blk)
        out = [sv for sv in facts.saved(width, flash, fused).get(blk.name, ())
               if sv.saver not in again and facts.saved_roots.get(sv.tensor, sv.tensor) not in rebuilt]
        if again:
            have = {sv.tensor for sv in out}
            out += [sv for sv in _inputs_of(facts, blk, again, width) if sv.tensor not in have]
    scale = peak_scale(execution.loss_kernel)  # what the stack's loss kernel holds of the logits at its peak
    result = tuple(Saved(sv.tensor, sv.saver, sv.input_index, sv.nbytes * scale) if sv.tensor.endswith(LOSS_SUFFIX)
                   else sv for sv in out)
    facts.kept_cache[key] = result
    return result


def fp8_scale(facts, sv: Saved, fp8_inputs: bool) -> float:
    """What one kept tensor costs relative to its 16-bit size: 1/2 for an FP8 GEMM's activation input when
    the recipe keeps those in FP8 for the weight gradient (Transformer Engine, torchao's float8), else 1."""
    if fp8_inputs and sv.input_index >= 0 and 0 <= sv.saver < len(facts.fp8_gemm) and facts.fp8_gemm[sv.saver]:
        return 0.5
    return 1.0


def _inputs_of(facts, blk: Block, nodes: frozenset[int], width: float) -> list[Saved]:
    """The activations a set of a layer's nodes reads from outside itself that carry a gradient (its layer
    inputs, for the whole layer), each kept by its first reader."""
    graph = facts.graph
    made = {o for i in nodes for o in graph.nodes[i].outputs if o}
    out, seen = [], set()
    for i in sorted(nodes):
        for j, x in enumerate(graph.nodes[i].inputs):
            if not x or x in made or x in facts.params or x not in facts.grad or facts.index.is_weight(x):
                continue
            root = facts.saved_roots.get(x, x)  # a view (or float cast) is kept as the tensor it views
            if root in seen or root in made:
                continue
            seen.add(root)
            t = graph.tensors[root]
            nb = t.numel * (width if t.dtype in FLOAT_DTYPES else t.nbytes / max(t.numel, 1))
            out.append(Saved(root, i, j, nb))
    return out


__all__ = ["fp8_scale", "kept_tensors", "module_nodes", "recompute_marks", "sac_saved_nodes"]
