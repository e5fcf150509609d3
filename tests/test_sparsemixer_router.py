"""A router that picks its experts one ArgMax at a time is a router (Phi-3.5-MoE's sparsemixer).

transformers' PhimoeSparseMoeBlock takes a token's first expert by an ArgMax over the router's scores, masks it
out (a scatter) and takes the second by another ArgMax: no TopK, so `moe.moe_facts` found no MoE layer, the
experts were costed as the batched GEMMs of the exported graph with nothing routed, and the plan had no expert
parallelism. Both torch exporters' graphs of a small Phi-MoE are held here to transformers' own counts.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from planner.api import load_graph  # noqa: E402
from planner.graph.blocks import discover_blocks  # noqa: E402
from planner.graph.moe import moe_blocks  # noqa: E402
from planner.graph.walk import index_graph  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

EXPERTS, TOP_K, LAYERS = 4, 2, 2


@pytest.fixture(scope="module")
def phimoe():
    cfg = transformers.PhimoeConfig(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=LAYERS,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, router_jitter_noise=0.0,
                                    input_jitter_noise=0.0, use_cache=False, experts_implementation="batched_mm")
    torch.manual_seed(0)
    return transformers.PhimoeForCausalLM(cfg).eval()


@pytest.mark.parametrize("dynamo", [True, False])
def test_each_phimoe_layer_routes_two_of_four_experts(phimoe, dynamo, tmp_path):
    path = str(tmp_path / "phimoe.onnx")
    ids = torch.zeros(2, 8, dtype=torch.long)
    if dynamo:
        dim = torch.export.Dim
        torch.onnx.export(phimoe, (ids,), path, dynamo=True, dynamic_shapes={"input_ids": {0: dim("batch"),
                                                                                           1: dim("seq")}})
    else:  # with an attention mask, as pipelines pass one (without it the mask's aten::diff does not export)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        torch.onnx.export(phimoe, (), path, kwargs=inputs, dynamo=False, opset_version=17, input_names=list(inputs),
                          dynamic_axes={k: {0: "batch", 1: "seq"} for k in inputs})
    g = load_graph(path, batch=2, seq_len=8)
    structure = discover_blocks(g)
    found = moe_blocks(g, index_graph(g), structure)
    assert sorted(found) == [f"model.layers.{i}" for i in range(LAYERS)], sorted(found)
    experts = sum(p.numel() for n, p in phimoe.named_parameters() if ".experts." in n)
    for facts in found.values():
        assert (facts.experts, facts.top_k, facts.tokens) == (EXPERTS, TOP_K, 16)
        assert facts.router_params and len(facts.expert_nodes) == 2  # the batched gate-up and down GEMMs
    assert sum(g.tensors[p].numel for f in found.values() for p in f.params) == experts
    assert all(t.kind == "moe" for t in structure.types if t.instances[0].startswith("model.layers."))
