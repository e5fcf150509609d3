"""Real torch exports (tests/fixtures): import, count parameters as torch does, find layers and towers.

These read committed files, so they need no torch; only the last test
regenerates a fixture and is skipped without torch or on another torch version.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from planner.graph.blocks import Structure, discover_blocks, layer_of_path
from planner.graph.ir import Graph
from planner.graph.onnx_import import import_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
STEMS = sorted(MANIFEST)


@lru_cache(maxsize=None)
def _load(stem: str) -> tuple[Graph, Structure]:
    graph = import_model(FIXTURES / f"{stem}.onnx", dims=MANIFEST[stem]["dims"])
    return graph, discover_blocks(graph)


def test_manifest_lists_every_fixture_and_files_are_small():
    on_disk = sorted(p.stem for p in FIXTURES.glob("*.onnx"))
    assert on_disk == STEMS
    for stem, entry in MANIFEST.items():
        size = sum((FIXTURES / f).stat().st_size for f in entry["files"])
        assert size == entry["bytes"] and size < 300_000, stem


@pytest.mark.parametrize("stem", STEMS)
def test_parameter_count_matches_torch_exactly(stem):
    graph, _ = _load(stem)
    assert graph.param_count == MANIFEST[stem]["torch_param_count"]


@pytest.mark.parametrize("stem", STEMS)
def test_symbolic_dims_are_bound_as_the_manifest_says(stem):
    graph, _ = _load(stem)
    assert dict(graph.dims) == MANIFEST[stem]["dims"]
    assert graph.flops > 0


@pytest.mark.parametrize("stem", STEMS)
def test_scopes_name_every_numbered_layer(stem):
    graph, _ = _load(stem)
    found: dict[str, set[int]] = {}
    for node in graph.nodes:
        lay = layer_of_path(node.scope)
        if lay is not None:
            found.setdefault(lay[0], set()).add(lay[1])
    expected = MANIFEST[stem]["expected"]["layers"]
    assert {k: sorted(v) for k, v in found.items()} == {k: list(range(n)) for k, n in expected.items()}


@pytest.mark.parametrize("stem", STEMS)
def test_blocks_layers_types_and_submodels(stem):
    graph, st = _load(stem)
    entry = MANIFEST[stem]
    expected = entry["expected"]
    layers = st.layers()
    by_stack: dict[str, list[int]] = {}
    for b in layers:
        by_stack.setdefault(b.stack, []).append(b.index)
    assert by_stack == {k: list(range(n)) for k, n in expected["layers"].items()}
    assert len({b.type_id for b in layers}) == expected["block_types"]
    assert len(st.submodels) == expected["submodels"]
    for stack, counts in entry["torch_layer_params"].items():  # each layer owns exactly torch's parameters
        assert [st.block(f"{stack}.{i}").param_count for i in range(len(counts))] == counts
    assert sorted(i for b in st.blocks for i in b.nodes) == list(range(len(graph.nodes)))


def test_mixed_dense_and_moe_layers_get_two_labelled_types():
    _, st = _load("qwen3_moe_mixed")
    kinds = [st.type_of(b.name).kind for b in st.layers()]
    assert kinds == ["attention", "moe", "moe"]
    assert st.type_of("model.layers.1").label == "model.layers[moe]"
    assert st.type_of("model.layers.0").label == "model.layers[dense]"
    _, mixtral = _load("mixtral_moe")
    assert {mixtral.type_of(b.name).kind for b in mixtral.layers()} == {"moe"}


def test_clip_has_a_vision_and_a_text_tower():
    graph, st = _load("clip")
    assert [s.name for s in st.submodels] == ["vision_model", "text_model"]
    assert all(s.layers == 2 for s in st.submodels)
    assert st.block("visual_projection").submodel == "vision_model"
    assert st.block("text_projection").submodel == "text_model"
    vision, text = st.block("vision_model.encoder.layers.0"), st.block("text_model.encoder.layers.0")
    assert vision.type_id != text.type_id
    assert graph.param_bytes_by_dtype().keys() == {"bfloat16"}


def test_external_data_imports_like_inline_weights():
    inline, st_inline = _load("llama_gqa")
    external, st_external = _load("llama_gqa_external")
    assert external.param_count == inline.param_count
    assert external.flops == inline.flops and len(external.nodes) == len(inline.nodes)
    assert [t.type_id for t in st_external.types] == [t.type_id for t in st_inline.types]


def test_batch_scales_forward_flops():
    small, _ = _load("llama_gqa")
    large = import_model(FIXTURES / "llama_gqa.onnx", batch=4, seq_len=8)
    assert large.dims["batch"] == 4
    assert large.flops == pytest.approx(2 * small.flops, rel=0.01)


@pytest.mark.slow
@pytest.mark.torch
def test_regeneration_is_byte_identical(tmp_path: Path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    entry = MANIFEST["vit"]
    if (torch.__version__, transformers.__version__) != (entry["torch_version"], entry["transformers_version"]):
        pytest.skip("fixtures were made with another torch/transformers version")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_torch_fixtures", FIXTURES / "make_torch_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["vit"], tmp_path) == 0
    assert (tmp_path / "vit.onnx").read_bytes() == (FIXTURES / "vit.onnx").read_bytes()
    made = json.loads((tmp_path / "manifest.json").read_text())["vit"]
    assert made["torch_param_count"] == entry["torch_param_count"]
