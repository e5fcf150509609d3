"""DeepSeek-V3's multi-token prediction (the zoo's mtp_layers): the module the report describes, placed last, with
the weights training keeps for it, and costed as one more MoE layer with an output head.

DeepSeek-V3 report (arXiv 2412.19437) section 2.2: each depth concatenates RMSNorm(embedding) and RMSNorm(the
previous depth's hidden state), projects 2h -> h, runs one Transformer block and the shared output head. The
released checkpoint's README_WEIGHTS.md: 685B in all, 671B of the main model, and MTP modules of 11.5B unique
parameters besides the 0.9B embedding and 0.9B output head they share. Megatron-LM computes the MTP logits with
the main output layer and keeps a copy of the embedding on the MTP's pipeline stage: the zoo does the same.
"""

from __future__ import annotations

import pytest

import models_zoo
from planner.api import load_graph
from planner.graph.blocks import discover_blocks
from planner.graph.mtp import mtp_depths

SMALL = dict(layers=4, dense_layers=1, hidden=64, heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16,
             qk_rope_dim=8, v_head_dim=16, ffn=128, expert_ffn=32, experts=8, top_k=2, shared_experts=1, vocab=128)


def test_the_released_checkpoint_counts():
    main, _ = models_zoo.param_counts("deepseek-v3")
    total, active = models_zoo.param_counts("deepseek-v3", mtp_layers=1)
    table = 129280 * 7168  # one embedding or output-head table
    assert total - main - table == pytest.approx(11.5e9, rel=0.015)  # its unique parameters, beside its embedding
    assert total + table == pytest.approx(685e9, rel=0.005)  # the checkpoint stores the shared head once more
    # per token the depth runs its embedding copy, eh_proj, attention and 8 of its 256 experts: under 1B of 11.5B
    assert table < active - models_zoo.param_counts("deepseek-v3")[1] < table + 1e9


def test_the_mtp_depth_is_the_last_layer_and_has_its_own_logits():
    g = load_graph("deepseek-v3", batch=1, seq_len=64, overrides=dict(SMALL, mtp_layers=1))
    assert g.outputs == ("logits", "mtp_logits.0")
    layers = discover_blocks(g).layers()
    assert [b.name for b in layers] == [f"model.layers.{i}" for i in range(5)]
    mtp = layers[-1]
    gathers = [g.nodes[i] for i in mtp.nodes if g.nodes[i].op_type == "Gather"]
    assert any("input_ids" in n.inputs for n in gathers)  # it embeds the tokens again
    assert {"model.layers.4.eh_proj.weight", "model.layers.4.embed_tokens.weight"} <= set(g.params)
    assert "model.layers.4.shared_head.head.weight" not in g.params  # its logits use the main output weight
    heads = [g.nodes[i] for i in mtp.nodes if g.nodes[i].op_type == "Transpose"
             and "lm_head.weight" in g.nodes[i].inputs]
    assert len(heads) == 1 and mtp_depths(g, discover_blocks(g)) == 1


def test_its_flops_are_a_moe_layer_the_projection_and_a_head():
    """Forward FLOPs of the MTP block = a main MoE layer's + eh_proj's 2*T*2h*h + the head's 2*T*h*V (its norms,
    embedding lookup and concatenation are elementwise: a few FLOPs per element at most)."""
    seq = 64
    g = load_graph("deepseek-v3", batch=1, seq_len=seq, overrides=dict(SMALL, mtp_layers=1))
    blocks = {b.name: b for b in discover_blocks(g).blocks}
    flops = {name: sum(g.nodes[i].flops for i in b.nodes) for name, b in blocks.items()}
    h, v = SMALL["hidden"], SMALL["vocab"]
    expected = flops["model.layers.3"] + 2 * seq * 2 * h * h + 2 * seq * h * v
    assert flops["model.layers.4"] == pytest.approx(expected, rel=0.03)


def test_off_by_default_as_in_transformers():
    g = load_graph("deepseek-v3", batch=1, seq_len=64, overrides=SMALL)
    st = discover_blocks(g)
    assert g.outputs == ("logits",) and len(st.layers()) == 4 and mtp_depths(g, st) == 0
    two = load_graph("deepseek-v3", batch=1, seq_len=64, overrides=dict(SMALL, mtp_layers=2))
    assert mtp_depths(two, discover_blocks(two)) == 2 and len(two.outputs) == 3
    with pytest.raises(ValueError, match="mtp_layers must be >= 0"):
        models_zoo.build("deepseek-v3", **SMALL, mtp_layers=-1, seq_len=64)


def test_a_chunks_fully_recomputed_first_layers_leave_the_mtp_depth_as_megatron_core_does():
    """Megatron-Core's block recompute skips MTP layers (multi_token_prediction.py: 'recompute_method == block is
    not supported for MTP yet. Skipping recompute.'): the costing and the declaration keep its policy."""
    from planner.costing.pipeline_cut import assign_chunks, layer_policies
    from planner.hypershard import declare
    from planner.strategy import Strategy

    g = load_graph("deepseek-v3", batch=1, seq_len=64, overrides=dict(SMALL, mtp_layers=1))
    st = discover_blocks(g)
    s = Strategy(dp=1, full_recompute_layers=5, recompute="selective")
    policy = layer_policies(st, assign_chunks(st, 1), s, mtp_depths(g, st))
    assert [policy[f"model.layers.{i}"] for i in range(5)] == ["full"] * 4 + ["selective"]
    doc = declare("deepseek-v3", overrides=dict(SMALL, mtp_layers=1), cluster="dgx-h100", devices=8,
                  global_batch=16, seq_len=64, dp=8, full_recompute_layers=5, recompute="selective", zero=1)
    named = [r["match"] for r in doc["recompute"]["layers"] if r["default"] == "recompute"]
    assert named == [f"model.layers.{i}" for i in range(4)]
