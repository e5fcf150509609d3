"""HyperMPMD: encoders and backbone as programs on their own device groups, chosen only when they pay."""

from __future__ import annotations

import pytest

from planner.api import load_graph, plan_model
from planner.graph.blocks import discover_blocks
from planner.graph.subgraph import extract
from planner.search.mpmd import split_programs

SMALL_VLM = dict(layers=4, vision_layers=8)  # encoders 7% of the FLOPs: worth a program of their own


@pytest.fixture(scope="module")
def llava():
    g = load_graph("llava-style-7b", batch=1, seq_len=1024, overrides=SMALL_VLM)
    return g, discover_blocks(g)


def test_programs_split_the_model_into_encoders_and_backbone(llava):
    g, st = llava
    progs = split_programs(g, st)
    assert [p.name for p in progs] == ["vision_tower+multi_modal_projector", "language_model"]
    enc, llm = progs
    # every node and every parameter lands in exactly one program
    assert len(enc.graph.nodes) + len(llm.graph.nodes) == len(g.nodes)
    assert enc.graph.param_count + llm.graph.param_count == g.param_count
    # the backbone reads the projected image features as an input, the encoders hand them over as an output
    handed = set(enc.graph.outputs) & set(llm.graph.inputs)
    assert handed and all(g.tensors[x].dtype.startswith(("float", "bfloat")) for x in handed)
    assert "input_ids" in llm.graph.inputs and "pixel_values" in enc.graph.inputs


def test_extract_keeps_shapes_and_costs(llava):
    g, st = llava
    layer = st.layers()[0]
    sub = extract(g, layer.nodes, "one layer")
    assert sub.flops == pytest.approx(sum(g.nodes[i].flops for i in layer.nodes))
    assert all(sub.tensors[x].shape == g.tensors[x].shape for x in sub.inputs)


def test_a_text_only_model_or_a_tiny_tower_is_one_program():
    g = load_graph("llama3-8b", batch=1, seq_len=512, overrides=dict(layers=2))
    assert split_programs(g, discover_blocks(g)) == []
    g = load_graph("llava-style-7b", batch=1, seq_len=1024)  # one 336 px image: the tower is 0.6% of the FLOPs
    assert split_programs(g, discover_blocks(g)) == []


@pytest.mark.slow
def test_mpmd_plan_is_never_slower_than_one_program_and_reports_imbalance():
    kw = dict(cluster="cloudmatrix384", devices=16, global_batch=64, seq_len=1024, overrides=SMALL_VLM)
    both = plan_model("llava-style-7b", **kw)
    single = plan_model("llava-style-7b", mpmd=False, **kw)
    assert both["estimate"]["step_time_s"] <= single["estimate"]["step_time_s"] * (1 + 1e-9)
    mp = both["mpmd"]
    assert mp["imbalance"] >= 1.0 and len(mp["programs"]) == 2
    assert sum(p["devices"] for p in mp["programs"]) == 16
    assert "mpmd" not in single
