"""Megatron-Core pipeline layouts read as layers per chunk (`layout_chunks`): DeepSeek-V3's layouts as Megatron-Bridge
writes them counted by hand, the exporter's own layouts read back, bad text refused, and megatron-core's parser
agreeing chunk by chunk."""

from __future__ import annotations

import pytest

from benchmarks.calibration_spec_helpers import DSV3_LAYOUTS, dsv3_as_run
from planner.costing.pipeline_cut import layout_chunks
from planner.errors import InvalidInput
from planner.hypershard.backends.megatron import _layout

LAYOUTS = ["Et*4|(t*4|)*14tmL", "Et|(tt|)*30mL", "Et*16|t*16|t*16|t*13mL", "Ettt|(tt|)*29,m|L", "E|t*3|(t|)*2tL"]


def test_deepseek_v3s_layouts_count_61_layers_and_the_mtp_depth():
    assert layout_chunks("Et*4|(t*4|)*14tmL") == (4,) * 15 + (2,)  # the last chunk: a decoder layer and the MTP depth
    assert layout_chunks("Et|(tt|)*30mL") == (1,) + (2,) * 30 + (1,)  # 1,024 H100s: PP8 x VPP4, 32 chunks
    assert layout_chunks("Ettt|(tt|)*29,m|L") == (3,) + (2,) * 29 + (1, 0)  # megatron-core's docstring example
    for (pp, vpp), text in DSV3_LAYOUTS.items():
        assert len(layout_chunks(text)) == pp * vpp and sum(layout_chunks(text)) == 62


def test_the_exporters_layouts_read_back_as_the_plans_chunks():
    for chunks, mtp in [((4, 4, 4, 2), 1), ((1, 2, 1, 1), 1), ((3, 3, 3, 3), 0), ((0, 5, 5, 0), 0)]:
        assert layout_chunks(_layout(chunks, mtp)) == chunks


def test_a_run_as_its_recipe_lays_it_out():
    strategy, note = dsv3_as_run({"pp": 4, "vpp": 4, "dp": 16})
    assert strategy["stage_layers"] == [4] * 15 + [2] and "Et*4|(t*4|)*14tmL" in note
    assert "stage_layers" not in dsv3_as_run({"dp": 8})[0]
    bare, note = dsv3_as_run({"pp": 4, "vpp": 4, "dp": 16}, mtp=False)  # a row its table heads "w/o MTP"
    assert bare["stage_layers"] == [4] * 15 + [1] and "Et*4|(t*4|)*14tL" in note and "w/o MTP" in note
    with pytest.raises(ValueError, match="pp 2 x vpp 8"):
        dsv3_as_run({"pp": 2, "vpp": 8})  # not in the recipe's map: the preset must name its layout
    with pytest.raises(ValueError, match="not pp x vpp"):
        dsv3_as_run({"pp": 4}, "Et*4|(t*4|)*14tmL")


def test_the_shipped_runs_carry_the_depth_their_tables_name():
    from planner.calibration import read_runs

    runs = {r.id: r for r in read_runs() if r.model == "deepseek-v3" and r.id.startswith("mb")}
    assert runs["mb2511-deepseek-v3-256xgb200-bf16"].overrides == {}  # 25.11's table: DeepSeekV3 (w/o MTP)
    assert runs["mb2606-deepseek-v3-256xgb200-mxfp8"].overrides == {"mtp_layers": 1}
    assert runs["mb2509-deepseek-v3-1024xh100-fp8"].strategy["stage_layers"] == [1] + [2] * 30 + [1]


@pytest.mark.parametrize("text", ["Etx|L", "", "(t*2"])
def test_text_that_is_not_a_layout_is_refused_in_one_sentence(text):
    with pytest.raises(InvalidInput, match="not Megatron-Core's"):
        layout_chunks(text)


@pytest.mark.launch
@pytest.mark.parametrize("text", LAYOUTS)
def test_megatron_cores_parser_reads_the_same_chunks(text):
    pytest.importorskip("torch")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    chunks = PipelineParallelLayerLayout.parse_str_to_list(text)
    assert tuple(sum(x.name in ("decoder", "mtp") for x in c) for c in chunks) == layout_chunks(text)
