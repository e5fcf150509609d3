"""Layers with one body but different attention masks are timed each as its own kind.

gpt-oss alternates a 128-token band (even layers) with the whole causal prefix (odd layers) through one layer
body fed two masks (`models_zoo.gpt_oss`). Tied instances are timed as their first (`planner.search.tying`), so
before the variants were tied apart every full-attention layer was costed as a banded one: 8.4x less attention
work at 4K tokens. These tests fail if a full layer is timed as a banded one or a banded one as a full one.
"""

from __future__ import annotations

import pytest

from planner.api import estimate_model, load_graph
from planner.costing.graph_facts import GraphFacts
from planner.graph.blocks import discover_blocks


def _compute_s(layers: int, window: int) -> float:
    out = estimate_model("gpt-oss-120b", cluster="dgx-h100", global_batch=8, seq_len=2048, devices=8, ep=8,
                         micro_batch=1, overrides={"layers": layers, "sliding_window": window})
    return out["breakdown_s"]["compute"]


def test_banded_and_full_layers_are_tied_apart():
    graph = load_graph("gpt-oss-120b", batch=1, seq_len=2048, overrides={"layers": 4})
    facts = GraphFacts(graph, discover_blocks(graph))
    keys = [facts.node_keys[r.anchor] for r in facts.regions]
    windows = [r.window for r in facts.regions]
    assert windows == [128, 0, 128, 0]
    assert keys[0] == keys[2] and keys[1] == keys[3] and keys[0] != keys[1]


def test_only_the_banded_layers_save_attention_work():
    """Widening the band to the whole sequence costs more by one banded layer's saving per banded layer: one in
    two layers (layer 0), two in three (0, 2) and two in four (0, 2), not every layer."""
    saving = {n: _compute_s(n, 2048) - _compute_s(n, 128) for n in (2, 3, 4)}
    assert saving[2] > 0.0
    assert saving[3] == pytest.approx(2.0 * saving[2], rel=1e-6)
    assert saving[4] == pytest.approx(saving[3], rel=1e-6)
