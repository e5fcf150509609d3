"""A plan of an optimised torch export declares every layer's weights as the estimate laid them out.

torch.onnx.export(dynamo=True) optimises by default, and its optimiser renames weights it folds into the
contractions (`val_482` in one layer, `val_250` in the next): no longer under the layer's path. The estimate ties
identical layers and solves one layout for all of them; the declaration took the first layer's table by names
relative to the layer, so every later layer's renamed weights went out replicated, and `estimate --plan` refused
the file it had just written (helper sweep of 2026-12-07: smollm3, lfm2, seed_oss, gpt_neox, olmoe). The importer
now reads each folded weight back under its module's name, [out, in] (planner/graph/onnx_folded.py): the layers'
weights are named as the model names them, and a tensor-parallel plan exports to torch.
"""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cli.app import app  # noqa: E402
from planner.api import load_graph  # noqa: E402
from planner.graph.blocks import discover_blocks  # noqa: E402
from planner.hypershard.patterns import expand  # noqa: E402
from planner.search.tying import tie_keys  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def optimised(tmp_path_factory) -> str:
    """A 4-layer Llama exported by the dynamo exporter with its default optimisation."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = str(tmp_path_factory.mktemp("opt") / "llama_opt.onnx")
    dim = torch.export.Dim
    torch.onnx.export(model, (torch.zeros(2, 16, dtype=torch.long),), path, dynamo=True,
                      dynamic_shapes={"input_ids": {0: dim("batch"), 1: dim("seq")}})
    return path


def test_tied_layers_renamed_weights_are_declared_as_laid_out_and_the_file_estimates(optimised, tmp_path):
    g = load_graph(optimised, batch=2, seq_len=16)
    structure = discover_blocks(g)
    _, keys = tie_keys(g, structure)
    groups: dict = {}
    for p in g.params:
        groups.setdefault(keys[p], []).append(p)
    assert any("folded" in n for n in g.notes), "the optimiser folded no weight: this test no longer covers the case"
    assert not [p for p in g.params if p.startswith("val_") and len(g.tensors[p].shape) == 2]
    renamed = [ps for ps in groups.values() if len(ps) > 2 and all(p.endswith("_proj.weight") for p in ps)]
    assert renamed and all(p.startswith("model.layers.") for ps in renamed for p in ps)

    out = tmp_path / "plan.yaml"
    args = ["plan", optimised, "--dim", "batch=2", "--seq-len", "16", "--cluster", "dgx-h100", "--devices", "8",
            "--global-batch", "16", "--tp", "4", "-o", str(out)]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    layouts, _, _ = expand(yaml.safe_load(out.read_text())["layouts"]["params"], g.params)
    split = 0
    for ps in renamed:  # every instance of a tied weight declared alike, and some of them split over tp
        dims = {str(layouts[p]["dims"]) for p in ps}
        assert len(dims) == 1, {p: layouts[p]["dims"] for p in ps}
        split += "tp" in dims.pop()
    assert split > 0
    again = CliRunner().invoke(app, ["estimate", optimised, "--dim", "batch=2", "--plan", str(out)])
    assert again.exit_code == 0, again.output


def test_a_tensor_parallel_plan_of_the_optimised_export_exports_to_torch(optimised, tmp_path):
    """It had been refused: 'val_152 ... is split as an [in, out] one (GPT-2's Conv1D)' (QA of 2026-12-07)."""
    out = tmp_path / "plan.yaml"
    run = CliRunner().invoke(app, ["plan", optimised, "--dim", "batch=2", "--seq-len", "16", "--cluster", "dgx-h100",
                                   "--devices", "4", "--global-batch", "8", "--tp", "2", "-o", str(out)])
    assert run.exit_code == 0, run.output
    layouts, _, _ = expand(yaml.safe_load(out.read_text())["layouts"]["params"],
                           load_graph(optimised, batch=2, seq_len=16).params)
    q = layouts["model.layers.0.self_attn.q_proj.weight"]
    assert q["op"] == "linear" and "tp" in q["dims"]  # the module's weight, split over the tensor ranks
    run = CliRunner().invoke(app, ["export", str(out), "--backend", "torch", "-o", str(tmp_path / "p.py")])
    assert run.exit_code == 0, run.output
    assert "model.layers.*.self_attn.q_proj.weight" in (tmp_path / "p.py").read_text()



@pytest.mark.parametrize("dynamo", [True, False])
def test_a_freshly_initialised_model_counts_every_norm_weight(dynamo, tmp_path):
    """Both exporters keep one tensor for equal constants, so a model built from its config and exported before
    training (its norm weights all ones) had read as one norm weight for every layer: 106,560 parameters against
    torch's 106,816, and under TorchScript its layers no longer alike (QA of 2026-12-07)."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = str(tmp_path / "fresh.onnx")
    ids, mask = torch.zeros(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.long)
    if dynamo:
        torch.onnx.export(model, (ids,), path, dynamo=True,
                          dynamic_shapes={"input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}})
    else:  # TorchScript traces transformers 5's masks only with an attention mask given
        torch.onnx.export(model, (ids,), path, dynamo=False, kwargs={"attention_mask": mask},
                          input_names=["input_ids", "attention_mask"])
    g = load_graph(path, batch=2, seq_len=16)
    assert g.param_count == model.num_parameters() == 106_816
    assert any("stored equal parameters once" in n for n in g.notes)
    structure = discover_blocks(g)
    assert [len(b.params) for b in structure.layers()] == [9, 9]  # each layer's two norms its own
    assert [t.count for t in structure.types if t.count > 1] == [2]  # the two layers are one repeated type
