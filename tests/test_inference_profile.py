"""The serving profile is read from the graph's structure: KV cache (MLA's latent too), experts, work per token."""

from __future__ import annotations

import dataclasses

import pytest

from models_zoo import param_counts
from planner.api import load_graph
from planner.errors import InvalidModel
from planner.graph.blocks import discover_blocks
from planner.inference.profile import serving_profile
from planner.inference.serve import load_profile


def profile_of(model: str, seq: int = 64, **overrides):
    g = load_graph(model, batch=1, seq_len=seq, overrides=overrides or None)
    return serving_profile(g, discover_blocks(g))


def test_mla_caches_the_compressed_latent_and_the_rope_key():
    p = profile_of("deepseek-v3", layers=4, dense_layers=1)
    a = p.layers[0].attention[0]
    # DeepSeek-V2/V3: kv_lora_rank 512 + qk_rope_head_dim 64 per token per layer, read by all 128 heads
    assert (a.cached_key, a.cached_value, a.latent, a.kv_heads) == (576, 0, True, 1)
    assert a.heads == 128 and (a.key_dim, a.value_dim) == (192, 128)
    # absorbed decode: scores over 576 wide keys and values over the 512 wide latent, per head
    assert a.decode_pair_flops == 2 * 128 * (576 + 512)
    assert a.prefill_pair_flops == 2 * 128 * (192 + 128)
    assert p.cached_elements_per_token == 4 * 576


def test_a_narrower_latent_changes_the_cache_found():
    p = profile_of("deepseek-v3", layers=2, dense_layers=1, kv_lora_rank=256)
    assert p.layers[0].attention[0].cached_key == 256 + 64


@pytest.mark.parametrize("model, per_layer, kv_heads", [("llama3-8b", 2 * 8 * 128, 8), ("llama2-7b", 2 * 4096, 32),
                                                       ("gpt3-1.3b", 2 * 2048, 16)])
def test_plain_attention_caches_k_and_v_projections(model, per_layer, kv_heads):
    p = profile_of(model, layers=2)
    a = p.layers[0].attention[0]
    assert a.cached_elements == per_layer and a.kv_heads == kv_heads and not a.latent
    assert a.decode_pair_flops == a.prefill_pair_flops  # nothing to absorb


def test_attention_with_sinks_keeps_its_kv_cache():
    """gpt-oss joins a learned sink logit to the scores (Concat) before the softmax and drops it after (Slice): the
    core is still found, and each layer caches its 8 KV heads of 64 (config: num_key_value_heads, head_dim)."""
    p = profile_of("gpt-oss-20b", layers=2)
    assert all(len(l.attention) == 1 for l in p.layers)
    a = p.layers[0].attention[0]
    assert (a.heads, a.key_dim, a.value_dim, a.kv_heads) == (64, 64, 64, 8)
    assert p.cached_elements_per_token == 2 * 2 * 8 * 64


def test_sliding_window_layers_keep_and_read_their_window_only():
    """gpt-oss bands every other layer to 128 tokens (config: sliding_window, layer_types) and the layers share one
    structure: each keeps its own window. A 8,192-token sequence then holds 8,192 tokens in the full layers and 128
    in the banded ones (vLLM's hybrid KV cache manager); a prefill's queries read at most 128 keys there, by hand:
    6 queries after no prefix with a 4-token window read 1+2+3+4+4+4 = 18 keys, 21 without it, and 3 after 5 cached
    tokens read 4 each."""
    p = profile_of("gpt-oss-20b", seq=512, layers=4)
    assert [a.window for l in p.layers for a in l.attention] == [128, 0, 128, 0]
    assert p.cached_elements_at(8192) == 2 * 8 * 64 * 2 * (8192 + 128)
    assert p.cached_elements_at(100) == 100 * p.cached_elements_per_token
    banded = dataclasses.replace(p.layers[0].attention[0], window=4)
    full = dataclasses.replace(banded, window=0)
    assert (banded.prefill_pairs(0, 6), full.prefill_pairs(0, 6), banded.prefill_pairs(5, 3)) == (18, 21, 12)
    assert banded.held(10) == 4 and full.held(10) == 10


@pytest.mark.parametrize("fixture, per_token, experts", [("llama_gqa", 2 * 2 * 2 * 8, None),
                                                        ("gpt2", 2 * 2 * 32, None),  # fused QKV, split
                                                        ("mixtral_moe", 2 * 2 * 2 * 8, (4, 2)),
                                                        ("qwen3_moe_mixed", 3 * 2 * 2 * 8, (4, 2))])
def test_torch_exports_are_read_the_same_way(fixtures_dir, manifest, fixture, per_token, experts):
    g = load_graph(str(fixtures_dir / f"{fixture}.onnx"), dims=manifest[fixture]["dims"])
    p = serving_profile(g, discover_blocks(g))
    assert p.cached_elements_per_token == per_token
    found = {(l.experts.experts, l.experts.top_k) for l in p.layers if l.experts}
    assert found == ({experts} if experts else set())
    assert p.params == pytest.approx(manifest[fixture]["torch_param_count"], rel=0.01)


