"""Context parallelism's ring steps beside the attention kernels (`planner.costing.ring_merge`), worked by hand.

Transformer Engine's AttnFuncWithCPAndKVP2P (context_parallel.py, v2.10) runs one attention kernel per ring step and
merges the partial results op by op: at two ranks, forward, step 0's output copied into the merged one (2 bytes read,
2 written), step 1's queries re-read (2), its partial written (2) and merged (6); backward, the partial dQ, dK and dV
of each step written and accumulated (step 0 copied: 4; step 1 written and added: 8), step 1 re-reading queries,
output and output gradient (6). The host issues 6 kernels forward (a second attention kernel, the K/V exchange, two
output and two statistics merges) and 9 backward (a second kernel, two exchanges, three accumulations a step).
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
from planner.costing.ring_merge import merge_bytes, merge_launches
from planner.errors import InvalidInput
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

SEQ = 1024
SMALL = dict(layers=2, hidden=512, heads=8, kv_heads=2, ffn=1024, vocab=1000)  # head dim 64


@pytest.fixture(scope="module")
def llama():
    graph = _graph_for_costing("llama3-8b", SEQ, None, SMALL)
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, cp: int, **changes) -> NodeTimes:
    execution = dataclasses.replace(load_execution("megatron-core"), **changes)
    work = dataclasses.replace(make_workload("train", 8, SEQ, "bf16", None), execution=execution)
    return NodeTimes(facts, load_cluster("dgx-h100", devices=8), work, Strategy(dp=8 // cp, cp=cp, micro_batch=1),
                     execution)


def _anchor(facts) -> int:
    return min(r.anchor for r in facts.region_of.values())


def test_two_ring_steps_cost_their_merges_and_launches_beside_the_kernels(llama):
    """A rank holds 512 of the 1,024 tokens: its output is 512 x 8 heads x 64 elements, its dQ, dK and dV 512 x (8 + 2
    + 2) x 64. The ring's seconds are the difference against the same stack without them (`cp_merge = "none"`)."""
    i, cluster = _anchor(llama), load_cluster("dgx-h100", devices=8)
    ring, bare = _times(llama, 2), _times(llama, 2, cp_merge="none")
    out, grads = 512 * 8 * 64, 512 * 12 * 64
    host = cluster.host_overhead_s
    forward = op_time_s(cluster, 0.0, out * (4 + 10), "elementwise", "bf16") + 6 * host
    backward = op_time_s(cluster, 0.0, grads * (4 + 8) + out * 6, "elementwise", "bf16") + 9 * host
    assert ring.forward(i, 1) - bare.forward(i, 1) == pytest.approx(forward, rel=1e-9)
    assert ring.backward(i, 1) - bare.backward(i, 1) == pytest.approx(backward, rel=1e-9)


def test_the_counts_grow_with_the_ring():
    """Each step after the first adds its merge: 4 + 10 (c - 1) bytes an output element and 2 + 4 (c - 1) launches
    forward; backward 4 + 8 (c - 1) a gradient element, 6 (c - 1) an output element, 3c + 3 (c - 1) launches."""
    for c in (2, 4, 8):
        assert merge_bytes("te_p2p", c, 1.0, 0.0, False) == 4 + 10 * (c - 1)
        assert merge_bytes("te_p2p", c, 1.0, 1.0, True) == 4 + 8 * (c - 1) + 6 * (c - 1)
        assert merge_launches("te_p2p", c, False) == 2 + 4 * (c - 1)
        assert merge_launches("te_p2p", c, True) == 3 * c + 3 * (c - 1)
    assert merge_bytes("te_p2p", 1, 1.0, 1.0, True) == merge_launches("te_p2p", 1, False) == 0.0
    assert merge_bytes("none", 4, 1.0, 1.0, False) == merge_launches("none", 4, True) == 0.0


def test_without_a_ring_or_with_attention_in_cuda_graphs_the_host_issues_nothing_more(llama):
    """At one rank nothing changes; with attention replayed from a CUDA graph the merges still move their bytes but
    the host issues none of their kernels."""
    i = _anchor(llama)
    assert _times(llama, 1).backward(i, 1) == _times(llama, 1, cp_merge="none").backward(i, 1)
    graphed = _times(llama, 2, cuda_graphs=("attn",))
    assert graphed._ring(i, True) == 0.0
    assert graphed._time(i, 1, True) == _times(llama, 2)._time(i, 1, True)
    assert graphed._time(i, 1, True) > _times(llama, 2, cp_merge="none", cuda_graphs=("attn",))._time(i, 1, True)


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
