"""A tied weight TorchScript's exporter stored twice (the embedding table and its folded transpose for the head) is
read as one parameter, as torch counts it and as the dynamo exporter writes it (planner/graph/onnx_folded.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from cli.app import app
from planner.graph.onnx_import import import_model
from planner.graph.onnx_folded import stored_copies

HF = Path(__file__).parent / "fixtures" / "hf"
MANIFEST = json.loads((HF / "manifest.json").read_text())
runner = CliRunner()


def _lm(table: np.ndarray, head: np.ndarray) -> onnx.ModelProto:
    """ids -> Gather(table) -> MatMul(head): the smallest graph with an embedding and an output head."""
    v, h = table.shape
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x"]), helper.make_node("MatMul", ["x", "head"], ["y"])]
    g = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", v])],
                          [numpy_helper.from_array(table, "table"), numpy_helper.from_array(head, "head")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("stem", ["gpt2_ts17_inline_axes", "qwen2_ts17_inline_static"])
def test_torchscripts_folded_copy_of_a_tied_embedding_counts_once(stem):
    entry = MANIFEST[stem]
    g = import_model(HF / entry["files"][0], **entry["bind"])
    assert sum(g.tensors[p].numel for p in g.params) == entry["torch_param_count"]  # 31,616 and 22,816, not +4,096
    tables = {n.inputs[0] for n in g.nodes if n.op_type == "Gather"}
    (copy, (table, how)), = [(c, t) for c, t in stored_copies(g).items() if t[0] in tables]
    assert copy.startswith("onnx::MatMul_") and how == "Transpose" and table in g.params and copy not in g.params
    assert any("stored a tied weight twice" in n for n in g.notes)


def test_only_the_same_values_tie(tmp_path):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 16)).astype(np.float32)
    tied = import_model(_lm(table, table.T.copy()), batch=1, seq_len=4)
    assert set(tied.params) == {"table"} and stored_copies(tied) == {"head": ("table", "Transpose")}
    other = import_model(_lm(table, rng.standard_normal((16, 64)).astype(np.float32)), batch=1, seq_len=4)
    assert set(other.params) == {"table", "head"} and not stored_copies(other)
    zeros = np.zeros((64, 16), np.float32)  # a weightless export: equal, but nothing says the weights are one
    assert set(import_model(_lm(zeros, zeros.T.copy()), batch=1, seq_len=4).params) == {"table", "head"}
    # in external data beside the file, read in place
    path = tmp_path / "lm.onnx"
    onnx.save(_lm(table, table.T.copy()), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="lm.onnx.data", size_threshold=0)
    assert set(import_model(path, batch=1, seq_len=4).params) == {"table"}
    (tmp_path / "lm.onnx.data").unlink()  # values gone: nothing to compare, both stay
    assert set(import_model(path, batch=1, seq_len=4).params) == {"table", "head"}


def test_the_onnx_export_shards_the_stored_copy_as_its_table(tmp_path):
    plan = tmp_path / "plan.yaml"
    r = runner.invoke(app, ["plan", str(HF / "gpt2_ts17_inline_axes.onnx"), "--cluster", "dgx-h100", "--devices", "2",
                            "--global-batch", "4", "--seq-len", "8", "--tp", "2", "-o", str(plan)])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(plan.read_text())
    doc.pop("estimate", None)  # a hand edit: the table split on its hidden dim, whatever the planner chose
    doc["layouts"]["params"]["transformer.wte.weight"].update(dims=[None, "tp"], partial=[])
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "annotated.onnx"
    r = runner.invoke(app, ["export", str(plan), "--backend", "onnx", "-o", str(out)])
    assert r.exit_code == 0, r.output
    head = next(n for n in onnx.load(str(out)).graph.node if n.name == "/lm_head/MatMul")
    specs = {s.tensor_name: [d.axis for d in s.sharded_dim]
             for c in head.device_configurations for s in c.sharding_spec}
    assert specs["onnx::MatMul_657"] == [0]  # the table's hidden dim is the copy's first


def _proj(name: str, signature: str | None = None) -> onnx.ModelProto:
    """x -> MatMul(W [in, out]) as TorchScript writes nn.Linear q_proj: the transpose folded into `name`."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), name)
    node = helper.make_node("MatMul", ["x", name], ["y"], name="/model/layers.0/self_attn/q_proj/MatMul")
    g = helper.make_graph([node], "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])], [w])
    if signature is not None:
        g.metadata_props.add(key="pkg.torch.export.ExportedProgram.graph_signature", value=signature)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_folded_linear_weight_is_read_as_its_modules_weight():
    target = "model.layers.0.self_attn.q_proj.weight"
    g = import_model(_proj("onnx::MatMul_604"), batch=1, seq_len=4)
    assert list(g.params) == [target] and g.tensors[target].shape == (8, 16)  # [out, in], as nn.Linear holds it
    assert stored_copies(g) == {"onnx::MatMul_604": (target, "Transpose")}
    assert any("'onnx::MatMul_604' is model.layers.0.self_attn.q_proj.weight" in n for n in g.notes)
    listed = f"p_q: PARAMETER target='{target}'"
    assert list(import_model(_proj("val_7", listed), batch=1, seq_len=4).params) == [target]
    # a signature that does not list the module's weight: the name stays the file's
    assert list(import_model(_proj("val_7", "p_other: PARAMETER target='other.weight'"), batch=1,
                             seq_len=4).params) == ["val_7"]


def test_the_onnx_export_shards_a_folded_linear_weight_as_its_module_weight(tmp_path):
    plan = tmp_path / "plan.yaml"
    r = runner.invoke(app, ["plan", str(HF / "qwen2_ts17_inline_static.onnx"), "--cluster", "dgx-h100", "--devices",
                            "2", "--global-batch", "4", "--seq-len", "8", "--tp", "2", "-o", str(plan)])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(plan.read_text())
    doc.pop("estimate", None)  # a hand edit: q_proj column-parallel, [out, in] split on out
    name = next(k for k in doc["layouts"]["params"] if k.endswith("self_attn.q_proj.weight"))
    doc["layouts"]["params"][name].update(dims=["tp", None], partial=[])
    doc["layouts"]["params"][name].pop("output_partial", None)
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "annotated.onnx"
    r = runner.invoke(app, ["export", str(plan), "--backend", "onnx", "-o", str(out)])
    assert r.exit_code == 0, r.output
    q = next(n for n in onnx.load(str(out)).graph.node if n.input and "onnx::MatMul_604" in n.input)
    specs = {s.tensor_name: [d.axis for d in s.sharded_dim] for c in q.device_configurations for s in c.sharding_spec}
    assert specs["onnx::MatMul_604"] == [1]  # the file's [in, out] copy: split on its second dim


def test_a_torch_export_refuses_expert_parallelism_over_renamed_stacked_experts(tmp_path):
    """The optimiser renames stacked expert weights too ([experts, in, out], read through a Gather: no module's
    `.weight` to name them after); the torch module places them by the model's names, so an expert-parallel plan
    of such a file had exported, exit 0, and failed when run ('... experts.gate_up_proj has no layout') (QA)."""
    from planner.errors import InvalidInput
    from planner.hypershard import declare
    from planner.hypershard.backends import export

    entry = MANIFEST["deepseek_v3_dyn18_inline_auto_opt"]
    doc = declare(str(HF / entry["files"][0]), cluster="dgx-h100", devices=2, global_batch=4,
                  seq_len=entry["bind"]["seq_len"], ep=2, dims=entry["dims"])
    assert any(k.startswith("val_") and len(e["dims"]) == 3 for k, e in doc["layouts"]["params"].items())
    with pytest.raises(InvalidInput, match=r"places a MoE layer's stacked expert weights by their module's names, "
                                           r"and the exporter renamed val_\d+"):
        export(doc, "torch")


def test_folded_weights_given_as_graph_inputs_are_read_as_the_modules_weights():
    """TorchScript with export_params=False declares each weight as a graph input, the folded linear ones under
    `onnx::MatMul_704` [in, out] as it stores them inline: read as the modules' weights, [out, in]."""
    entry = MANIFEST["llama_ts17_inputs_axes"]
    g = import_model(HF / entry["files"][0], **entry["bind"])
    assert sum(g.tensors[p].numel for p in g.params) == entry["torch_param_count"]
    assert not [p for p in g.params if p.startswith("onnx::")]
    torch_params = entry["torch_params"]
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.1.mlp.down_proj.weight"):
        assert name in g.params and g.tensors[name].numel == torch_params[name]
    k = g.tensors["model.layers.0.self_attn.k_proj.weight"].shape
    assert k[0] < k[1]  # [out, in]: 2 key-value heads of 8 out of a hidden of 32
    assert stored_copies(g)["onnx::MatMul_711"] == ("model.layers.0.self_attn.k_proj.weight", "Transpose")


def _gathers(signature: str, records: list[str]) -> onnx.ModelProto:
    """Two layers' expert-bias gathers reading one tensor `val_245` (zeros: equal at export, stored once), each node
    carrying the torch.export record the dynamo exporter writes (`records`)."""
    nodes = [helper.make_node("GatherND", ["val_245", "idx"], [f"b{k}"], name=f"node_GatherND_{k}") for k in (0, 1)]
    for node, record in zip(nodes, records):
        node.metadata_props.add(key="pkg.torch.onnx.fx_node", value=record)
    nodes.append(helper.make_node("Add", ["b0", "b1"], ["y"]))
    g = helper.make_graph(nodes, "gathers", [helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
                          [numpy_helper.from_array(np.zeros((4, 8), np.float32), "val_245")])
    g.metadata_props.add(key="pkg.torch.export.ExportedProgram.graph_signature", value=signature)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_one_renamed_tensor_read_as_two_parameters_gives_each_its_own():
    """GPT-OSS's expert biases are zeros at initialisation: the dynamo exporter (torch 2.13) stores both layers' as
    one `val_245`, each layer's gather recording its own parameter. Each is read as that parameter."""
    names = [f"model.layers.{k}.mlp.experts.gate_up_proj_bias" for k in (0, 1)]
    signature = "\n".join(f"p_model_layers_{k}_mlp_experts_gate_up_proj_bias: PARAMETER target='{n}'"
                          for k, n in enumerate(names))
    records = [f"%index_{k} : [num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = "
               f"(%p_model_layers_{k}_mlp_experts_gate_up_proj_bias, [%view_7]), kwargs = {{}})" for k in (0, 1)]
    g = import_model(_gathers(signature, records), dims={"n": 3})
    assert sorted(g.params) == names and all(g.tensors[n].shape == (4, 8) for n in names)
    assert any("1 of its tensors stood for several, equal at export" in n for n in g.notes)
    # an index past the leading dim may be lowered through a transpose the optimiser folded: names stay the file's
    past = [r.replace("[%view_7]", "[None, %view_7]") for r in records]
    assert list(import_model(_gathers(signature, past), dims={"n": 3}).params) == ["val_245"]


def test_a_parameter_read_through_a_folded_view_is_counted_and_its_onnx_export_splits_the_views_dim(tmp_path):
    """torch.onnx.export's default (dynamo, optimize=True) folds GPT-OSS's attention sinks, [heads], viewed as
    [1, heads, 1, 1], into a constant `view_3` the signature does not list: read as the sinks, the file's count is
    torch's (27,760, 8 short without), and a tensor-parallel plan's split of a sink's heads annotates the view's dim
    1, where the heads are."""
    stem = "gpt_oss_dyn20_inline_named_opt"
    entry, path = MANIFEST[stem], HF / MANIFEST[stem]["files"][0]
    g = import_model(path, **entry["bind"])
    assert g.param_count == entry["torch_param_count"] == 27_760
    assert g.tensors["model.layers.0.self_attn.sinks"].shape == (4,)  # torch's shape
    assert stored_copies(g)["view_3"] == ("model.layers.0.self_attn.sinks", "Reshape")
    r = runner.invoke(app, ["plan", str(path), "--cluster", "dgx-a100", "--devices", "2", "--global-batch", "4",
                            "--seq-len", "8", "--tp", "2", "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code == 0, r.output
    layouts = yaml.safe_load((tmp_path / "p.yaml").read_text())["layouts"]["params"]
    assert layouts["model.layers.*.self_attn.sinks"]["dims"] == ["tp"]
    r = runner.invoke(app, ["export", str(tmp_path / "p.yaml"), "--backend", "onnx", "-o", str(tmp_path / "p.onnx")])
    assert r.exit_code == 0, r.output
    model = onnx.load(str(tmp_path / "p.onnx"), load_external_data=False)
    specs = [s for n in model.graph.node for c in n.device_configurations for s in c.sharding_spec
             if s.tensor_name == "view_3"]
    assert specs and all([(d.axis, d.simple_sharding[0].num_shards) for d in s.sharded_dim] == [(1, 2)]
                         for s in specs)