def test_moe_profile_counts_active_work_and_all_weights():
    p = profile_of("deepseek-v3", seq=256, layers=5, dense_layers=1)
    total, active = param_counts("deepseek-v3", layers=5, dense_layers=1)
    assert p.params == pytest.approx(total, rel=1e-6)
    moe = [l for l in p.layers if l.experts]
    e = moe[0].experts
    assert (e.experts, e.top_k) == (256, 8) and e.params_per_expert == 3 * 7168 * 2048
    assert e.flops_per_pair == pytest.approx(2 * e.params_per_expert)
    # per token: two FLOPs per active weight that a matmul reads (the embedding table is gathered, not multiplied)
    flops = sum(l.flops_per_token + (l.experts.top_k * l.experts.flops_per_pair if l.experts else 0) for l in p.parts)
    embed = 129280 * 7168
    assert flops == pytest.approx(2 * (active - embed), rel=0.01)
    assert all(l.syncs == 2 for l in p.layers)  # attention and MLP join the residual stream


def test_the_embedding_table_is_not_streamed_but_a_tied_head_is():
    llama = profile_of("llama3-8b", layers=2)
    emb = next(p for p in llama.parts if p.kind == "pre")
    assert emb.dense_params == 128256 * 4096 and emb.streamed_params == 0
    gpt = profile_of("gpt3-1.3b", layers=2)  # the head multiplies by the embedding table
    head = next(p for p in gpt.parts if p.kind == "post")
    assert head.streamed_params >= 50257 * 2048


def test_a_graph_without_layers_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from tests.graphs import weight

    m = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], [weight("w", 8, 8)]),
        opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(m, tmp_path / "flat.onnx")
    with pytest.raises(InvalidModel, match="no repeated layers"):
        load_profile(str(tmp_path / "flat.onnx"))


@pytest.mark.parametrize("model", ["tests/fixtures/vit.onnx", "tests/fixtures/clip.onnx", "vit-l-16"])
def test_an_encoder_has_no_decode_phase_to_plan(model):
    """ViT classifies pixels; CLIP embeds text and images (its position table is indexed, but by positions the
    graph makes, and no output is over its 64-token vocabulary): neither generates tokens."""
    with pytest.raises(InvalidModel, match="does not generate text"):
        load_profile(model, overrides={"layers": 2} if not model.endswith(".onnx") else None)


def test_token_generators_pass_the_check_whatever_their_exporter():
    for fixture in ("gpt2", "llama_gqa", "mixtral_moe", "qwen3_moe_mixed"):
        assert load_profile(f"tests/fixtures/{fixture}.onnx").layers


def _with_static_cache(proto):
    """Each attention's K and V written into a preallocated cache first (ScatterND of this step's entries, as a
    static cache's index_copy exports), and attention read from the cache: what torch exports for generation."""
    import onnx
    from onnx import helper

    g = proto.graph
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list] = {}
    for n in g.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in onnx.shape_inference.infer_shapes(proto).graph.value_info}
    g.initializer.append(onnx.numpy_helper.from_array(__import__("numpy").zeros((1, 1), dtype="int64"), "slot"))
    for k, softmax in enumerate([n for n in g.node if n.op_type == "Softmax"]):
        x = softmax.input[0]
        while producer[x].op_type != "MatMul":
            x = producer[x].input[0]
        qk, av = producer[x], readers[softmax.output[0]][0]
        for node, idx, tag in ((qk, 1, "k"), (av, 1, "v")):
            new, past = f"cache_{tag}{k}", f"past_{tag}{k}"
            g.input.append(helper.make_tensor_value_info(past, onnx.TensorProto.FLOAT, shapes[node.input[idx]]))
            g.node.append(helper.make_node("ScatterND", [past, "slot", node.input[idx]], [new]))
            node.input[idx] = new
    from planner.graph.onnx_read import topo_order

    order = topo_order(g)
    nodes = [g.node[i] for i in order]
    copied = [onnx.NodeProto() for _ in nodes]
    for c, n in zip(copied, nodes):
        c.CopyFrom(n)
    del g.node[:]
    g.node.extend(copied)
    return proto


def test_a_static_cache_written_by_scatter_still_caches_the_latent():
    import models_zoo

    from planner.graph.onnx_import import import_model

    proto = _with_static_cache(models_zoo.build("deepseek-v3", layers=2, dense_layers=1, seq_len=32, batch=1,
                                                flat=True))
    assert sum(n.op_type == "ScatterND" and n.output[0].startswith("cache_") for n in proto.graph.node) == 4
    g = import_model(proto)
    p = serving_profile(g, discover_blocks(g))
    a = p.layers[0].attention[0]
    assert (a.cached_key, a.cached_value, a.latent) == (576, 0, True)  # not the 128 heads' K and V it wrote
