"""The inference cost model: decode is memory-bound at small batch, quantised weights stream faster, experts and
caches are costed where they live, offloading the KV cache lengthens the context that fits."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cost_models import load_cluster, place_group
from cost_models.expert_dispatch import exchange_s, expected_groups, expected_touched
from planner.errors import InvalidInput
from planner.inference.phase_cost import Layout, Precision, StepModel, attention_core_s, serving_attention_kernel
from planner.inference.search import Serving, best_phase, max_context
from planner.inference.serve import load_profile

H100 = load_cluster("dgx-h100", devices=8)
CM = load_cluster("cloudmatrix384")


@pytest.fixture(scope="module")
def llama70():
    return load_profile("llama3-70b")


@pytest.fixture(scope="module")
def llama8():
    return load_profile("llama3-8b")


@pytest.fixture(scope="module")
def deepseek():
    return load_profile("deepseek-v3")


def decode(profile, hw, lay, batch=1, context=1024, dtype="bf16", **kw):
    return StepModel(profile, hw, lay, Precision(dtype=dtype)).step(phase="decode", batch=batch, q=1,
                                                                     context=context, **kw)


def test_small_batch_decode_tracks_weight_bytes_over_hbm_bandwidth(llama70, llama8):
    lay = Layout(tp=8, dp=1)
    bound = llama70.params * 2 / 8 / H100.device.hbm_bytes_per_s  # every weight read once per token
    t1 = decode(llama70, H100, lay).pass_s
    assert decode(llama70, H100, lay).limiter == "hbm_bandwidth"
    assert bound < t1 < 1.8 * bound  # never faster than the roofline, near it (0.74 of peak HBM at best)
    assert decode(llama70, H100, lay, batch=8).pass_s < 1.08 * t1  # 8 sequences ride on the same weight reads
    # time scales with the bytes streamed: a model 8.8x smaller, or weights at one byte
    small = decode(llama8, H100, lay).pass_s
    assert 4.0 < t1 / small < 12.0
    fp8 = decode(llama70, H100, lay, dtype="fp8")
    assert fp8.breakdown_s["hbm"] == pytest.approx(decode(llama70, H100, lay).breakdown_s["hbm"] / 2, rel=0.25)


def test_large_batch_decode_becomes_compute_or_cache_bound(llama8):
    lay = Layout(tp=1, dp=8)
    small, large = decode(llama8, H100, lay, batch=1), decode(llama8, H100, lay, batch=512, context=4096)
    assert large.pass_s > 5 * small.pass_s
    per_token = [large.pass_s / 512, small.pass_s]
    assert per_token[0] < per_token[1] / 20  # batching amortises the weights


def test_tensor_parallel_all_reduce_only_with_tp(llama70):
    assert decode(llama70, H100, Layout(tp=8, dp=1)).breakdown_s["tp_comm"] > 0
    one = load_profile("llama3-8b")
    assert decode(one, H100, Layout(tp=1, dp=8)).breakdown_s["tp_comm"] == 0


def test_mla_cache_is_70272_bytes_per_token_and_not_split_by_tp(deepseek):
    assert deepseek.cached_elements_per_token * 2 == 70272  # 61 layers x 576 x bf16
    hw = load_cluster("dgx-h100", devices=16)
    a = decode(deepseek, hw, Layout(tp=8, dp=2, ep=16), batch=4, context=8192).memory_bytes["kv_cache"]
    b = decode(deepseek, hw, Layout(tp=1, dp=16, ep=16), batch=4, context=8192).memory_bytes["kv_cache"]
    assert a == pytest.approx(b)  # every tensor rank keeps the whole latent of its sequences
    assert b == pytest.approx(4 * 8192 * 70272)


def test_gqa_cache_splits_by_kv_heads_up_to_their_count(llama70):
    hw = load_cluster("dgx-h100", devices=16)
    kv = {tp: decode(llama70, hw, Layout(tp=tp, dp=16 // tp), batch=2).memory_bytes["kv_cache"] for tp in (1, 8)}
    assert kv[1] == pytest.approx(8 * kv[8])  # 8 KV heads: one per rank at tp 8


def test_sliding_window_layers_cache_and_read_their_window_only():
    """gpt-oss-20b: 24 layers of 8 KV heads of 64, every other one banded to 128 tokens. At 8,192 tokens of context
    the decode cache is 12 x 8,192 + 12 x 128 token-layers of 2 x 8 x 64 bf16 values, a little over half of what
    caching every token in every layer would hold, and the banded layers' attention reads 128 keys: less time."""
    oss = load_profile("gpt-oss-20b")
    full = dataclasses.replace(oss, parts=tuple(dataclasses.replace(
        p, attention=tuple(dataclasses.replace(a, window=0) for a in p.attention)) for p in oss.parts))
    lay = Layout(tp=1, dp=8)
    kv = decode(oss, H100, lay, batch=4, context=8192).memory_bytes["kv_cache"]
    assert kv == pytest.approx(4 * (12 * 8192 + 12 * 128) * 2 * 8 * 64 * 2)
    assert kv / decode(full, H100, lay, batch=4, context=8192).memory_bytes["kv_cache"] == pytest.approx(
        (8192 + 128) / (2 * 8192))
    model, banded = StepModel(oss, H100, lay, Precision()), oss.layers[0].attention[0]
    wide = dataclasses.replace(banded, window=0)
    assert banded.window == 128
    assert attention_core_s(model, banded, "decode", 64, 1, 8192)[0] < attention_core_s(model, wide, "decode", 64, 1,
                                                                                       8192)[0]


