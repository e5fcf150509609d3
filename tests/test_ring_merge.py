"""Context parallelism's ring steps beside the attention kernels (`planner.costing.ring_merge`), worked by hand.

Transformer Engine's AttnFuncWithCPAndKVP2P (context_parallel.py, v2.10) runs one attention kernel per ring step and
copies, merges and accumulates beside them op by op. At the busiest rank of c: forward, K and V concatenated for the
exchange (4 bytes an element), step 0's partial output copied into the merged one (4) and each later step's merged
into it (6); backward, K and V copied for the exchange (4), dQ copied on step 0 (4) and added after (6), dK and dV
half-size on the first c - 1 steps, copied (2) then added (3), and added whole on the last (6). Each memory-bound
kernel pays the per-kernel overhead; the host issues 4c - 1 kernels forward and 5c backward besides the one attention
kernel counted before.
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from cost_models.compute import op_time_s
from planner.api import _graph_for_costing, make_workload
from planner.costing.execution import load_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.errors import InvalidInput
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

SEQ = 1024
SMALL = dict(layers=2, hidden=512, heads=8, kv_heads=2, ffn=1024, vocab=1000)  # head dim 64


@pytest.fixture(scope="module")
def llama():
    graph = _graph_for_costing("llama3-8b", SEQ, None, SMALL)
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, cp: int, dtype: str = "bf16", **changes) -> NodeTimes:
    execution = dataclasses.replace(load_execution("megatron-core"), **changes)
    work = dataclasses.replace(make_workload("train", 8, SEQ, dtype, None), execution=execution)
    return NodeTimes(facts, load_cluster("dgx-h100", devices=8), work, Strategy(dp=8 // cp, cp=cp, micro_batch=1),
                     execution)


def _anchor(facts) -> int:
    return min(r.anchor for r in facts.region_of.values())


def _by_hand(c: int, width: float) -> tuple[float, float]:
    """Forward and backward seconds of the ring beside one rank's kernels, from the steps in the module docstring:
    a rank holds 1,024 / c tokens, its output 8 heads of 64 a token, its keys and values 2 heads of 64 each."""
    cluster = load_cluster("dgx-h100", devices=8)
    tokens = SEQ // c
    q, kv = tokens * 8 * 64, tokens * 2 * 2 * 64
    t0, host = cluster.kernel_overhead_s, cluster.host_overhead_s
    merges = 4 + 6 * (c - 1)  # step 0's copy, then a merge (forward) or an add (backward) a step
    forward = op_time_s(cluster, 0.0, (q * merges + kv * 4) * width / 2, "elementwise", "bf16")
    forward += 2 * c * t0 + (4 * c - 1) * host  # the concatenation and 2c statistics and output merges
    dkv = 4 + 2 + 3 * (c - 2) + 6  # the exchange copy; half-size copy, half-size adds, the last step's whole add
    backward = op_time_s(cluster, 0.0, (q * merges + kv * dkv) * width / 2, "elementwise", "bf16")
    backward += 3 * c * t0 + 5 * c * host  # the copy and three accumulations a step
    return forward, backward


@pytest.mark.parametrize("c", [2, 4])
def test_the_ring_steps_cost_their_copies_merges_and_launches_beside_the_kernels(llama, c):
    """The ring's seconds are the difference against the same stack without them (`cp_merge = "none"`)."""
    i = _anchor(llama)
    ring, bare = _times(llama, c), _times(llama, c, cp_merge="none")
    forward, backward = _by_hand(c, 2.0)
    assert ring.forward(i, 1) - bare.forward(i, 1) == pytest.approx(forward, rel=1e-9)
    assert ring.backward(i, 1) - bare.backward(i, 1) == pytest.approx(backward, rel=1e-9)


def test_wider_activations_move_more_bytes(llama):
    """In fp32 activations every copy and merge moves twice the bytes; the launches are the same."""
    i = _anchor(llama)
    ring, bare = _times(llama, 2, "fp32"), _times(llama, 2, "fp32", cp_merge="none")
    forward, _ = _by_hand(2, 4.0)
    assert ring.forward(i, 1) - bare.forward(i, 1) == pytest.approx(forward, rel=1e-9)


def test_without_a_ring_or_with_attention_in_cuda_graphs_the_host_issues_nothing_more(llama):
    """At one rank nothing changes; with attention replayed from a CUDA graph the copies and merges still move their
    bytes but the host issues none of their kernels."""
    i = _anchor(llama)
    assert _times(llama, 1).backward(i, 1) == _times(llama, 1, cp_merge="none").backward(i, 1)
    graphed, bare = _times(llama, 2, cuda_graphs=("attn",)), _times(llama, 2, cp_merge="none", cuda_graphs=("attn",))
    forward, _ = _by_hand(2, 2.0)
    host = (4 * 2 - 1) * load_cluster("dgx-h100", devices=8).host_overhead_s
    assert graphed.forward(i, 1) - bare.forward(i, 1) == pytest.approx(forward - host, rel=1e-9)


def test_a_sliding_window_takes_no_ring():
    """Transformer Engine runs sliding-window attention under context parallelism only with the a2a and all-gather
    types: gpt-oss's windowed layers pay nothing of the p2p ring, its full ones do."""
    graph = _graph_for_costing("gpt-oss-120b", SEQ, None, dict(SMALL, head_dim=64, experts=8, top_k=2,
                                                                  sliding_window=128))
    facts = GraphFacts(graph, discover_blocks(graph))
    regions = {r.anchor: r for r in facts.region_of.values()}.values()
    ring = _times(facts, 2)
    assert {bool(ring._ring(r.anchor, True)) for r in regions} == {True, False}
    assert all(ring._ring(r.anchor, True) == 0.0 for r in regions if r.window)


def test_a_stack_file_naming_an_unknown_ring_is_refused_in_one_sentence(tmp_path):
    path = tmp_path / "stack.toml"
    path.write_text('[stack]\nname = "mine"\n[kernels]\ncp_merge = "ulysses"\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match="cp_merge") as err:
        load_execution(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("stack, says", [("megatron-core", "pays the megatron-core stack's ring merges"),
                                         ("torchtitan", "the torchtitan stack's ring merges beside them are not")])
def test_every_training_estimate_says_how_context_parallelism_is_costed(stack, says):
    from planner.caveats import assumptions

    work = dataclasses.replace(make_workload("train", 8, SEQ, "bf16", None), execution=load_execution(stack))
    said = [a for a in assumptions(load_cluster("dgx-h100", devices=8), work) if "context parallelism" in a]
    assert len(said) == 1 and says in said[0]


def test_the_ring_merges_assumption_is_said_only_where_the_layout_may_split_the_sequence():
    """It had been printed for every estimate and plan, DP8 and TP8 ones too (QA of 2026-12-07)."""
    from planner.api import estimate_model, plan_model

    job = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=2048, overrides=dict(layers=2))

    def said(out):
        return any("a layout with context parallelism" in a for a in out["assumptions"])

    assert not said(estimate_model("llama3-8b", **job))
    assert said(estimate_model("llama3-8b", cp=2, **job))
    planned = plan_model("llama3-8b", **job)
    assert said(planned) == (planned["strategy"].get("cp", 1) > 1)
