"""What torch's exporters write, read as a user means it (issue 14): dims named s0/s72, fixed-length graphs,
weights an optimiser folded under new names, ops no rule costs, and files protobuf cannot read.

Graphs are built here the way the exporters write them (the real exports are checked in test_hf_exports.py).
"""

from __future__ import annotations

import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

from cli.app import app
from planner.api import estimate_model, load_graph, plan_model
from planner.errors import InvalidInput, InvalidModel, UnboundDimension
from planner.graph import onnx_dims
from planner.graph.onnx_import import import_model
from planner.graph.onnx_params import SIGNATURE_KEY
from tests import graphs

I64 = onnx.TensorProto.INT64


def _lm(batch="s72", seq="s70", vocab=32, d=16) -> onnx.ModelProto:
    """input_ids[batch, seq] -> embedding Gather -> MatMul head: what dynamo writes for Dim("batch"), Dim("seq")."""
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="/embed/Gather"),
             helper.make_node("MatMul", ["h", "head"], ["logits"], name="/lm_head/MatMul")]
    return graphs.model(nodes, [graphs.vi("input_ids", [batch, seq], I64)],
                        [graphs.vi("logits", [batch, seq, vocab])],
                        [graphs.weight("emb", vocab, d), graphs.weight("head", d, vocab)])


def test_token_input_dims_are_batch_and_sequence_whatever_their_names():
    g = import_model(_lm(), batch=3, seq_len=5)
    assert g.dims == {"s70": 5, "s72": 3}
    assert g.tensors["logits"].shape == (3, 5, 32)


def test_a_pixel_input_gives_its_first_dim_the_batch():
    roles = onnx_dims.input_roles([(False, ["s0", "", "", ""]), (True, ["s0", "s1"])])
    assert roles == {"s0": "batch", "s1": "seq"}
    # a symbol that plays two roles (batch of one input, sequence of another) is left for --dim
    assert onnx_dims.input_roles([(True, ["s0", "s1"]), (True, ["s1", "s0"])]) == {}


def test_names_beat_roles_and_the_hint_names_only_the_flags_not_given():
    g = import_model(_lm(batch="seq", seq="batch"), batch=3, seq_len=5)  # perverse names: names decide
    assert g.dims == {"batch": 3, "seq": 5}
    with pytest.raises(UnboundDimension) as err:
        import_model(_lm(), batch=3)
    assert "'s70'" in str(err.value) and "--seq-len" in str(err.value) and "--batch" not in str(err.value)
    odd = _lm()
    odd.graph.input.append(graphs.vi("scales", ["q", 4]))  # a float input of rank 2: no role for its 'q'
    with pytest.raises(UnboundDimension) as err:
        import_model(odd, batch=3, seq_len=5)  # both given: no "(or --batch / --seq-len)"
    assert "'q'" in str(err.value) and "or --" not in str(err.value)


def test_a_fixed_length_graph_is_costed_at_its_length_or_refused():
    fixed = _lm(batch=2, seq=16)
    assert import_model(fixed, seq_len=16).tensors["logits"].shape == (2, 16, 32)
    with pytest.raises(InvalidInput, match="fixes the sequence length at 16, but --seq-len 4096 was given"):
        import_model(fixed, seq_len=4096)


def _fixed_llama() -> onnx.ModelProto:
    m = graphs.llama_like(layers=2)
    for vi in (*m.graph.input, *m.graph.output, *m.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in ("batch", "seq"):
                d.dim_value = 1 if d.dim_param == "batch" else 16
    return m


def test_a_fixed_length_file_plans_only_at_its_length(tmp_path):
    path = graphs.save(_fixed_llama(), str(tmp_path / "fixed.onnx"))
    with pytest.raises(InvalidInput, match="--seq-len 16"):
        plan_model(path, cluster="dgx-a100", devices=8, global_batch=64, seq_len=4096, time_limit_s=10)
    got = estimate_model(path, cluster="dgx-a100", devices=8, global_batch=64, seq_len=16)
    assert got["tokens_per_s"] == pytest.approx(64 * 16 / got["step_time_s"])


def _folded(signature_lists_head: bool) -> onnx.ModelProto:
    """An optimised dynamo export: the head's transpose folded into 'val_3' (not in the signature), the rotary
    table 'val_9' folded too and read by a Mul, the embedding listed."""
    m = _lm(batch=2, seq=4)
    m.graph.node[1].input[1] = "val_3"
    m.graph.initializer[1].name = "val_3"
    m.graph.node.append(helper.make_node("Mul", ["logits", "val_9"], ["scaled"]))
    m.graph.initializer.append(graphs.weight("val_9", 4, 32))
    m.graph.output[0].name = "scaled"
    lines = ["# inputs", "p_emb: PARAMETER target='emb'", "b_inv_freq: BUFFER target='inv_freq'"]
    if signature_lists_head:
        lines.append("p_head: PARAMETER target='lm_head.weight'")
    m.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(lines))
    return m


