"""One MoE layer alone, predicted against Megatron-LM's own measurement of it on 8 H100s (EP8, 4096 tokens per GPU).

    python benchmarks/bench_moe_layer.py

Megatron-LM times a single MoELayer (router, dispatch, experts, combine; no attention) forward and backward
for a Mixtral proxy (hidden 4096, 8 experts of FFN 14336, top-2) and a DeepSeek proxy (hidden 7168, 32 experts
of FFN 2048, top-8, one shared expert of 2048) with three dispatchers, in BF16 and in blockwise FP8
(tests/data/moe_layer_runs.json, copied from its moe_perf baseline). The prediction is the same layer of a
one-layer zoo model on dgx-h100 under the megatron-core stack: the estimate's seconds of the nodes of the MoE
block's `mlp` scope (router, permutation, shared and routed experts, combine) plus its expert exchange; the
flex dispatchers (DeepEP, HybridEP) are costed as the hierarchical `deepep` dispatcher, and FP8 rows by the
stack's per-tensor current scaling (the measured rows use blockwise scaling). No row here was fitted: it checks
the kernel-level figures the step-time fit rests on. The DeepSeek proxy routes each token to at most 4 of its 8
expert groups (one a rank here), which the flex dispatchers' one copy per destination rank gains from and the
all-to-all dispatcher's copy per (token, expert) pair does not. Takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models import load_cluster  # noqa: E402
from planner.api import load_graph  # noqa: E402
from planner.costing.execution import load_execution  # noqa: E402
from planner.costing.graph_facts import GraphFacts  # noqa: E402
from planner.costing.node_times import NodeTimes  # noqa: E402
from planner.costing.stage_costs import stage_costs  # noqa: E402
from planner.graph.blocks import discover_blocks  # noqa: E402
from planner.strategy import Strategy, Workload  # noqa: E402

DATA = ROOT / "tests" / "data" / "moe_layer_runs.json"
#: zoo models and overrides that build each proxy as one MoE layer (the attention beside it is not counted)
PROXIES = {
    "mixtral": ("mixtral-8x7b", dict(layers=1)),
    "deepseek": ("deepseek-v3", dict(layers=1, dense_layers=0, hidden=7168, expert_ffn=2048, experts=32, top_k=8,
                                     shared_experts=1)),
}
DISPATCHERS = {"alltoall": "alltoall", "flex/deepep": "deepep", "flex/hybridep": "deepep"}


def predict(model: str, overrides: dict, dispatcher: str, dtype: str, setup: dict,
            proxy: dict | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of the MoE part of the layer at the measured setup (and the proxy's routing:
    group-limited where it has router groups, the DeepSeek proxy's 4 of 8)."""
    tokens, ep = setup["tokens_per_gpu"], setup["ep"]
    graph = load_graph(model, batch=1, seq_len=tokens, overrides=overrides)
    structure = discover_blocks(graph)
    facts = GraphFacts(graph, structure)
    cluster = load_cluster("dgx-h100", devices=ep)
    base = load_execution("megatron-core")
    proxy = proxy or {}
    execution = dataclasses.replace(base, moe_dispatcher=dispatcher, moe_groups=proxy.get("router_groups", 0),
                                    moe_group_limit=proxy.get("router_group_topk", 0))
    workload = Workload(global_batch=ep, seq_len=tokens, dtype=dtype, execution=execution)
    strategy = Strategy(dp=ep, ep=ep, micro_batch=1)
    costs = stage_costs(graph, structure, cluster, workload, strategy, facts=facts)
    timer = NodeTimes(facts, cluster, workload, strategy, execution)
    (name,) = facts.moe
    nodes = [i for i in structure.block(name).nodes if "/mlp/" in (graph.nodes[i].name or "")]
    parts = costs.stages[0].parts  # one layer: the stage's exchange is this layer's
    fwd = sum(timer.forward(i, 1) for i in nodes) + parts.ep_fwd
    bwd = sum(timer.backward(i, 1) for i in nodes) + parts.ep_bwd
    return fwd, bwd


def main() -> int:
    doc = json.loads(DATA.read_text())
    print("one MoE layer on 8 x H100, EP8, 4096 tokens per GPU (Megatron-LM moe_perf baseline); ms")
    print(f"{'case':<36}{'meas fwd':>9}{'pred fwd':>9}{'err':>8}{'meas bwd':>9}{'pred bwd':>9}{'err':>8}")
    errs = []
    for row in doc["rows"]:
        model, over = PROXIES[row["proxy"]]
        dtype = "bf16" if row["precision"] == "bf16" else "fp8"
        fwd, bwd = predict(model, over, DISPATCHERS[row["dispatcher"]], dtype, doc["setup"],
                           doc["proxies"][row["proxy"]])
        ef, eb = fwd * 1e3 / row["forward_ms"] - 1, bwd * 1e3 / row["backward_ms"] - 1
        errs += [abs(ef), abs(eb)]
        print(f"{row['id'].removeprefix('mlm-moe-perf-'):<36}{row['forward_ms']:>9.2f}{fwd * 1e3:>9.2f}{ef:>+8.0%}"
              f"{row['backward_ms']:>9.2f}{bwd * 1e3:>9.2f}{eb:>+8.0%}")
    print(f"\n{len(doc['rows'])} layers, none fitted: mean |error| {sum(errs) / len(errs):.0%}, max {max(errs):.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
