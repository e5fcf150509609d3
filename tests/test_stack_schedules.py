"""What a stack does across a step's micro-batches: FP8 weight copies cast once per step, and pipeline sends
overlapped only where its schedule can.

- Transformer Engine casts a 16-bit weight to FP8 on a step's first micro-batch and reuses the copy on the rest
  (`is_first_microbatch`, which Megatron-Core sets: pipeline_parallel/schedules.py set_is_first_microbatch), so
  the weight's cast costs 1/m of it per micro-batch; torchao's Float8Linear casts in every forward. By hand on
  a small Llama layer: the cast traffic of a weight-fed GEMM differs by cast_bytes x numel x (1 - 1/m).
- Megatron-Core overlaps pipeline sends and receives with compute only between virtual stages
  (forward_backward_pipelining_without_interleaving refuses overlap_p2p_comm): a 1F1B pipeline pays them whole.
"""

from __future__ import annotations

import dataclasses

import pytest

import planner.costing.node_times as nt
from cost_models import load_cluster
from planner.api import load_graph
from planner.costing.execution import load_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes, cast_bytes_per_element
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy, Workload

SMALL = dict(layers=1, hidden=512, heads=8, kv_heads=2, ffn=1024, vocab=1024)
HOPPER = load_cluster("dgx-h100").device  # the cluster _cast_bytes costs on


@pytest.fixture(scope="module")
def small():
    g = load_graph("llama3-8b", batch=1, seq_len=512, overrides=SMALL)
    st = discover_blocks(g)
    return g, GraphFacts(g, st)


def _cast_bytes(monkeypatch, facts, execution, node: int, m: int, strategy: Strategy | None = None) -> float:
    """HBM bytes of the FP8 casts of one forward GEMM on one device, as the costing passes them on."""
    seen: list[float] = []
    real = nt.op_time_s
    monkeypatch.setattr(nt, "op_time_s", lambda c, f, b, kind, dtype=None: seen.append(b) or real(c, f, b, kind, dtype))
    strategy = strategy or Strategy(micro_batch=1)
    work = Workload(global_batch=m * strategy.dp, seq_len=512, dtype="fp8", execution=execution)
    timer = NodeTimes(facts, load_cluster("dgx-h100", devices=strategy.devices), work, strategy, execution)
    timer._casts(node, 1, timer.bs, backward=False)
    monkeypatch.setattr(nt, "op_time_s", real)
    return sum(seen)


def test_a_cached_fp8_weight_is_cast_once_per_step(monkeypatch, small):
    g, facts = small
    node = next(i for i, n in enumerate(g.nodes) if facts.fp8_gemm[i] and any(facts.index.is_weight(x) for x in n.inputs))
    weight = next(g.tensors[x] for x in g.nodes[node].inputs if facts.index.is_weight(x))
    base = dataclasses.replace(load_execution("megatron-core"), fp8_params=False)
    m = 8
    cached = _cast_bytes(monkeypatch, facts, dataclasses.replace(base, fp8_weight_cache=True), node, m)
    every = _cast_bytes(monkeypatch, facts, dataclasses.replace(base, fp8_weight_cache=False), node, m)
    assert every - cached == pytest.approx(cast_bytes_per_element(base, HOPPER) * weight.numel * (1 - 1 / m), rel=1e-9)
    # FP8 weights kept by the stack are never cast in the step, cached or not
    kept = dataclasses.replace(base, fp8_params=True, fp8_weight_cache=True)
    assert _cast_bytes(monkeypatch, facts, kept, node, m) == pytest.approx(every - cast_bytes_per_element(base, HOPPER) * weight.numel)


def test_an_fp8_fsdp_gather_casts_only_each_ranks_slice(monkeypatch, small):
    """torchao's enable_fsdp_float8_all_gather quantises the local FSDP shard before the all-gather: over 8 data
    ranks each casts an eighth of the weight, every micro-batch (the gathered FP8 weight feeds the GEMM)."""
    g, facts = small
    node = next(i for i, n in enumerate(g.nodes) if facts.fp8_gemm[i] and any(facts.index.is_weight(x) for x in n.inputs))
    weight = next(g.tensors[x] for x in g.nodes[node].inputs if facts.index.is_weight(x))
    base = load_execution("torchtitan")
    fsdp = Strategy(dp=8, zero=3, micro_batch=1)
    whole = _cast_bytes(monkeypatch, facts, base, node, 4, fsdp)
    sliced = _cast_bytes(monkeypatch, facts, dataclasses.replace(base, fp8_all_gather=True), node, 4, fsdp)
    assert whole - sliced == pytest.approx(cast_bytes_per_element(base, HOPPER) * weight.numel * (1 - 1 / 8), rel=1e-9)
    # without ZeRO-3 nothing is gathered: each rank casts its whole weight in every forward
    ddp = Strategy(dp=8, micro_batch=1)
    assert _cast_bytes(monkeypatch, facts, dataclasses.replace(base, fp8_all_gather=True), node, 4, ddp) == \
        pytest.approx(whole, rel=1e-12)


