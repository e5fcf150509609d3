"""The 1F1B all-to-all overlap's pairing of two micro-batches' layers, and the two-stream runs it rests on:
timelines worked out by hand from Megatron-LM's TransformerLayerSchedulePlan.run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cost_models import load_cluster
from cost_models.overlap import exposed_s
from cost_models.schedule import pipeline_time
from cost_models.streams import COMM, COMPUTE, Task, run_streams
from planner.calibration.published import ERRORS
from planner.caveats import OVERLAP_WITNESS, assumptions
from planner.costing.execution import load_execution
from planner.costing.moe_pairing import MoELayerTimes, _chain_s, paired_s
from planner.strategy import Workload


def test_a_transfer_beside_compute_hides_as_the_overlap_law_says():
    for eff in (1.0, 0.5, 0.4):
        ends = run_streams([Task(COMPUTE, 2.0), Task(COMM, 1.0)], eff)
        assert ends[0] == pytest.approx(2.0)
        assert max(ends) - 2.0 == pytest.approx(exposed_s(1.0, 2.0, eff))  # 0, 0, 0.2 s
    # a transfer that waits for its input starts when the compute ends, and then runs alone at full rate
    assert run_streams([Task(COMPUTE, 1.0), Task(COMM, 1.0, (0,))], 0.5) == pytest.approx([1.0, 2.0])
    assert run_streams([Task(COMPUTE, 5.0), Task(COMM, 0.0)], 0.0) == pytest.approx([5.0, 0.0])


def test_a_transfer_holding_sms_slows_the_compute_beside_it_and_runs_at_its_own_pace():
    """10 s of compute beside a 4 s transfer whose kernels hold a fifth of the SMs: the transfer ends at 4 s, by
    when the compute has done 3.2 s of its work; the other 6.8 s run alone, so it ends at 10.8 s."""
    assert run_streams([Task(COMPUTE, 10.0), Task(COMM, 4.0)], 1.0, 0.8) == pytest.approx([10.8, 4.0])
    # the pairing with a share: the same small exchanges, each layer's compute 6 s, now slowed while they run
    layer = MoELayerTimes(**LAYER, exchange_fwd=2.0, exchange_bwd=2.0)
    assert paired_s(layer, 1, 1, 0.5, sm_share=0.2) > paired_s(layer, 1, 1, 1.0) == pytest.approx(6.0)
    with pytest.raises(ValueError):
        run_streams([Task(COMPUTE, 1.0)], 1.0, 0.0)


def test_streams_refuse_what_cannot_run():
    with pytest.raises(ValueError):
        run_streams([Task(COMPUTE, 1.0, (1,)), Task(COMM, 1.0)])  # waits on a later task
    with pytest.raises(ValueError):
        run_streams([Task(COMPUTE, 1.0)], 1.5)


#: One layer: pre-dispatch 1 s forward, 2 s backward; experts 1 s and 2 s.
LAYER = dict(pre_fwd=1.0, experts_fwd=1.0, pre_bwd=2.0, experts_bwd=2.0)


def test_small_exchanges_hide_entirely_behind_the_paired_layer():
    # combine bwd [0,1] | pre fwd [0,1]; experts dgrad [1,2] | dispatch fwd [1,2]; wgrad [2,3] | dispatch bwd
    # [2,3]; experts fwd [3,4]; combine fwd [4,5] | pre dgrad [4,5]; pre wgrad [5,6]: the compute, 6 s
    layer = MoELayerTimes(**LAYER, exchange_fwd=2.0, exchange_bwd=2.0)
    assert layer.unpaired_s == pytest.approx(10.0)
    assert _chain_s(layer, 1, 1.0) == pytest.approx(6.0)
    assert _chain_s(layer, 2, 1.0) == pytest.approx(12.0)


def test_large_exchanges_wait_on_the_layers_dependencies():
    # combine bwd [0,2] | pre fwd [0,1]; experts dgrad waits for it [2,3] | dispatch fwd [2,4]; wgrad [3,4];
    # dispatch bwd [4,6] | experts fwd [4,5]; combine fwd [6,8] | pre dgrad waits for the dispatch [6,7], wgrad
    # [7,8]: 8 s, where the shared-window law would give max(6, 8) = 8 only by hiding 6 s of the 8 s exchanged
    layer = MoELayerTimes(**LAYER, exchange_fwd=4.0, exchange_bwd=4.0)
    assert _chain_s(layer, 1, 1.0) == pytest.approx(8.0)
    # the combine before the forward's pre-dispatch: with a short forward it shows although compute is left
    lopsided = MoELayerTimes(pre_fwd=0.25, experts_fwd=2.0, pre_bwd=0.5, experts_bwd=4.0, exchange_fwd=2.0,
                             exchange_bwd=2.0)
    # combine bwd [0,1] | pre fwd [0,.25]; dgrad [1,3] | dispatch fwd [1,2]; dispatch bwd [3,4] | wgrad [3,5];
    # experts fwd [5,7]; combine fwd [7,8] | pre dgrad [7,7.25], wgrad [7.25,7.5]: 8 s for 6.75 s of compute
    assert _chain_s(lopsided, 1, 1.0) == pytest.approx(8.0)


def test_an_eager_host_issues_each_transfer_after_the_compute_before_it():
    # run()'s order with the host issuing each kernel as the one before runs: combine bwd [0,2] | pre fwd [0,1];
    # dgrad [2,3]; dispatch fwd, issued after the dgrad [3,5] | wgrad [3,4]; dispatch bwd, issued after the wgrad,
    # behind the dispatch fwd [5,7] | experts fwd [5,6]; combine fwd [7,9] | pre dgrad [7,8], wgrad [8,9]: 9 s where
    # a graph-issued step takes 8 s (above); the small exchanges still hide whole
    layer = MoELayerTimes(**LAYER, exchange_fwd=4.0, exchange_bwd=4.0)
    assert paired_s(layer, 1, 1, 1.0, host_ordered=True) == pytest.approx(9.0)
    assert paired_s(layer, 1, 1, 1.0) == pytest.approx(8.0)
    small = MoELayerTimes(**LAYER, exchange_fwd=2.0, exchange_bwd=2.0)
    assert paired_s(small, 1, 1, 1.0, host_ordered=True) == pytest.approx(6.0)


def test_each_dependency_of_the_schedule_shows_in_two_layers():
    # worked by hand from run()'s order; each case changes if one dependency or the delayed wgrad goes
    combine_waits_for_dgrad = MoELayerTimes(0.1, 1.0, 2.0, 1.0, 0.2, 6.0)  # 15.1 without that wait
    delayed = MoELayerTimes(1.0, 1.0, 4.0, 1.0, 1.0, 4.0)
    forward_waits_for_combine = MoELayerTimes(1.0, 1.0, 1.0, 1.0, 6.0, 1.0)  # 15.5 without that wait
    assert _chain_s(combine_waits_for_dgrad, 2, 1.0) == pytest.approx(16.0)
    assert _chain_s(forward_waits_for_combine, 2, 1.0) == pytest.approx(16.0)
    # combine bwd [0,2] | pre fwd [0,1]; experts dgrad [2,2.5] | dispatch fwd [2,2.5]; wgrad [2.5,3] | dispatch
    # bwd [2.5,4.5]; experts fwd [3,4]; combine fwd [4.5,5] | pre dgrad [4.5,6.5], wgrad [6.5,8.5]; the next
    # layer's combine bwd waits for that dgrad: [6.5,8.5], and so on to 16 s
    assert _chain_s(delayed, 2, 1.0) == pytest.approx(16.0)
    # not delayed (Megatron-FSDP): the dispatch bwd waits for the experts' whole backward, the next combine bwd
    # for the attention side's: 18 s
    assert _chain_s(delayed, 2, 1.0, delayed=False) == pytest.approx(18.0)


def test_the_overlap_efficiency_slows_a_transfer_beside_compute():
    # combine bwd (1 s) beside a 2 s pre-dispatch forward at efficiency 0.5 ends with it; the dispatch bwd (1 s)
    # then runs alone: 3 s. At 0.4 the combine has 0.2 s left at 2 s: 3.2 s
    layer = MoELayerTimes(2.0, 0.0, 0.0, 0.0, 0.0, 2.0)
    assert _chain_s(layer, 1, 0.5) == pytest.approx(3.0)
    assert _chain_s(layer, 1, 0.4) == pytest.approx(3.2)


def test_the_pairing_runs_only_where_megatron_core_allows_the_overlap():
    from dataclasses import replace

    from planner.costing.execution import load_execution
    from planner.costing.moe_pairing import delays_wgrad, unpaired_why
    from planner.strategy import Strategy

    on = replace(load_execution("megatron-core"), overlap_ep_comm=True)
    assert unpaired_why(Strategy(ep=8, dp=8), on) is None
    assert unpaired_why(Strategy(ep=4, dp=4, pp=2, vpp=2), on) is None
    assert "interleaved" in unpaired_why(Strategy(ep=4, dp=4, pp=2), on)
    assert "expert parallelism" in unpaired_why(Strategy(dp=8), on)
    assert "full recompute" in unpaired_why(Strategy(ep=8, dp=8, recompute="full"), on)
    moe = replace(on, selective="modules", recompute_modules=("moe",))
    assert "moe module" in unpaired_why(Strategy(ep=8, dp=8, recompute="selective"), moe)
    assert unpaired_why(Strategy(ep=8, dp=8), load_execution("megatron-core")) is not None
    assert delays_wgrad(Strategy(ep=8, dp=8, zero=1)) and not delays_wgrad(Strategy(ep=8, dp=8, zero=3))


def test_long_chunks_repeat_the_simulated_layers_increment():
    layer = MoELayerTimes(pre_fwd=0.3, experts_fwd=0.7, pre_bwd=0.6, experts_bwd=1.4, exchange_fwd=1.1,
                          exchange_bwd=1.3)
    for eff in (1.0, 0.8):
        assert paired_s(layer, 12, 1, eff) == pytest.approx(_chain_s(layer, 12, eff), rel=1e-9)
        assert paired_s(layer, 12, 3, eff) == pytest.approx(3 * _chain_s(layer, 4, eff), rel=1e-9)
        assert paired_s(layer, 2, 4, eff) == pytest.approx(2 * _chain_s(layer, 1, eff), rel=1e-9)
        assert paired_s(layer, 3, 2, eff) == pytest.approx(3 * _chain_s(layer, 1, eff), rel=1e-9)  # 1.5 a chunk
        assert paired_s(layer, 12, 1, eff) <= 12 * layer.unpaired_s


def test_a_pipeline_runs_its_steady_state_at_the_paired_pace():
    # one stage: the first forward and the last backward alone, 7 pairs between them
    one = pipeline_time([1.0], [2.0], 8, stage_steady_s=[2.5])
    assert one.total_s == pytest.approx(7 * 2.5 + 3.0)
    assert one.unpaired_s == pytest.approx(0.5)  # over 8 steps at the paired pace
    # interleaved, 2 stages of 2 chunks, 4 micro-batches: the first stage runs w = 2(p-1) + (v-1)p + 1 = 5 of its
    # 8 chunk steps alone each way; 3 s a micro-batch alone, 2 s paired: (4 - 5/2) 2 + (5-1)/2 3 + 6/2 = 12 s
    t = pipeline_time([1.0] * 2, [2.0] * 2, 4, "interleaved", 2, stage_steady_s=[2.0] * 2)
    assert t.total_s == pytest.approx(12.0)
    assert (t.busy_s, t.bubble_s, t.unpaired_s) == pytest.approx((8.0, 4.0, 3.0))  # paced: 3.5 x 2 + 4/2 = 9 s
    assert pipeline_time([1.0] * 2, [2.0] * 2, 4, "interleaved", 2).total_s == pytest.approx(3.5 * 3 + 3.0)
    with pytest.raises(ValueError):
        pipeline_time([1.0], [2.0], 8, stage_steady_s=[3.5])  # a pair cannot take longer than both alone


def _step(parts, **strategy):
    from dataclasses import replace
    from types import SimpleNamespace

    from cost_models import load_cluster
    from planner.costing.execution import load_execution
    from planner.costing.stage_costs import StageCost
    from planner.costing.step_time import stage_step
    from planner.strategy import Strategy

    cluster = replace(load_cluster("dgx-h100", devices=8), dp_overlap_efficiency=1.0)
    # the exchange at the overlap efficiency (1 here), its SMs free: the hand timelines above
    execution = replace(load_execution("megatron-core"), overlap_ep_comm=True, ep_comm_sm_share=0.0)
    cost = StageCost(0, ("layer",), parts, 0.0, 0.0, 0.0, 0.0, {}, 0.0, 1.0)
    return stage_step(cost, cluster, SimpleNamespace(execution=execution), Strategy(**strategy), 2.0)


def test_a_stage_pairs_its_moe_layers_in_the_window_the_other_overlaps_leave():
    from planner.costing.block_costs import Parts

    moe = dict(forward=2.0, backward=4.0, ep_fwd=2.0, ep_bwd=2.0, moe_layers=1.0, moe_fwd=2.0, moe_bwd=4.0,
               experts_fwd=1.0, experts_bwd=2.0)
    alone = _step(Parts(**moe), ep=8, dp=8)
    assert (alone.forward_s, alone.backward_s) == pytest.approx((4.0, 6.0))  # unpaired: the exchange shows
    assert alone.steady_s == pytest.approx(6.0)  # paired: the hand timeline above
    assert alone.exposed["ep"] == pytest.approx(0.0)
    # TP overlap already hides 6 s behind the same 6 s of compute: nothing is left for the pairing to hide in
    busy = _step(Parts(**moe, tp_fwd=2.0, tp_bwd=4.0, tp_fwd_hidden=2.0, tp_bwd_hidden=4.0), tp=2, dp=4, ep=4, sp=True)
    assert busy.steady_s == pytest.approx(busy.forward_s + busy.backward_s) == pytest.approx(10.0)
    assert busy.exposed["ep"] == pytest.approx(4.0)
    # a pipeline without interleaving: Megatron-Core refuses the overlap, so nothing pairs
    assert _step(Parts(**moe), ep=4, dp=4, pp=2).steady_s == pytest.approx(10.0)


def test_an_estimate_says_when_the_stacks_overlap_cannot_apply(tmp_path):
    from planner.api import estimate_model

    stack = tmp_path / "a2a.toml"
    stack.write_text('[stack]\nbase = "megatron-core"\n[overlap]\noverlap_ep_comm = true\n', encoding="utf-8")
    kw = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=512, ep=4, stack=str(stack),
              overrides=dict(layers=4, hidden=256, heads=4, kv_heads=2, ffn=128, experts=8, top_k=2, vocab=512))
    piped = estimate_model("qwen3-30b-a3b", pp=2, **kw)
    assert any("does not apply to this layout (with a pipeline it needs the interleaved" in w
               for w in piped["warnings"])
    assert not any("does not apply" in w for w in estimate_model("qwen3-30b-a3b", pp=2, vpp=2, **kw)["warnings"])


def test_the_overlaps_caveat_cites_its_witness_runs_error_as_last_computed():
    """An estimate with the 1F1B overlap says how far off DeepSeek-V3 on 1,024 H100s, the held-out run that uses
    it, comes out today (published_errors.json, which tests/test_calibration.py keeps current), not a figure of
    an older fit."""
    err = next(r["error"] for r in json.loads(ERRORS.read_text())["runs"] if r["id"] == OVERLAP_WITNESS)
    ex = dataclasses.replace(load_execution("megatron-core"), overlap_ep_comm=True)
    notes = assumptions(load_cluster("dgx-h100"), Workload(global_batch=8, seq_len=4096, dtype="bf16", execution=ex))
    said = [n for n in notes if "1F1B all-to-all overlap" in n]
    assert len(said) == 1
    assert f"comes out {abs(100 * err):.0f} % {'fast' if err < 0 else 'slow'} with it" in said[0]
