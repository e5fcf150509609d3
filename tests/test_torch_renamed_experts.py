"""Stacked expert weights the dynamo exporter's optimiser renamed are read under their parameters' names, and an
expert-parallel plan of that file runs in torch.

transformers 5 keeps a MoE layer's experts as two stacked parameters (`mlp.experts.gate_up_proj`, `down_proj`) and,
with its batched_mm implementation (the one torch.export traces), gathers each token's experts from them.
torch.onnx.export(dynamo=True) optimises by default and stores them as `val_353` and `val_362`, unchanged. The
importer had kept those names, so the torch export refused expert parallelism over them (the module places
experts by the model's names). `onnx_folded.unrename` reads the gathering node's torch.export record
(`pkg.torch.onnx.fx_node`), whose first argument is the parameter's placeholder, and names the tensor after it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from planner.api import load_graph  # noqa: E402
from tests.torch_runs import launch, ok, spread_experts  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORLD, BATCH, SEQ, VOCAB, EXPERTS = 4, 8, 16, 128, 4


def _tiny_qwen3_moe():
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      vocab_size=VOCAB, num_experts=EXPERTS, num_experts_per_tok=2, use_cache=False,
                                      experts_implementation="batched_mm", attn_implementation="eager")
    return spread_experts(transformers.Qwen3MoeForCausalLM(cfg).float())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("qwen3_moe") / "qwen3_moe.onnx")
    dim = torch.export.Dim
    torch.onnx.export(_tiny_qwen3_moe().eval(), (torch.zeros(2, SEQ, dtype=torch.long),), path, dynamo=True,
                      dynamic_shapes={"input_ids": {0: dim("batch"), 1: dim("seq")}})
    return path


def test_renamed_stacked_experts_are_read_as_the_parameters_torch_holds(exported):
    model = _tiny_qwen3_moe()
    stored = {t.name: t for t in onnx.load(exported).graph.initializer}
    renamed = [n for n, t in stored.items() if n.startswith("val_") and len(t.dims) == 3]
    assert len(renamed) == 4  # the exporter's own doing: two stacked weights a layer, both renamed
    g = load_graph(exported, batch=2, seq_len=SEQ)
    torch_params = dict(model.named_parameters())
    assert sum(g.tensors[p].numel for p in g.params) == sum(p.numel() for p in torch_params.values())
    stacked = [p for p in g.params if len(g.tensors[p].shape) == 3]
    assert sorted(stacked) == sorted(n for n, p in torch_params.items() if p.dim() == 3)
    for name in stacked:  # the same shape, and the file's renamed tensor holds exactly that parameter's values
        assert g.tensors[name].shape == tuple(torch_params[name].shape)
    from onnx import numpy_helper

    values = [numpy_helper.to_array(stored[n]) for n in renamed]
    for name in stacked:
        assert any(v.shape == torch_params[name].shape and np.array_equal(v, torch_params[name].detach().numpy())
                   for v in values)
    assert any("the exporter renamed 4 weights it reads as stored" in n for n in g.notes)


def test_an_expert_parallel_plan_of_the_export_matches_the_single_process_run(exported, tmp_path):
    scenarios = {"ep2_zero1": (dict(zero=1, ep=2), False, False)}
    runs = launch(tmp_path, WORLD, scenarios, exported, None, _tiny_qwen3_moe, (BATCH, SEQ, VOCAB))
    rows = ok(runs, "ep2_zero1")
    assert abs(rows[0]["loss"] - runs[0]["ref_loss"]) < 1e-5
    assert {r["ep2_zero1"]["local_experts"] for r in runs} == {EXPERTS // 2}