def test_the_stacks_say_who_caches_fp8_weights():
    assert load_execution("megatron-core").fp8_weight_cache  # TE's is_first_microbatch
    assert not load_execution("torchtitan").fp8_weight_cache  # Float8Linear casts in every forward
    # NeMo 24.07's pretraining configs leave fp8_params unset (False): 16-bit weights, gathered in 16 bits
    old = load_execution("megatron-core-2024")
    assert (old.fp8_params, old.fp8_all_gather, old.fp8_weight_cache) == (False, False, True)


def _p2p(tmp_path, **overlap) -> float:
    from planner.api import estimate_model

    stack = tmp_path / f"s{len(list(tmp_path.iterdir()))}.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[overlap]\n'
                     + "".join(f"{k} = {str(v).lower()}\n" for k, v in overlap.items()), encoding="utf-8")
    est = estimate_model("llama3-8b", cluster="dgx-h100", devices=16, global_batch=16, seq_len=2048, pp=2, dp=8,
                         overrides=dict(layers=4, vocab=32000), stack=str(stack))
    return est["breakdown_s"]["pp_p2p"]


def test_megatron_core_overlaps_pipeline_sends_only_between_virtual_stages(tmp_path):
    plain = _p2p(tmp_path)
    assert plain > 0
    assert plain == pytest.approx(_p2p(tmp_path, overlap_pp_comm=False), rel=1e-12)
    assert _p2p(tmp_path, overlap_pp_comm_1f1b=True) < plain
    assert not load_execution("megatron-core").overlap_pp_comm_1f1b
    assert load_execution("torchtitan").overlap_pp_comm_1f1b


def test_an_overlapped_expert_exchange_is_stated_as_an_assumption(tmp_path):
    from planner.api import estimate_model

    stack = tmp_path / "a2a.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[overlap]\noverlap_ep_comm = true\n', encoding="utf-8")
    kw = dict(cluster="dgx-h100", devices=8, global_batch=8, seq_len=1024, ep=8,
              overrides=dict(layers=2, hidden=512, heads=8, kv_heads=2, ffn=256, experts=16, top_k=2, vocab=1024))
    overlapped = estimate_model("qwen3-30b-a3b", stack=str(stack), **kw)
    plain = estimate_model("qwen3-30b-a3b", **kw)
    assert any("1F1B all-to-all overlap" in a for a in overlapped["assumptions"])
    assert not any("all-to-all" in a for a in plain["assumptions"])


def _fp8_case(layers: int):
    g = load_graph("llama3-8b", batch=1, seq_len=256, overrides=SMALL | {"layers": layers})
    return g, discover_blocks(g), load_cluster("dgx-h100", devices=8)


def test_a_cached_weight_cast_is_priced_for_each_strategys_micro_batches():
    """Costings share a graph's priced programs (`GraphFacts`): one with 8 micro-batches costed after one with 4
    must still spread each weight's FP8 cast over its own 8, as a fresh costing does."""
    from planner.costing.estimate import estimate

    g, st, cluster = _fp8_case(2)
    work = Workload(global_batch=32, seq_len=256, dtype="fp8", execution=load_execution("megatron-core-2024"))
    few, many = Strategy(dp=8, micro_batch=1), Strategy(pp=2, dp=4, micro_batch=1)
    for first, second in ((few, many), (many, few)):
        shared = GraphFacts(g, st)
        estimate(g, st, cluster, work, first, facts=shared)
        assert estimate(g, st, cluster, work, second, facts=shared).step_time_s == pytest.approx(
            estimate(g, st, cluster, work, second, facts=GraphFacts(g, st)).step_time_s, rel=1e-12)


def test_the_search_bound_stays_under_an_estimate_that_spreads_its_weight_casts():
    """A region's representative runs one micro-batch; the strategies it bounds may run 64, each paying 1/64 of a
    cached weight cast: the bound prices the cast at the least any of them pays, and stays under their estimates."""
    from planner.costing.estimate import estimate
    from planner.costing.stage_costs import stage_costs
    from planner.search.bounds import layer_times, pipeline_bound_s
    from planner.search.representatives import Representatives

    g = load_graph("llama3-8b", batch=1, seq_len=256, overrides=dict(layers=8, vocab=8000))  # 8B's layers: big casts
    st, cluster = discover_blocks(g), load_cluster("dgx-h100", devices=8)
    fp8_gathers = dataclasses.replace(load_execution("torchtitan"), fp8_all_gather=True)
    for execution, zero in ((load_execution("megatron-core-2024"), 1), (load_execution("torchtitan"), 1),
                            (fp8_gathers, 3)):
        work = Workload(global_batch=64, seq_len=256, dtype="fp8", execution=execution)
        rep, rep_work = Representatives(None, work, 8, "megatron", None).representative(1, 1, 1, 1, 1)
        times = layer_times(stage_costs(g, st, cluster, rep_work, rep, facts=GraphFacts(g, st)), work.execution,
                            False, 1, True)
        s = Strategy(pp=8, micro_batch=1, zero=zero)
        step = estimate(g, st, cluster, work, s, facts=GraphFacts(g, st)).step_time_s
        assert pipeline_bound_s(times, 8, s.micro_batches(work), 1) <= step
