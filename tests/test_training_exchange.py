"""Traffic beside the tensor axis in training, as Megatron-Core runs it: expert dispatch, what recompute reruns, CP.

Hand-computed physics on small cases: the flex (DeepEP / HybridEP) dispatcher with expert-tensor ranks crosses
the fabric once per destination node and forwards the expert-tensor copies inside the node; the all-to-all
dispatcher all-gathers the tokens over the expert-tensor group on top, and regroups them by local expert;
recompute module `mlp` is a dense layer's MLP, `moe` a MoE layer's whole forward with its dispatch and combine;
the context-parallel ring moves K and V at their own (GQA) head count.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from cost_models import load_cluster, place_group
from cost_models.collectives import all_gather_s, all_to_all_s, reduce_scatter_s
from cost_models.expert_dispatch import exchange_s, limited_members
from planner.api import load_graph
from planner.costing.block_costs import Parts
from planner.costing.exchange import add_expert_exchange
from planner.costing.execution import load_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.recompute import module_nodes
from planner.graph.blocks import discover_blocks
from planner.graph.moe import MoeFacts
from planner.strategy import Strategy

TOKENS, TOP_K, EXPERTS, HIDDEN = 4096, 8, 64, 4096


def _exchange(dispatcher: str, etp: int, policy: str = "none", modules: tuple[str, ...] = ("core_attn",)) -> Parts:
    """ep_fwd / ep_bwd of one MoE layer of 4096 tokens on 16 DGX H100s (2 nodes): tp 2, ep x etp = 16."""
    cluster = load_cluster("dgx-h100", devices=16)
    facts = SimpleNamespace(moe={"l": MoeFacts(experts=EXPERTS, top_k=TOP_K, params=frozenset(),
                                               router_params=frozenset(), expert_nodes=frozenset(),
                                               tokens=TOKENS, hidden=HIDDEN)})
    strategy = Strategy(tp=2, dp=8, ep=16 // etp, etp=etp)
    ex = dataclasses.replace(load_execution("megatron-core"), moe_dispatcher=dispatcher, recompute_modules=modules)
    parts = {"l": Parts()}
    add_expert_exchange(facts, cluster, strategy, ex, 2.0, 1.0, {"l": policy}, parts)
    return parts["l"]


def _crossing(span, volume: float) -> float:
    return span.level.latency_s + volume / span.effective_bandwidth(volume)


def test_flex_dispatch_sends_a_token_once_per_node_and_forwards_its_expert_tensor_copies_inside():
    cluster = load_cluster("dgx-h100", devices=16)
    nvlink, ib = place_group(cluster, 16)
    tokens = TOKENS / 2  # the rank's sequence shard (tp 2, sequence parallel)
    nodes = 2 * (1 - 0.5**TOP_K)  # distinct nodes a token's 8 experts are on, of 2
    ep_ranks = 8 * (1 - (7 / 8) ** TOP_K)  # distinct expert ranks of 8, each with its 2 expert-tensor ranks
    remote = nodes * 0.5
    inside = ep_ranks * 2 * 15 / 16 - remote  # copies forwarded over NVLink, the self copy left out
    one_way = max(_crossing(ib, tokens * remote * HIDDEN * 2), _crossing(nvlink, tokens * inside * HIDDEN * 2))
    flex = _exchange("deepep", etp=2)
    assert flex.ep_fwd == pytest.approx(2 * one_way, rel=1e-9)  # dispatch and combine, no expert-tensor gather
    assert flex.ep_bwd == pytest.approx(flex.ep_fwd, rel=1e-9)


def test_group_limited_routing_reaches_the_ranks_of_the_groups_it_picks():
    """DeepSeek-V3's routing (8 groups of consecutive experts, at most 4 a token): over 8 ranks (a group a rank)
    a token's 8 experts reach at most 4 ranks, 4 x (1 - (3/4)^8) on average (uniform picks reach 8 x (1 -
    (7/8)^8) = 5.25); over 4 nodes of 2 groups each, a node none of the 4 picked groups is on has
    C(6, 4) / C(8, 4) = 15/70 odds; over 64 ranks (8 a group) the picks spread over the 32 ranks of 4 groups."""
    assert limited_members(8, 8, 8, 4) == pytest.approx(4 * (1 - 0.75**8))
    assert limited_members(8, 4, 8, 4) == pytest.approx(4 * (1 - 15 / 70))
    assert limited_members(8, 64, 8, 4) == pytest.approx(32 * (1 - (31 / 32) ** 8))
    assert limited_members(8, 8, 8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))  # no limit: uniform picks


def test_a_group_limited_token_crosses_nvlink_once_per_rank_of_its_groups():
    cluster = load_cluster("dgx-h100", devices=8)
    (nvlink,) = place_group(cluster, 8)
    facts = SimpleNamespace(moe={"l": MoeFacts(experts=256, top_k=8, params=frozenset(), router_params=frozenset(),
                                               expert_nodes=frozenset(), tokens=TOKENS, hidden=HIDDEN)})
    ex = dataclasses.replace(load_execution("megatron-core"), moe_dispatcher="deepep", moe_group_limit=4,
                             moe_groups=8)
    parts = {"l": Parts()}
    add_expert_exchange(facts, cluster, Strategy(dp=8, ep=8), ex, 2.0, 1.0, {"l": "none"}, parts)
    copies = 4 * (1 - 0.75**8) * 7 / 8  # distinct ranks of the 4 groups' 4, the own rank's copy left out
    assert parts["l"].ep_fwd == pytest.approx(2 * _crossing(nvlink, TOKENS * copies * HIDDEN * 2), rel=1e-9)


def test_the_all_to_all_dispatcher_sends_each_peer_its_own_message():
    """NCCL's all-to-all is a send and a receive per peer (ncclAlltoAll's p2p tasks): over 2 DGX H100s each of
    the 16 expert ranks gets 1/16 of the rank's 2,048 x 8 pairs (8 MiB), 3.5 copies a token over NVLink and 4
    over InfiniBand, each level at its bus efficiency for that 8 MiB, not for the level's whole share (56 and
    64 MiB), which DeepEP's one pipelined transfer would reach."""
    cluster = load_cluster("dgx-h100", devices=16)
    nvlink, ib = place_group(cluster, 16)
    tokens, width = TOKENS / 2, HIDDEN * 2
    message = tokens * TOP_K * width / 16

    def level(span, copies: float) -> float:
        return span.level.latency_s + tokens * copies * width / span.effective_bandwidth(message)
    a2a = _exchange("alltoall", etp=1)
    assert a2a.ep_fwd == pytest.approx(2 * (level(nvlink, 3.5) + level(ib, 4.0)), rel=1e-9)
    assert a2a.ep_fwd == pytest.approx(2 * all_to_all_s(tokens * TOP_K * width, (nvlink, ib)), rel=1e-12)  # one formula
    whole = 2 * (_crossing(nvlink, tokens * 3.5 * width) + _crossing(ib, tokens * 4.0 * width))
    assert a2a.ep_fwd > whole
    with pytest.raises(ValueError, match="per_peer"):
        exchange_s(tokens, TOP_K, width, (nvlink, ib), hierarchical=True, per_peer=True)


