"""The branch-and-bound search: nothing in the space beats it, its bound holds, constraints hold, it is
deterministic under load, and both layout solvers agree."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, estimate_model, make_workload, plan_model
from planner.costing.estimate import estimate
from planner.costing.pipeline_cut import even_split
from planner.costing.graph_facts import GraphFacts
from planner.errors import Infeasible, InvalidInput, SolverTimeout
from planner.graph.blocks import discover_blocks
from planner.search import grid
from planner.search.constraints import NONE, Constraints
from planner.strategy import Strategy

ROOT = Path(__file__).resolve().parents[1]
DENSE_A = ("gpt", dict(layers=4, hidden=512, heads=8, vocab=8000))
MOE = ("mixtral-8x7b", dict(layers=2, hidden=512, heads=8, kv_heads=2, vocab=8000))


def _ends_alone(layers, pp):
    """The cuts of `layers` into pp stages with the embedding alone first, the head alone last, or both, the layers
    split evenly over the other stages (Megatron-Core's accounted split)."""
    out = []
    for first, last in ((1, 0), (0, 1), (1, 1)):
        inner = pp - first - last
        if 1 <= inner <= layers:
            out.append((0,) * first + even_split(layers, inner) + (0,) * last)
    return out


def _every_strategy(model, over, cluster, devices, batch, seq, stack=None):
    """Every combination of the searched knobs (the search's cut: even, or interleaved chunks of the layers with the
    embedding and the loss counted as one each; without interleaving also the cuts with either end alone; no
    offload) scored by `estimate`."""
    graph = _graph_for_costing(model, seq, None, over)
    st = discover_blocks(graph)
    hw = load_cluster(cluster, devices=devices)
    wl = make_workload("train", batch, seq, "bf16", stack)
    facts = GraphFacts(graph, st)
    shape = grid.model_shape(graph, st, facts)
    out = []
    for tp, cp, pp, dp, ep, etp in grid.meshes(shape, hw, wl, NONE):
        for mb in grid.micro_batches(batch // dp, NONE):
            m = batch // (dp * mb)
            for vpp in grid.vpp_degrees(shape.layers, pp, m, NONE):
                zeros = (0, 1, 2, 3) if dp * cp > 1 else (0,)
                cuts = [grid.chunk_cut(shape.layers, pp, vpp)] + (_ends_alone(shape.layers, pp) if pp > 1 and vpp == 1
                                                                   else [])
                for z, rc, cut in itertools.product(zeros, ("none", "selective", "full"), cuts):
                    s = Strategy(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=0 if etp == tp else etp, vpp=vpp,
                                 micro_batch=mb, recompute=rc, zero=z, sp=tp > 1, layouts="searched", stage_layers=cut)
                    out.append((s, estimate(graph, st, hw, wl, s, facts=facts)))
    return out


@pytest.mark.parametrize("model,over,devices,batch,seq,hbm,stack", [
    # (the default stack uncapped on 8 GPUs is the mindspeed case's space under another stack, and the capped
    # case's stack: not repeated)
    # a cap just under the fastest strategy's peak (DP16 at ZeRO-2): a fifth of the 1626 strategies do not fit,
    # and the plan is ZeRO-3, as fast (gpt: its layout programs solve ~10x faster than a grouped-query llama's)
    (*DENSE_A, 16, 16, 2048, 0.24, None),
    (*MOE, 4, 4, 1024, None, None),  # the best plan is expert-parallel (DP4·EP2)
    # a stack that overlaps no data-parallel traffic: the bounds count what it leaves exposed (`dp_floor`; a MoE
    # model's every bound against every strategy scored: tests/test_search_dp_floor.py)
    (*DENSE_A, 8, 16, 1024, None, "mindspeed"),
])
def test_nothing_in_the_space_beats_the_plan_and_the_bound_holds(model, over, devices, batch, seq, hbm, stack):
    plan = plan_model(model, cluster="dgx-h100", devices=devices, global_batch=batch, seq_len=seq, overrides=over,
                      offload=False, mpmd=False, gap=0.0, memory_gib=hbm, time_limit_s=None, stack=stack)
    hw_cap = plan["estimate"]["hbm_gib"]
    every = _every_strategy(model, over, "dgx-h100", devices, batch, seq, stack)
    fitting = [e.step_time_s for s, e in every if e.memory_bytes["peak"] / 2**30 <= hw_cap]
    assert fitting and (hbm is None or len(fitting) < len(every))  # a cap rules some strategies out
    step = plan["estimate"]["step_time_s"]
    assert step <= min(fitting) * (1 + 1e-6)
    bound = plan["search"]["bound_s"]
    assert 0 < bound <= min(e.step_time_s for _, e in every) * (1 + 1e-9)  # below every strategy, fitting or not
    assert plan["search"]["complete"] and plan["search"]["gap"] <= 1e-9 + (step - bound) / step


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_the_widest_expert_group_with_a_narrower_exchange_bounds_that_narrower_group(dispatcher):
    """The bound of a region of one expert degree takes the compute of the widest expert group of its
    micro-batch (less that group's exchange and the all-to-all dispatcher's regrouping) and its own exchange
    (`bounds.exchange_parts`), costing nothing of its own: layer by layer, that is never above the layer's exact
    unavoidable time at the narrower degree (8 experts, 2 layers, 8 H100s; at ep 1 no regrouping is paid)."""
    from planner.costing.stage_costs import stage_costs
    from planner.search.bounds import exchange_parts, layer_times

    graph = _graph_for_costing(MOE[0], 1024, None, MOE[1])
    st = discover_blocks(graph)
    facts = GraphFacts(graph, st)
    hw = load_cluster("dgx-h100", devices=8)
    for mb in (1, 4):
        wl = make_workload("train", 4 * mb, 1024, "bf16", None)
        wl = replace(wl, execution=replace(wl.execution, moe_dispatcher=dispatcher))

        def strategy(ep):
            return Strategy(tp=1, pp=2, dp=4, ep=ep, micro_batch=mb, layouts="searched")

        widest = stage_costs(graph, st, hw, wl, strategy(4), facts=facts)
        own = exchange_parts(facts, hw, wl, strategy(4))
        alone = layer_times(widest, wl.execution, False, mb, False, own=own)  # the micro-batch's region bound
        checked = 0
        for ep in (1, 2):
            exact = layer_times(stage_costs(graph, st, hw, wl, strategy(ep), facts=facts), wl.execution, False, mb,
                                True)
            bound = layer_times(widest, wl.execution, False, mb, True, own=own,
                                exchange=exchange_parts(facts, hw, wl, strategy(ep)))
            assert len(bound.per_layer_s) == len(exact.per_layer_s) == len(alone.per_layer_s) == 2
            for a, b, e in zip(alone.per_layer_s, bound.per_layer_s, exact.per_layer_s):
                assert 0 < a <= b <= e * (1 + 1e-12)
                checked += 1
            if ep > 1:  # the exchange counted is this degree's: more than the widest group's compute alone
                assert sum(bound.per_layer_s) > sum(alone.per_layer_s)
        assert checked == 4


def test_a_fully_fixed_plan_is_the_estimate_of_it():
    model, over = DENSE_A
    fixed = dict(tp=2, pp=2, cp=1, ep=1, vpp=1, dp=2, micro_batch=2, recompute="selective", zero=1)
    kw = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=1024, overrides=over)
    plan = plan_model(model, constraints=fixed, offload=False, **kw)
    s = plan["strategy"]
    assert {k: s[k] for k in fixed} == fixed
    again = estimate_model(model, tp=s["tp"], pp=s["pp"], dp=s["dp"], cp=s["cp"], ep=s["ep"], vpp=s["vpp"],
                           micro_batch=s["micro_batch"], recompute=s["recompute"], sp=s["sp"], zero=s["zero"],
                           stage_layers=tuple(s["stage_layers"]), layouts=s["layouts"], **kw)
    assert again["step_time_s"] == plan["estimate"]["step_time_s"]


def test_constraints_are_kept_and_the_rest_searched():
    model, over = DENSE_A
    kw = dict(cluster="dgx-h100", devices=16, global_batch=32, seq_len=1024, overrides=over, mpmd=False)
    free = plan_model(model, **kw)
    tied = plan_model(model, constraints={"tp": 4, "zero": 3}, **kw)
    assert tied["strategy"]["tp"] == 4 and tied["strategy"]["zero"] == 3
    assert tied["estimate"]["step_time_s"] >= free["estimate"]["step_time_s"] * (1 - free["search"]["gap"] - 1e-9)
    with pytest.raises(InvalidInput, match="--tp 3"):  # 16 devices, and 1,024 tokens, do not split into 3
        plan_model(model, constraints={"tp": 3}, **kw)
    with pytest.raises(InvalidInput, match="unknown constraint"):
        plan_model(model, constraints={"tpp": 2}, **kw)


def test_the_space_holds_every_divisor():
    hw = load_cluster("cloudmatrix384", devices=384)
    wl = make_workload("train", 1536, 4096, "bf16", None)
    shape = grid.ModelShape(layers=61, heads=(128,), experts=256)
    tps = grid.tp_degrees(shape, hw, wl, NONE)
    assert tps == [1, 2, 4, 8, 16, 32, 64, 128]
    assert 128 in grid.cp_degrees(shape, 384, wl, NONE)
    eps = {m[4] for m in grid.meshes(shape, hw, wl, Constraints(tp=8, cp=1))}
    assert eps == {1, 2, 4, 8, 16, 32, 64, 128}  # every divisor of 256 experts that divides 384 ranks
    assert grid.micro_batches(24, NONE) == [1, 2, 3, 4, 6, 8, 12, 24]
    assert grid.vpp_degrees(48, 4, 8, NONE) == [1, 2, 3, 4, 6, 12]


def test_both_layout_solvers_reach_the_same_objective():
    model, over = DENSE_A
    kw = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=1024, overrides=over)
    a = estimate_model(model, tp=4, dp=2, sp=True, layouts="searched", solver="highs", **kw)
    b = estimate_model(model, tp=4, dp=2, sp=True, layouts="searched", solver="cpsat", **kw)
    assert b["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-6)
    pa = plan_model(model, constraints={"tp": 4}, solver="highs", mpmd=False, **kw)
    pb = plan_model(model, constraints={"tp": 4}, solver="cpsat", mpmd=False, **kw)
    assert pb["estimate"]["step_time_s"] == pytest.approx(pa["estimate"]["step_time_s"], rel=1e-6)


def test_a_time_limit_only_stops_and_is_validated():
    model, over = DENSE_A
    kw = dict(cluster="dgx-h100", devices=16, global_batch=32, seq_len=1024, overrides=over, mpmd=False)
    with pytest.raises(InvalidInput, match="--time-limit must be positive"):
        plan_model(model, time_limit_s=0, **kw)
    full = plan_model(model, **kw)
    assert full["search"]["complete"] and "stopped" not in full["search"]["optimal_within"]
    cut = plan_model(model, max_nodes=full["search"]["nodes"] - 1, **kw)  # best so far, marked incomplete
    assert not cut["search"]["complete"] and "stopped by its work budget" in cut["search"]["optimal_within"]
    assert cut["search"]["bound_s"] <= full["estimate"]["step_time_s"] * (1 + 1e-9)
    assert cut["estimate"]["step_time_s"] >= full["estimate"]["step_time_s"] * (1 - full["search"]["gap"] - 1e-9)
    with pytest.raises(SolverTimeout, match="the search of gpt .* stopped by its work budget of 1 nodes after 1 "
                       "nodes, before it scored any strategy") as stopped:  # not "no strategy fits"
        plan_model(model, max_nodes=1, **kw)  # a timeout (exit 4), which whatif never caches
    assert stopped.value.exit_code == 4


def test_an_incomplete_plan_is_never_cached():
    from planner.whatif import cacheable

    assert cacheable({"status": "ok", "search_complete": True})
    assert cacheable({"status": "infeasible", "search_complete": None})
    assert not cacheable({"status": "ok", "search_complete": False})
    assert not cacheable({"status": "timeout", "search_complete": None})
    assert not cacheable({"status": "infeasible", "search_complete": False})  # stopped before anything fit


_HOG = "while True: pass\n"  # busy until killed: no clock in the test


def _plan_file(path: Path, hog: bool) -> bytes:
    """`plan -o` of DENSE_A on 16 devices; the longest --time-limit, so that only the work ends the search (the
    default 60 s could: a plan's time under two hogs is the machine's business, not the test's)."""
    model, over = DENSE_A
    flags = [x for k, v in over.items() for x in (f"--{k}", str(v))]
    args = [sys.executable, "-c", 'import sys; from cli.app import main; sys.argv[0]="hyperplan"; main()', "plan",
            model, *flags, "--cluster", "dgx-h100", "--devices", "16", "--global-batch", "32", "--seq-len", "1024",
            "--time-limit", "86400", "-o", str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG]) for _ in range(2 if hog else 0)]
    try:
        subprocess.run(args, env=env, check=True, capture_output=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return path.read_bytes()


def test_the_same_plan_file_idle_and_with_both_cores_busy(tmp_path):
    idle = _plan_file(tmp_path / "idle.yaml", hog=False)
    busy = _plan_file(tmp_path / "busy.yaml", hog=True)
    assert idle == busy


@pytest.mark.parametrize("beside", ["none", "selective"])
def test_the_plan_recomputes_fully_the_fewest_layers_that_fit(beside, tmp_path):
    """Where the stack's recompute alone is over memory, the search scores the fewest fully recomputed layers per
    chunk that fit (`to_fit.fewest_full_layers`), the other layers running what the stack runs beside them
    (`Execution.full_layers_beside`: Megatron-LM's block method leaves them unrecomputed; a stack that mixes the
    two granularities recomputes them selectively): with a cap between the peaks of 1 and 2 such layers (of 4 per
    chunk), the plan takes 2 beside the stack's policy, not full recompute and not more layers than needed."""
    from planner.api import make_workload

    stack = tmp_path / "mixed.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[recompute]\nfull_layers_beside = "selective"\n')
    kw = dict(cluster="dgx-a100", devices=16, global_batch=8, seq_len=2048, overrides=dict(layers=8, hidden=4096,
              heads=32, vocab=51200), stack=None if beside == "none" else str(stack))
    fixed = dict(tp=8, pp=2, micro_batch=1, vpp=1)
    peaks = [estimate_model("gpt", recompute=beside, full_recompute_layers=k, sp=True, **fixed, **kw)
             ["memory_gib"]["peak"] for k in range(5)]
    assert all(a > b for a, b in zip(peaks, peaks[1:]))  # memory falls with every layer recomputed fully
    ex = make_workload("train", 8, 2048, "bf16", kw["stack"]).execution
    assert ex.full_layers_beside == beside
    usable = (peaks[1] + peaks[2]) / 2  # GiB a plan may use: between one and two full layers' peaks
    cap = usable / (1.0 - ex.allocator_reserve) + ex.runtime_reserve_gib
    plan = plan_model("gpt", memory_gib=cap, offload=False, mpmd=False, time_limit_s=None, constraints=fixed, **kw)
    s = plan["strategy"]
    assert (s["recompute"], s["full_recompute_layers"]) == (beside, 2), s["summary"]