def test_with_a_signature_weights_folded_under_new_names_count_and_folded_tables_do_not():
    g = import_model(_folded(True))
    # the head's folded transpose is read as the weight the signature lists (planner/graph/onnx_folded.py)
    assert sorted(g.params) == ["emb", "lm_head.weight"] and g.tensors["lm_head.weight"].shape == (32, 16)
    assert g.param_count == 2 * 32 * 16


def test_without_a_signature_every_large_float_initializer_counts():
    m = _folded(True)
    del m.graph.metadata_props[:]
    assert sorted(import_model(m).params) == ["emb", "lm_head.weight", "val_9"]  # the head's module's name is free


def test_uncosted_ops_are_measured_said_and_refused_on_request(tmp_path):
    m = graphs.llama_like(layers=2)
    out = m.graph.output[0].name
    m.graph.node.append(helper.make_node("Frobnicate", [out], ["frobbed"], domain="acme.ops"))
    m.graph.output[0].name = "frobbed"
    m.opset_import.append(helper.make_opsetid("acme.ops", 1))
    path = graphs.save(m, str(tmp_path / "custom.onnx"))
    g = load_graph(path, batch=1, seq_len=8)
    u = g.uncosted()
    assert u["ops"] == 1 and u["op_types"] == {"acme.ops::Frobnicate": 1}
    assert u["op_share"] == pytest.approx(1 / len(g.nodes)) and 0 < u["byte_share"] < 0.1
    got = estimate_model(path, cluster="dgx-a100", devices=8, global_batch=16, seq_len=8)
    assert got["uncosted"] == u
    assert any(f"1 of {len(g.nodes)} ops" in a and "costed by the bytes they move" in a for a in got["assumptions"])
    with pytest.raises(InvalidModel, match="acme.ops::Frobnicate x1.*drop --strict-ops"):
        estimate_model(path, cluster="dgx-a100", devices=8, global_batch=16, seq_len=8, strict_ops=True)
    r = CliRunner().invoke(app, ["estimate", path, "--cluster", "dgx-a100", "--devices", "8", "--global-batch",
                                 "16", "--seq-len", "8", "--strict-ops"])
    assert r.exit_code == InvalidModel.exit_code and "Traceback" not in r.output
    assert "--strict-ops" in r.output


def test_a_file_protobuf_cannot_parse_says_what_may_be_wrong(tmp_path):
    raw = _lm().SerializeToString().replace(b"/embed/Gather", b"/embed/G\xff\xfeher")
    path = tmp_path / "bad.onnx"
    path.write_bytes(raw)
    r = CliRunner().invoke(app, ["inspect", str(path), "--batch", "1", "--seq-len", "4"])
    assert r.exit_code == InvalidModel.exit_code and "Traceback" not in r.output
    assert "not valid UTF-8" in r.output


def _weights_as_bare_inputs(signature: bool) -> onnx.ModelProto:
    """torch's dynamo export saved with keep_initializers_as_inputs=True, include_initializers=False: the weights
    are graph inputs with shapes and no data; the rotary table a BUFFER input."""
    m = _lm()
    del m.graph.initializer[:]
    m.graph.input.extend([graphs.vi("emb", [32, 16]), graphs.vi("head", [16, 32]), graphs.vi("inv_freq", [4])])
    m.graph.node.append(helper.make_node("Mul", ["logits", "inv_freq"], ["unused"]))
    if signature:
        m.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join([
            "# inputs", "p_emb: PARAMETER target='emb'", "p_head: PARAMETER target='head'",
            "b_inv: BUFFER target='inv_freq'", "input_ids: USER_INPUT"]))
    return m