def test_expected_touched_experts_is_the_occupancy_law():
    assert expected_touched(1, 8, 256) == pytest.approx(8)
    assert expected_touched(10_000, 8, 256) == pytest.approx(256)
    n = 20
    assert expected_touched(n, 8, 256) == pytest.approx(256 * (1 - (1 - 8 / 256) ** n))
    assert expected_groups(8, 1) == 1 and expected_groups(8, 4) == pytest.approx(4 * (1 - 0.75**8))


def test_decode_of_few_tokens_reads_only_the_experts_they_reach(deepseek):
    hw = load_cluster("dgx-h100", devices=8)
    lay = Layout(tp=1, dp=8, ep=8)
    few = decode(deepseek, hw, lay, batch=1, dtype="fp8")
    many = decode(deepseek, hw, lay, batch=64, dtype="fp8")
    assert few.pass_s < 0.5 * many.pass_s  # 8 tokens x 8 experts touch ~60 of 256 experts per layer


def test_expert_dispatch_crosses_slow_levels_and_dedupes_in_hierarchy():
    hw = load_cluster("dgx-h100", devices=32)
    spans = place_group(hw, 32)
    direct = exchange_s(4096, 8, 7168, spans)
    hier = exchange_s(4096, 8, 7168, spans, hierarchical=True)
    assert 0 < hier < direct
    inside = exchange_s(4096, 8, 7168, place_group(load_cluster("dgx-h100", devices=8), 8))
    assert inside < direct  # NVLink only


def test_prefill_attention_is_causal_and_grows_quadratically(llama8):
    m = StepModel(llama8, H100, Layout(tp=8, dp=1), Precision())
    short = m.step(phase="prefill", batch=1, q=8192, context=8192)
    long = m.step(phase="prefill", batch=1, q=32768, context=32768)
    assert long.pass_s > 4 * short.pass_s  # linear part x4, attention x16
    assert short.limiter == "compute"


def test_prefill_attention_runs_at_flashattention3s_measured_rate(llama8):
    # Shah et al. 2024 (FlashAttention-3), Figures 5-7: causal, head dim 128, 16K tokens on H100 SXM, about 610
    # TFLOP/s forward (counting the causal half). Serving costs it with training's law and vLLM's Hopper kernel.
    assert serving_attention_kernel(H100) == "flash3"
    m = StepModel(llama8, H100, Layout(tp=1, dp=1), Precision())
    a = llama8.layers[0].attention[0]
    q = 16384
    t, compute_bound = attention_core_s(m, a, "prefill", 1, q, q)
    assert compute_bound
    assert q * (q + 1) / 2 * a.prefill_pair_flops / t == pytest.approx(610e12, rel=0.08)
    short, _ = attention_core_s(m, a, "prefill", 1, 1024, 1024)  # short rows: the per-row fixed costs show
    assert 1024 * 1025 / 2 * a.prefill_pair_flops / short < 0.8 * 610e12


def test_decode_attention_streams_the_cache_at_hbm_rate(llama8):
    m = StepModel(llama8, H100, Layout(tp=1, dp=1), Precision())
    a = llama8.layers[0].attention[0]
    t, compute_bound = attention_core_s(m, a, "decode", 64, 1, 8192)
    cache = 64 * 8192 * 2 * 8 * 128 * 2  # sequences x tokens x (K, V) x 8 KV heads x head dim 128 x bf16
    assert not compute_bound
    assert 0.6 * 3.35e12 < cache / t < 3.35e12  # H100 SXM's 3.35 TB/s, at the memory law's efficiency


def test_serving_kernel_falls_back_to_the_presets_own():
    # no FlashAttention-3 off Hopper: the preset's default kernel (Blackwell's measured cuDNN, Ampere's FA2)
    assert serving_attention_kernel(load_cluster("dgx-b200", devices=8)) == "cudnn"
    assert serving_attention_kernel(load_cluster("dgx-a100", devices=8)) == "flash2"
    assert serving_attention_kernel(CM) == "npu_fusion_attention"


