"""A tensor-parallel training plan of GPT-OSS runs in torch: its attention sinks (one a head, a parameter of the
attention module itself, which no torch parallel style splits) are split with the heads as declared.

The plan is made from `torch.onnx.export`'s default export (dynamo, optimised), where the sinks come out folded
into views (`onnx_folded.unview`), and applied to a fresh transformers model of the same config (the optimised
fixture's) on two gloo ranks.
Before `shard_own_params` the sinks stayed whole beside each rank's two heads of four and the attention's
concatenation failed ("Expected size 2 but got size 4").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.torch_runs import launch, ok  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HF = Path(__file__).parent / "fixtures" / "hf"
STEM = "gpt_oss_dyn20_inline_named_opt"
ENTRY = json.loads((HF / "manifest.json").read_text())[STEM]
WORLD, BATCH, SEQ, VOCAB = 2, 4, 8, ENTRY["config"]["vocab_size"]


def _tiny_gpt_oss():
    """The fixture's model (its manifest's config), its sinks and biases drawn away from zero so that they weigh
    in (and are exported: the optimiser drops the reads of an expert bias that is all zeros)."""
    torch.manual_seed(0)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok", "sliding_window",
            "max_position_embeddings", "layer_types")
    cfg = transformers.GptOssConfig(**{k: ENTRY["config"][k] for k in keys}, use_cache=False,
                                    experts_implementation="batched_mm", attn_implementation="eager")
    model = transformers.GptOssForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "bias")):
                p.normal_(0.0, 1.0)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    """The model as `torch.onnx.export` writes it by default (dynamo, optimised), its records kept: the sinks
    folded into views, the stacked experts renamed (`onnx_folded.unview`, `unrename`)."""
    path = str(tmp_path_factory.mktemp("gpt_oss") / "gpt_oss.onnx")
    dim = torch.export.Dim
    torch.onnx.export(_tiny_gpt_oss().eval(), (torch.zeros(2, SEQ, dtype=torch.long),), path,
                      dynamic_shapes={"input_ids": {0: dim("batch"), 1: dim("seq")}})
    return path


def test_the_default_export_is_read_as_the_parameters_torch_holds(exported):
    """Every parameter under torch's name and shape: the sinks out of their folded views, the experts renamed back,
    the attention's linear weights out of their folded transposes."""
    from planner.api import load_graph

    g = load_graph(exported, batch=2, seq_len=SEQ)
    held = {n: tuple(p.shape) for n, p in _tiny_gpt_oss().named_parameters()}
    assert {p: tuple(g.tensors[p].shape) for p in g.params} == held
    assert any("folded 2 parameters read through a view" in n for n in g.notes)


def test_a_tensor_parallel_plan_splits_the_sinks_with_the_heads_and_matches_one_process(exported, tmp_path):
    scenarios = {"tp2": (dict(tp=2), False, False)}
    runs = launch(tmp_path, WORLD, scenarios, exported, None, _tiny_gpt_oss, (BATCH, SEQ, VOCAB))
    rows = ok(runs, "tp2")  # every rank ran, its gradients (the sinks' among them) within the tolerance
    assert abs(rows[0]["loss"] - runs[0]["ref_loss"]) < 1e-5
    assert rows[0]["q_local"] == [16, 32]  # two heads of four (head dim 8) on each tensor rank
    plan = (tmp_path / "tp2.py").read_text()  # the file no longer lists the sinks as a split it keeps whole
    not_expressed = next(line for line in plan.splitlines() if line.startswith("NOT_EXPRESSED = "))
    assert "'model.layers.*.self_attn.sinks': {'dims': ['tp']" in plan and "sinks" not in not_expressed

