"""Multi-token-prediction depths, read off the graph: the last layers that embed the token ids again.

A multi-token-prediction (MTP) depth (DeepSeek-V3 report, arXiv 2412.19437,
section 2.2) follows the main layers: it looks the tokens up in an embedding
table again, mixes that with the previous depth's hidden state, runs one
transformer layer and an output head. It is the one kind of layer that reads
the token ids, which every other layer sees only through the hidden state.
So the depths are the trailing layers that look the ids up in a table shaped
as the model's token embedding (a Gather of an integer graph input from a
[vocab, hidden] parameter; a rotary cache gathered by position ids is not
one), whatever the exporter named them. Training frameworks build them apart
from the decoder layers: Megatron-LM as --mtp-num-layers, last in the
pipeline, and its 1F1B all-to-all overlap takes at most one of them.
"""

from __future__ import annotations

from planner.graph.blocks import Structure
from planner.graph.ir import Graph

#: Integer dtypes a token-id input has.
_ID_DTYPES = frozenset({"int64", "int32"})


def mtp_depths(graph: Graph, structure: Structure) -> int:
    """How many of the model's last layers are multi-token-prediction depths (0 for a plain decoder)."""
    ids = {x for x in graph.inputs if x in graph.tensors and graph.tensors[x].dtype in _ID_DTYPES}
    params = set(graph.params)

    def lookups(nodes) -> set[tuple[int, ...]]:
        """Shapes of the parameter tables `nodes` look the token ids up in."""
        return {tuple(graph.tensors[n.inputs[0]].shape) for n in (graph.nodes[i] for i in nodes)
                if n.op_type == "Gather" and len(n.inputs) > 1 and n.inputs[1] in ids and n.inputs[0] in params}

    layers = structure.layers()
    stem = lookups(i for b in structure.blocks if not b.is_layer for i in b.nodes)  # the token embedding
    count = 0
    for blk in reversed(layers[1:]):  # the first layer may embed the ids itself (a model without a separate stem)
        if not stem & lookups(blk.nodes):
            break
        count += 1
    return count


__all__ = ["mtp_depths"]
