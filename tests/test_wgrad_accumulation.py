"""A weight-gradient GEMM adds into the step's main gradient on Megatron-family stacks: every micro-batch it reads
and writes each weight's main gradient (grad_bytes wide), where a stack without that buffer writes a fresh 16-bit
gradient. Few tokens per weight (a rank's many local experts at a small micro-batch) make that GEMM bound by HBM:
hand counts on a small MoE layer, the stack field, and the Megatron MoE ModelZoo's Qwen3-235B layout with 512
tokens per local expert against its layout with 4,096.
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from planner.api import _graph_for_costing, make_workload
from planner.calibration import read_runs
from planner.calibration.predict import Predictor
from planner.costing.execution import load_execution, parse_execution
from planner.costing.graph_facts import GraphFacts
from planner.costing.node_times import NodeTimes
from planner.graph.blocks import discover_blocks
from planner.strategy import Strategy

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 512, 8192, 16, 2, 1024


@pytest.fixture(scope="module")
def moe():
    over = dict(layers=1, hidden=HIDDEN, ffn=FFN, heads=8, kv_heads=2, vocab=1000, experts=EXPERTS, top_k=TOP_K)
    graph = _graph_for_costing("mixtral-8x7b", TOKENS, None, over)
    return GraphFacts(graph, discover_blocks(graph))


def _times(facts, accumulate: bool, grad_bytes: float, seq_len: int = TOKENS) -> NodeTimes:
    ex = dataclasses.replace(load_execution("megatron-core"), main_grad_accumulation=accumulate,
                             grad_bytes=grad_bytes)
    work = make_workload("train", 16, seq_len, "bf16", None)
    return NodeTimes(facts, load_cluster("dgx-h100", devices=16), work, Strategy(dp=16, micro_batch=1), ex)


def test_a_weight_gradient_over_few_tokens_moves_its_main_gradient_at_hbm_speed(moe):
    """16 local experts share 1,024 x 2 routed tokens, 128 each: the down projection's weight gradient does
    2 x 128 x 8192 x 512 FLOPs per expert against 8192 x 512 fp32 weights read and written (8 bytes each), 32
    FLOPs a byte, far under H100's ridge (a bf16 gradient written once: 128). Beside the activations it reads
    (the 2,048 routed tokens' 8,192-wide input and 512-wide output gradient, bf16), accumulating in fp32 moves 6
    bytes a weight more, at HBM speed; the forward does not change."""
    cluster = load_cluster("dgx-h100")
    fresh, fp32 = _times(moe, False, 4.0), _times(moe, True, 4.0)
    down = [i for i in range(len(moe.graph.nodes)) if moe.in_routed[i] and moe.work.matrix[i]
            and fresh.forward(i, 1) > 0][-1]
    weights = EXPERTS * FFN * HIDDEN
    assert moe.work.param_bytes[down] / moe.work.float_bytes == weights
    act = TOKENS * TOP_K * (FFN + HIDDEN) * 2.0

    def hbm_s(nbytes: float) -> float:
        return nbytes / (cluster.device.hbm_bytes_per_s * cluster.memory_efficiency(nbytes))

    extra = hbm_s(act + 8.0 * weights) - hbm_s(act + 2.0 * weights)
    assert fp32.backward(down, 1) - fresh.backward(down, 1) == pytest.approx(extra, rel=0.02)
    assert fp32.forward(down, 1) == fresh.forward(down, 1)
    assert fp32.backward(down, 1) > 2.2 * fp32.forward(down, 1)  # no longer two GEMMs of the forward's time


def test_a_weight_gradient_over_many_tokens_stays_bound_by_compute():
    """One Llama 3 8B layer at 4,096 tokens: each projection's weight gradient does 2 x 4096 FLOPs per weight
    against 8 bytes of fp32 main gradient, 1,024 FLOPs a byte, far above H100's ridge: accumulating costs
    nothing there."""
    graph = _graph_for_costing("llama3-8b", 4096, None, dict(layers=1))
    facts = GraphFacts(graph, discover_blocks(graph))
    fresh, fp32 = _times(facts, False, 4.0, 4096), _times(facts, True, 4.0, 4096)
    layer = [i for i in range(len(graph.nodes)) if facts.work.matrix[i] and facts.work.param_bytes[i] > 0
             and "layers.0" in (graph.nodes[i].name or "")]
    assert len(layer) == 7  # q, k, v, o, gate, up, down
    for i in layer:
        assert fp32.backward(i, 1) == pytest.approx(fresh.backward(i, 1), rel=1e-9)


def test_the_stack_field():
    assert load_execution("megatron-core").main_grad_accumulation
    assert load_execution("megatron-core-2024").main_grad_accumulation  # its base's
    assert not load_execution("torchtitan").main_grad_accumulation  # FSDP2 writes each gradient fresh
    text = '[stack]\nbase = "torchtitan"\n[states]\nmain_grad_accumulation = {}\n'
    assert parse_execution(text.format("true"), source="s.toml", default_name="s").main_grad_accumulation


@pytest.mark.calibration
def test_the_modelzoo_layout_with_512_tokens_per_expert_is_slowed_by_its_main_gradients(shared_graphs):
    """TP4·EP8·PP8 gives each of a rank's 16 experts 512 tokens a micro-batch (fp32 main gradients, the
    ModelZoo's --main-grads-dtype fp32): measured 29.0 s, predicted 13 % fast without the accumulation's traffic.
    TP2·EP32·PP8, 4,096 tokens for each of 4 experts, is bound by compute either way."""
    runs = {r.id: r for r in read_runs()}
    p = Predictor(graphs=shared_graphs)
    for rid, moves in (("mz-qwen3-235b-256xh100-bf16-tp4-ep8-pp8", True), ("mz-qwen3-235b-256xh100-bf16-ep32-pp8",
                                                                             False)):
        run = runs[rid]
        fresh = dataclasses.replace(run, execution=dataclasses.replace(run.execution, main_grad_accumulation=False))
        with_it, without = p.predict(run).estimate.step_time_s, p.predict(fresh).estimate.step_time_s
        if moves:
            assert abs(with_it - run.measured_step_s) < abs(without - run.measured_step_s)
            assert with_it / without > 1.03
        else:
            assert with_it == pytest.approx(without, rel=0.005)