def test_memory_holds_weights_cache_and_workspace(deepseek):
    hw = load_cluster("dgx-h100", devices=144)
    m = StepModel(deepseek, hw, Layout(dp=144, ep=144), Precision(dtype="fp8"))
    mem = m.memory(phase="decode", batch=128, q=1, context=4989)
    assert mem["weights"] == pytest.approx((deepseek.params - sum(l.experts.experts * l.experts.params_per_expert
                                                                  for l in deepseek.layers if l.experts))
                                           + sum(l.experts.experts * l.experts.params_per_expert
                                                 for l in deepseek.layers if l.experts) / 144)
    assert mem["total"] == pytest.approx(mem["weights"] + mem["kv_cache"] + mem["workspace"])
    assert m.fits(mem) and not m.fits(m.memory(phase="decode", batch=512, q=1, context=4989))


def test_kv_offload_lengthens_the_context_that_fits(deepseek):
    """Issue 6's check. HyperParallel reports 71K -> 123K tokens with KV offload on its supernode; ours, for
    DeepSeek-V3 in int8 on two CloudMatrix384 nodes (16 NPUs, 8 sequences per NPU), is printed below."""
    serving = Serving(prompt_len=1, gen_len=1, precision=Precision(dtype="int8"))
    lay = Layout(dp=16, ep=16)
    plain = max_context(deepseek, CM, serving, lay, batch=8)
    offloaded = max_context(deepseek, CM, serving, lay, batch=8, kv_offload=0.9)
    print(f"\nlongest context, DeepSeek-V3 int8, 16 NPUs, batch 8 per NPU: {plain} -> {offloaded} tokens with "
          f"90% of the KV cache in pooled DRAM")
    assert plain > 50_000 and offloaded > 2 * plain
    st = decode(deepseek, CM.scaled(16), lay, batch=8, context=offloaded, dtype="int8", kv_offload=0.9)
    assert st.fits and st.breakdown_s["offload"] > 0  # the traffic is costed


def test_a_faster_host_link_hides_more_of_the_offloaded_cache(llama8):
    lay = Layout(tp=1, dp=8)
    pooled = decode(llama8, CM.scaled(8), lay, batch=64, context=8192, kv_offload=0.5)
    pcie = decode(llama8, H100, lay, batch=64, context=8192, kv_offload=0.5)
    assert pooled.breakdown_s["offload"] < pcie.breakdown_s["offload"]


def test_search_offloads_the_cache_only_when_it_pays(llama70):
    """Offloaded cache is read over the tier's link every step, so it costs throughput: the search uses it when
    nothing fits without it, and not when HBM holds the batch the targets allow."""
    hw = dataclasses.replace(CM, device=dataclasses.replace(CM.device, hbm_bytes=40 * 2**30)).scaled(8)
    serving = Serving(prompt_len=600_000, gen_len=1024, precision=Precision(), tpot_s=2.0)
    assert best_phase(llama70, hw, dataclasses.replace(serving, offload=False), "decode", 8) is None
    long = best_phase(llama70, hw, serving, "decode", 8)
    assert long is not None and long.kv_offload > 0 and long.step.breakdown_s["offload"] > 0
    short = best_phase(llama70, hw, dataclasses.replace(serving, prompt_len=8192, tpot_s=0.2), "decode", 8)
    assert short.kv_offload == 0


def test_precision_and_offload_errors_are_one_sentence():
    with pytest.raises(InvalidInput, match="serving runs weights in"):
        Precision(dtype="fp32")
    prof = load_profile("llama3-8b")
    hw = dataclasses.replace(H100, memory_tiers=())
    with pytest.raises(InvalidInput, match="no memory tier"):
        decode(prof, hw, Layout(dp=8), kv_offload=0.5)
    assert math.isfinite(decode(prof, hw, Layout(dp=8)).pass_s)


def test_prefill_and_decode_groups_end_anywhere_on_a_flat_fabric_but_on_node_boundaries_elsewhere():
    """CloudMatrix384's UB fabric is as fast between nodes as inside one, so 16 NPUs may split 12 + 4; a DGX's
    InfiniBand is not, so its groups stay whole 8-GPU nodes (planner/search/program_groups.py)."""
    from planner.api import plan_inference

    # a 26 ms decode target, where splitting pays at both presets' efficiency (at 40 ms one program wins; 30 ms
    # is at CloudMatrix's edge, where its 910B plateau of 0.549 co-locates and 0.551 split)
    kw = dict(prompt_len=2048, gen_len=256, ttft_ms=1000, tpot_ms=26, overrides={"layers": 8})
    cm = plan_inference("llama3-70b", cluster="cloudmatrix384", devices=16, **kw)
    dgx = plan_inference("llama3-70b", cluster="dgx-h100", devices=32, **kw)
    assert cm["serving"] == "disaggregated" and cm["prefill"]["devices"] % 8 != 0
    assert cm["prefill"]["devices"] + cm["decode"]["devices"] == 16
    assert dgx["serving"] == "disaggregated"
    assert dgx["prefill"]["devices"] % 8 == 0 and dgx["decode"]["devices"] % 8 == 0