def test_the_all_to_all_dispatcher_gathers_over_the_expert_tensor_group_on_top_of_its_exchange():
    a2a = _exchange("alltoall", etp=2)
    etp = place_group(load_cluster("dgx-h100", devices=16), 2)
    pairs = TOKENS / 2 * TOP_K * HIDDEN * 2 * 2
    gathers = all_gather_s(pairs, etp) + reduce_scatter_s(pairs, etp)
    assert a2a.ep_fwd > gathers > 0
    assert _exchange("deepep", etp=2).ep_fwd < a2a.ep_fwd


@pytest.mark.parametrize("policy, modules, again", [("selective", ("moe",), True), ("selective", ("moe_act",), False),
                                                     ("full", ("core_attn",), True), ("none", ("moe",), False)])
def test_a_recomputed_moe_layer_runs_its_dispatch_and_combine_again(policy, modules, again):
    p = _exchange("deepep", etp=1, policy=policy, modules=modules)
    assert p.ep_bwd == pytest.approx(p.ep_fwd * (2.0 if again else 1.0), rel=1e-12)


def test_recompute_module_mlp_is_a_dense_layers_mlp_and_moe_a_moe_layers_block():
    g = load_graph("deepseek-v3", batch=1, seq_len=64, overrides=dict(layers=2, dense_layers=1))
    st = discover_blocks(g)
    facts = GraphFacts(g, st)
    dense, moe = (st.block(f"model.layers.{i}") for i in range(2))
    assert moe.name in facts.moe and dense.name not in facts.moe
    assert module_nodes(facts, dense, "mlp", True) and not module_nodes(facts, dense, "moe", True)
    assert not module_nodes(facts, moe, "mlp", True)  # Megatron-Core: "mlp" recomputes no MoE layer
    assert facts.moe[moe.name].expert_nodes <= module_nodes(facts, moe, "moe", True)