@pytest.mark.parametrize("signature", [True, False])
def test_weights_given_as_inputs_without_data_are_parameters_not_inputs(signature):
    g = import_model(_weights_as_bare_inputs(signature), batch=2, seq_len=4)
    assert sorted(g.params) == ["emb", "head"] and g.param_count == 2 * 32 * 16
    assert g.inputs == (("input_ids",) if signature else ("input_ids", "inv_freq"))
    assert any("2 graph input(s) are weights without data" in n for n in g.notes)


def test_a_fixed_shape_float_input_read_as_data_stays_an_input():
    m = _weights_as_bare_inputs(False)
    m.graph.input.append(graphs.vi("features", [1, 4, 16]))  # read as a GEMM's left operand: data
    m.graph.node.append(helper.make_node("MatMul", ["features", "head"], ["projected"]))
    g = import_model(m, batch=2, seq_len=4)
    assert "features" in g.inputs and "features" not in g.params


def test_weights_saved_neither_as_data_nor_as_inputs_are_refused_with_the_remedy():
    m = _weights_as_bare_inputs(True)
    del m.graph.input[1:]  # what ONNXProgram.save(include_initializers=False) writes without keep_initializers_as_inputs
    with pytest.raises(InvalidModel, match="reads the weight 'emb'.*keep_initializers_as_inputs=True"):
        import_model(m, batch=2, seq_len=4)


def _router(outputs: str = "mixed") -> onnx.ModelProto:
    """DeepSeek-V3's router as TorchScript writes it: a bias added to the scores picks the experts (TopK's
    indices) but the weights are gathered from the unbiased scores; the experts' table, folded by an optimiser
    under a new name, is looked up by expert index (GatherND)."""
    nodes = [helper.make_node("MatMul", ["x", "gate.weight"], ["scores"]),
             helper.make_node("Add", ["scores", "gate.e_score_correction_bias"], ["biased"]),
             helper.make_node("TopK", ["biased", "k"], ["top", "idx"], axis=-1),
             helper.make_node("GatherElements", ["scores", "idx"], ["w"], axis=-1),
             helper.make_node("Unsqueeze", ["idx", "last"], ["idx3"]),
             helper.make_node("GatherND", ["val_7", "idx3"], ["picked"], batch_dims=0),
             helper.make_node("ReduceSum", ["picked", "axes"], ["expert_out"], keepdims=0)]
    outs = [graphs.vi("w", [8, 2]), graphs.vi("expert_out", [8, 16])] if outputs == "mixed" else \
        [graphs.vi("idx", [8, 2], I64)]
    m = graphs.model(nodes, [graphs.vi("x", [8, 16])], outs,
                     [graphs.weight("gate.weight", 16, 4), graphs.weight("gate.e_score_correction_bias", 4),
                      graphs.weight("val_7", 4, 16), graphs.ints("k", [2]), graphs.ints("last", [-1]),
                      graphs.ints("axes", [1])])
    lines = ["p_gate: PARAMETER target='gate.weight'", "b_bias: BUFFER target='gate.e_score_correction_bias'"]
    m.graph.metadata_props.add(key=SIGNATURE_KEY, value="\n".join(lines))
    return m


def test_a_weight_that_only_steers_a_selection_is_a_buffer_and_an_expert_table_is_a_weight():
    m = _router()
    assert sorted(import_model(m).params) == ["gate.weight", "val_7"]  # the signature says the bias is a buffer
    del m.graph.metadata_props[:]  # TorchScript writes no signature: the graph's flow says it
    g = import_model(m)
    assert sorted(g.params) == ["gate.weight", "val_7"] and g.param_count == 16 * 4 + 4 * 16
    assert any("steer a selection" in n and "e_score_correction_bias" in n for n in g.notes)
    ids_only = _router(outputs="ids")
    del ids_only.graph.metadata_props[:]  # a graph that returns ids alone says nothing of gradients
    assert "gate.e_score_correction_bias" in import_model(ids_only).params
