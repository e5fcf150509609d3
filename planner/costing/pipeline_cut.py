"""Which layers go to which pipeline chunk, and the recompute policy of each layer: structure only.

A pipeline of pp stages with vpp interleaved chunks each has pp x vpp
chunks of consecutive layers (Narayanan 2021, section 2.2.2); blocks that
are not layers (the embedding, the head) ride with their neighbouring
layer. Recompute is chosen per layer by its position in its chunk, as
Megatron-LM's --recompute-num-layers does with the block method.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Mapping

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.strategy import Strategy


def even_split(n_layers: int, n_chunks: int) -> tuple[int, ...]:
    """Layers per chunk, as even as possible (the remainder goes to the last chunks, away from the embedding)."""
    base, extra = divmod(n_layers, n_chunks)
    return tuple(base + (1 if c >= n_chunks - extra else 0) for c in range(n_chunks))


def accounted_split(n_layers: int, n_chunks: int) -> tuple[int, ...] | None:
    """Layers per chunk when the embedding and the loss count as a layer each and the chunks share the n + 2 evenly
    (Megatron-Core's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split): the first and
    the last chunk one layer fewer, none when each chunk holds one; None when n + 2 does not divide evenly."""
    if n_chunks < 2 or (n_layers + 2) % n_chunks:
        return None
    k = (n_layers + 2) // n_chunks
    return (k - 1,) + (k,) * (n_chunks - 2) + (k - 1,)


def layout_chunks(layout: str) -> tuple[int, ...]:
    """Layers per pipeline chunk of a Megatron-Core pipeline layout (--pipeline-model-parallel-layout, as
    Megatron-Bridge's recipes write it: 'Et*4|(t*4|)*14tmL'): chunks split by '|', 't' a decoder layer, 'm' a
    multi-token-prediction layer (the model's last layers here), 'E' the embedding and 'L' the loss (no layer), 'x*n'
    and '(...)*n' repeats, chunk c on stage c mod pp (megatron/core/transformer/pipeline_parallel_layer_layout.py,
    core_v0.16.1)."""
    text, previous = layout.replace(" ", "").replace(",", ""), None  # commas are cosmetic there
    while text != previous:  # innermost groups first
        previous, text = text, re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"([tmEL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    if not text or set(text) - set("tmEL|"):
        raise InvalidInput(f"pipeline layout {layout!r} is not Megatron-Core's: use chunks of t (a decoder layer), "
                           "m (an MTP layer), E and L, joined by '|', with 'x*n' or '(...)*n' repeats")
    return tuple(c.count("t") + c.count("m") for c in text.split("|"))


#: Why a model without repeated layers gets no plan
NO_LAYERS = ("no repeated layer was found in the model (hyperplan cuts a model into the blocks that repeat, such as "
             "transformer layers), so it has nothing to lay out; give a model with repeated layers, or inspect it "
             "with hyperplan inspect")


def assign_chunks(structure: Structure, n_chunks: int, sizes: tuple[int, ...] = ()) -> dict[str, int]:
    """Block name -> pipeline chunk: layers in graph order by `sizes`; other blocks go with the layer before them,
    those before the first layer to the first chunk and those after the last to the last (which `sizes` may leave
    without a layer, as Megatron-Core's account_for_embedding/loss_in_pipeline_split do)."""
    layers = [b for b in structure.blocks if b.is_layer]
    if not layers:
        raise InvalidInput(NO_LAYERS)
    if not sizes and len(layers) < n_chunks:
        raise InvalidInput(
            f"the model has {len(layers)} layers, too few for {n_chunks} pipeline chunks (pp x vpp); lower --pp or --vpp"
        )
    sizes = sizes or even_split(len(layers), n_chunks)
    if sum(sizes) != len(layers):
        raise InvalidInput(f"the {len(sizes)} pipeline chunks' layer counts add up to {sum(sizes)}, but the model has "
                           f"{len(layers)} layers; give counts that add up to {len(layers)}")
    out: dict[str, int] = {}
    i = 0
    for c, size in enumerate(sizes):
        for _ in range(size):
            out[layers[i].name] = c
            i += 1
    firsts = [(structure.first_node(b.name), b.name) for b in layers]
    for b in structure.blocks:
        if b.is_layer:
            continue
        start = structure.first_node(b.name)
        prev = [name for first, name in firsts if first <= start]
        out[b.name] = (n_chunks - 1 if prev[-1] == layers[-1].name else out[prev[-1]]) if prev else 0
    return out


def layer_policies(structure: Structure, chunk: Mapping[str, int], strategy: Strategy,
                   mtp: int = 0) -> dict[str, str]:
    """Recompute policy per layer block, by its position in its pipeline chunk; other blocks are not recomputed.
    The model's last `mtp` layers (multi-token-prediction depths) are not among the first layers a chunk recomputes
    fully: Megatron-Core's block method skips them (multi_token_prediction.py: 'not supported for MTP yet')."""
    seen: dict[int, int] = defaultdict(int)
    out: dict[str, str] = {}
    layers = [b for b in structure.blocks if b.is_layer]
    depths = {b.name for b in layers[len(layers) - mtp:]} if mtp else set()
    for blk in layers:
        c = chunk[blk.name]
        if blk.name in depths and strategy.full_recompute_layers and strategy.recompute != "full":
            out[blk.name] = strategy.recompute
        else:
            out[blk.name] = strategy.layer_policy(seen[c])
        seen[c] += 1
    return out


__all__ = ["accounted_split", "assign_chunks", "even_split", "layer_policies", "layout_chunks"]