def test_the_all_to_all_dispatcher_regroups_its_received_tokens_by_local_expert():
    """Two HBM passes (read and write) of the rank's routed pairs forward, two backward; none with one expert
    per rank or with the flex dispatcher, whose tokens arrive laid out by expert."""
    cluster = load_cluster("dgx-h100", devices=16)
    pairs = TOKENS / 2 * TOP_K * HIDDEN * 2 * 2  # the rank's tokens x top-k x hidden bytes, gathered over etp 2
    one = 2 * pairs / (cluster.device.hbm_bytes_per_s * cluster.memory_efficiency(2 * pairs))
    a2a = _exchange("alltoall", etp=2)
    assert a2a.forward == pytest.approx(2 * one, rel=1e-9) and a2a.backward == pytest.approx(2 * one, rel=1e-9)
    assert _exchange("deepep", etp=2).forward == 0.0


def test_the_context_parallel_ring_moves_k_and_v_at_their_own_head_count():
    """Llama-3 8B's 8 KV heads of 128 (not its 32 query heads): what each rank passes around the ring."""
    from planner.costing.exchange import add_context_exchange

    seq, cp = 1024, 2
    g = load_graph("llama3-8b", batch=1, seq_len=seq, overrides=dict(layers=1))
    st = discover_blocks(g)
    facts = GraphFacts(g, st)
    cluster = load_cluster("dgx-h100", devices=16)
    strategy = Strategy(tp=8, cp=cp, dp=1)
    ex = dataclasses.replace(load_execution("megatron-core"), overlap_cp_comm=False)
    timer = SimpleNamespace(forward=lambda i, k: 0.0, backward=lambda i, k: 0.0)
    parts = {b.name: Parts() for b in st.blocks}
    layer = next(b for b in st.blocks if b.is_layer)
    width = g.tensors[g.params[0]].nbytes / g.tensors[g.params[0]].numel
    add_context_exchange(facts, st, cluster, strategy, ex, timer, lambda x: g.tensors[x].nbytes / cp,
                         SimpleNamespace(get=lambda x, d=-1: -1), {}, parts)
    kv_bytes = 2 * (seq / cp) * 8 * 128 * width  # K and V of this rank's half of the sequence, 8 heads of 128
    spans = place_group(cluster, cp, stride=8)
    assert parts[layer.name].cp_fwd == pytest.approx(all_gather_s(kv_bytes * cp, spans), rel=1e-9)
    assert parts[layer.name].cp_bwd == pytest.approx(
        all_gather_s(kv_bytes * cp, spans) + reduce_scatter_s(kv_bytes * cp, spans), rel=1e-9)


def test_fp8_sequence_parallel_all_gathers_move_one_byte_per_element(monkeypatch):
    """With FP8 GEMMs the stack quantizes a layer's input before its sequence-parallel all-gather (TE's
    gather_along_first_dim with the input quantizer, torchao's Float8 TP plans): every tensor-axis all-gather
    moves half the bytes it moves in 16 bits; reduce-scatters are unchanged."""
    import planner.costing.stage_costs as sc
    from planner.strategy import Workload

    g = load_graph("llama3-8b", batch=1, seq_len=512, overrides=dict(layers=1, hidden=512, heads=8, kv_heads=2,
                                                                     ffn=1024, vocab=1024))
    st = discover_blocks(g)
    cluster = load_cluster("dgx-h100", devices=8)
    moved: dict[bool, list] = {}
    for flag in (False, True):
        ex = dataclasses.replace(load_execution("megatron-core"), fp8_tp_all_gather=flag)
        seen: list = []
        monkeypatch.setattr(sc, "all_gather_s", lambda n, spans, seen=seen: seen.append(("ag", n)) or 0.0)
        monkeypatch.setattr(sc, "reduce_scatter_s", lambda n, spans, seen=seen: seen.append(("rs", n)) or 0.0)
        sc.stage_costs(g, st, cluster, Workload(global_batch=8, seq_len=512, dtype="fp8", execution=ex),
                       Strategy(tp=8, sp=True, micro_batch=1), facts=GraphFacts(g, st))
        moved[flag] = sorted(seen)
    gathers = {flag: [n for k, n in moved[flag] if k == "ag"] for flag in moved}
    assert gathers[False] and gathers[True] == pytest.approx([n / 2 for n in gathers[False]])
    assert [n for k, n in moved[True] if k == "rs"] == [n for k, n in moved[False] if k == "rs"]


def test_adding_parts_adds_every_seconds_field():
    """A stage's parts are its blocks' parts added up: each float field (a new one too) and each collective."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(Parts) if f.type in (float, "float")]
    a, b = Parts(), Parts()
    for k, name in enumerate(names):
        setattr(a, name, 1.0 + k)
        setattr(b, name, 100.0 * (k + 1))
    b.tp_kinds["all_gather"] = 3.0
    a.add(b, 0.5)
    assert names and all(getattr(a, n) == 1.0 + k + 50.0 * (k + 1) for k, n in enumerate(names))
    assert a.tp_kinds == {"all_gather": 1.5}
