"""Model states by ZeRO stage, Korthikanti's activation bytes, pipeline in-flight micro-batches, KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models.memory import (
    MEGATRON_ADAM,
    activation_bytes_per_layer,
    inflight_microbatches,
    kv_cache_bytes,
    mla_kv_cache_bytes,
    model_state_bytes,
    pipeline_activation_bytes,
)

GIB = 2**30


@pytest.mark.parametrize(("stage", "expected"), [
    (0, (2e9, 2e9, 12e9)),          # 16 B/param, nothing sharded
    (1, (2e9, 2e9, 12e9 / 8)),      # optimizer states over dp
    (2, (2e9, 2e9 / 8, 12e9 / 8)),  # and gradients
    (3, (2e9 / 8, 2e9 / 8, 12e9 / 8)),  # and parameters
])
def test_zero_stages_shard_states_over_dp(stage, expected):
    m = model_state_bytes(1e9, zero_stage=stage, dp=8)
    assert (m.params_bytes, m.grads_bytes, m.optimizer_bytes) == pytest.approx(expected)
    assert m.total_bytes == pytest.approx(sum(expected))


def test_zero_paper_example():
    # Rajbhandari 2020, section 1: a 7.5B model on 64-way DP needs 120 GB per device without ZeRO,
    # 31.4 GB with stage 1 (P_os), 16.6 GB with stage 2 (P_os+g), 1.88 GB with stage 3.
    psi, nd = 7.5e9, 64
    gb = [model_state_bytes(psi, zero_stage=s, dp=nd).total_bytes / 1e9 for s in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.88], rel=0.01)
    with pytest.raises(ValueError):
        model_state_bytes(psi, zero_stage=4, dp=nd)


S, B, H, A = 2048, 1, 4096, 32  # 5as/h = 80


@pytest.mark.parametrize(("tp", "sp", "recompute", "per_sbh"), [
    (1, False, "none", 34 + 80),                 # Korthikanti 2022, Table 2: no parallelism
    (8, False, "none", 10 + 24 / 8 + 80 / 8),    # tensor parallel (baseline)
    (8, True, "none", (34 + 80) / 8),            # tensor + sequence parallel
    (8, False, "selective", 10 + 24 / 8),        # tensor parallel + selective recompute
    (8, True, "selective", 34 / 8),              # tensor + sequence parallel + selective recompute
    (8, False, "full", 2),
    (8, True, "full", 2 / 8),
])
def test_korthikanti_activation_bytes_per_layer(tp, sp, recompute, per_sbh):
    got = activation_bytes_per_layer(seq=S, micro_batch=B, hidden=H, heads=A, tp=tp, sp=sp, recompute=recompute)
    assert got == pytest.approx(S * B * H * per_sbh, rel=1e-12)


def test_inflight_microbatches_per_schedule():
    assert [inflight_microbatches("1f1b", pp=4, microbatches=8, stage=i) for i in range(4)] == [4, 3, 2, 1]
    assert inflight_microbatches("1f1b", pp=4, microbatches=2, stage=0) == 2
    assert inflight_microbatches("gpipe", pp=4, microbatches=8, stage=3) == 8
    p, v = 35, 3
    first = inflight_microbatches("interleaved", pp=p, microbatches=280, virtual_stages=v)
    assert first == pytest.approx(p * (1 + (p - 1) / (p * v)))  # Korthikanti section 4.2.3
    assert inflight_microbatches("interleaved", pp=4, microbatches=8, virtual_stages=1) == 4
    assert inflight_microbatches("interleaved", pp=4, microbatches=1, virtual_stages=2) == 1


# Korthikanti 2022, Figure 1 (also in calibration/published_runs.json "memory"): per-GPU GiB.
FIG1 = [
    dict(id="22b", h=6144, L=48, heads=64, seq=2048, tp=8, pp=1, vpp=1, micro_batch=4,
         params_opt_gib=45.56, act_none_gib=59.25, act_sp_selective_gib=9.56),
    dict(id="530b", h=20480, L=105, heads=128, seq=2048, tp=8, pp=35, vpp=3, micro_batch=1,
         params_opt_gib=31.64, act_none_gib=114.02, act_sp_selective_gib=23.08),
]


def _fig1_figures(row):
    layers = row["L"] // row["pp"]
    per_layer = dict(seq=row["seq"], micro_batch=row["micro_batch"], hidden=row["h"], heads=row["heads"], tp=row["tp"])
    schedule = "interleaved" if row["vpp"] > 1 else "1f1b"
    stack = dict(pp=row["pp"], microbatches=8 * row["pp"], virtual_stages=row["vpp"])
    act_none = pipeline_activation_bytes(activation_bytes_per_layer(**per_layer), layers, schedule, **stack)
    act_sel = pipeline_activation_bytes(
        activation_bytes_per_layer(**per_layer, sp=True, recompute="selective"), layers, schedule, **stack)
    params = 12 * layers * row["h"] ** 2 / row["tp"]  # transformer layers of one stage (embeddings aside)
    states = model_state_bytes(params, state=MEGATRON_ADAM).total_bytes  # 18 B/param: fp32 grads
    return states / GIB, act_none / GIB, act_sel / GIB


@pytest.mark.parametrize("row", FIG1, ids=[r["id"] for r in FIG1])
def test_korthikanti_figure1_memory_rows(row):
    states, act_none, act_sel = _fig1_figures(row)
    assert states == pytest.approx(row["params_opt_gib"], abs=0.01)
    assert act_none == pytest.approx(row["act_none_gib"], abs=0.01)
    assert act_sel == pytest.approx(row["act_sp_selective_gib"], abs=0.01)


def test_published_memory_rows():
    path = Path(__file__).parent / "data" / "published_runs.json"  # a copy of calibration/, with its sources
    rows = json.loads(path.read_text())["memory"]
    runs = {(r["h"], r["L"]): r for r in json.loads(path.read_text())["runs"]}
    assert rows
    for row in rows:
        row = {**row, "vpp": runs[(row["h"], row["L"])].get("vpp", 1)}
        states, act_none, act_sel = _fig1_figures(row)
        assert (states, act_none, act_sel) == pytest.approx(
            (row["params_opt_gib"], row["act_none_gib"], row["act_sp_selective_gib"]), abs=0.01)


def test_kv_cache_bytes():
    # Llama-2-70B: 80 layers, 8 KV heads of 128, bf16: 320 KiB per token, 1.25 GiB for 4096 tokens.
    assert kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, seq=4096, batch=1) == 1.25 * GIB
    assert kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, seq=4096, batch=3, bytes_per_value=1) == 1.875 * GIB
    # DeepSeek-V3 MLA: 61 layers, kv_lora_rank 512 + rope 64, bf16: 61 * 576 * 2 B per token.
    assert mla_kv_cache_bytes(layers=61, kv_lora_rank=512, rope_dim=64, seq=1, batch=1) == 61 * 576 * 2
    assert mla_kv_cache_bytes(layers=61, kv_lora_rank=512, rope_dim=64, seq=1000, batch=2) == 61 * 576 * 2 * 2000


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        activation_bytes_per_layer(seq=S, micro_batch=B, hidden=H, heads=A, recompute="some")
    with pytest.raises(ValueError):
        inflight_microbatches("zigzag", pp=2, microbatches=2)
    with pytest.raises(ValueError):
        inflight_microbatches("1f1b", pp=2, microbatches=2, stage=2)
