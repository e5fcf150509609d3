"""Serving declarations through the backends: torch applied for real on 2 gloo processes (tensor parallelism, each
rank's experts), JAX placing each phase's arrays on its own host devices, ONNX annotating every node for both phases.
A hand-chosen Mixtral plan on 64 NPUs spreads its 8 experts over ep 12 and 40 (uneven): the backends that split arrays
evenly refuse it, torch and ONNX write its ranges.
"""

from __future__ import annotations

import importlib.util
import json
import os
import types

import numpy as np
import onnx
import pytest

from planner.errors import InvalidInput
from planner.hypershard import read_document, write_document
from planner.hypershard.backends import export, export_to_file
from planner.hypershard.serving_doc import declare_serving_phases
from planner.hypershard.validate import validate_document
from tests.jax_plan import run_jax_plan

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)


@pytest.fixture(scope="module")
def uneven() -> dict:
    """Mixtral on 64 NPUs as main's planner once chose it: 8 experts over prefill's ep 12 and decode's 40."""
    return declare_serving_phases("mixtral-8x7b", cluster="cloudmatrix384", devices=64, prompt_len=4096, gen_len=1024,
                                  prefill=dict(dp=12, pp=2, batch=10), decode=dict(dp=40, batch=156))


@pytest.mark.parametrize("backend", ["jax", "hyper-parallel", "mindspore", "onnx"])
def test_an_uneven_expert_split_is_refused_where_arrays_split_evenly(uneven, backend):
    words = ("the onnx backend splits a dim into equal shards only, and model.layers.0.mlp.experts.gate_up_proj "
             "splits 8 over 12" if backend == "onnx" else
             f"the {backend} backend splits arrays evenly, and prefill spreads 8 experts over ep 12 ")
    with pytest.raises(InvalidInput, match=words):
        export(uneven, backend)
    compile(export(uneven, "torch"), "uneven_torch.py", "exec")


def _module(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.mark.torch
def test_torch_export_gives_each_rank_its_experts(uneven):
    torch = pytest.importorskip("torch")
    doc = uneven
    plan = _module(export(doc, "torch"), "serve_torch")
    for prog in doc["programs"]:
        first = prog["ranks"]["first"]
        assert plan.use_program(first) == prog["name"]
        ep = prog["stages"][0]["ranks"]["count"]
        want = [(int(c[0]), int(c[-1]) + 1) if len(c) else None for c in np.array_split(np.arange(8), ep)]
        for rank in range(first, first + ep):
            layer = torch.nn.Module()
            layer.experts = torch.nn.Module()
            layer.experts.gate_up_proj = torch.nn.Parameter(torch.arange(8.0).reshape(8, 1, 1))
            model = torch.nn.Module()
            model.model = torch.nn.Module()
            model.model.layers = torch.nn.ModuleList([torch.nn.Module()])
            model.model.layers[0].mlp = layer
            lo, hi = plan.shard_experts(model, rank)
            kept = model.model.layers[0].mlp.experts.gate_up_proj.flatten().tolist()
            assert kept == [float(e) for e in range(lo, hi)]
            assert want[rank - first] == ((lo, hi) if hi > lo else None)
    assert plan.use_program("decode") == "decode" and plan.MESH == [("pp", 1), ("dp", 40), ("tp", 1)]


def _rendezvous(folder) -> str:
    """Where the processes meet: a file, not a TCP port (a free port probed here can be taken by another
    process on a shared machine before rank 0 binds it)."""
    return f"file://{folder}/rendezvous"


def _tiny_llama(torch):
    """A Llama with Hugging Face's module names (those of the zoo's llama3-8b), in plain torch."""
    nn = torch.nn
    torch.manual_seed(0)
    h, heads, ffn, vocab = TINY["hidden"], TINY["heads"], TINY["ffn"], TINY["vocab"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h, bias=False) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, -1, h // heads).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, h, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.self_attn, self.mlp = Attention(), Mlp()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(vocab, h)
            self.model.layers = nn.ModuleList([Layer() for _ in range(TINY["layers"])])
            self.model.norm = nn.RMSNorm(h)
            self.lm_head = nn.Linear(h, vocab, bias=False)

        def forward(self, ids):
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x)
            return self.lm_head(self.model.norm(x))

    return Llama()


def _tp_worker(rank: int, init: str, path: str, folder: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    ids = torch.randint(0, TINY["vocab"], (2, 8), generator=torch.Generator().manual_seed(1))
    ref = _tiny_llama(torch)(ids)
    spec = importlib.util.spec_from_file_location("serve_plan", path)
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    plan.use_program("decode")
    model = plan.parallelize(_tiny_llama(torch), plan.build_mesh("cpu"), rank)
    with torch.no_grad():
        out = model(ids)
    q = model.model.layers[0].self_attn.q_proj.weight
    res = {"err": float((out - ref).abs().max()), "q_local": list(q.to_local().shape),
           "q_placements": str(q.placements), "o_placements": str(model.model.layers[0].self_attn.o_proj.weight.placements)}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


@pytest.mark.torch
def test_torch_export_serves_with_tensor_parallelism_on_two_processes(tmp_path):
    """The decode plan (tp 2, Megatron's layouts read from the graph) applied to a tiny Llama over 2 gloo processes
    gives the single-process logits."""
    pytest.importorskip("torch")
    from tests.forked import run_forked

    doc = declare_serving_phases("llama3-8b", cluster="dgx-h100", prompt_len=8, gen_len=4, overrides=TINY,
                                 prefill=dict(tp=2, batch=2), decode=dict(tp=2, batch=2), mode="co-located")
    write_document(doc, str(tmp_path / "tiny.yaml"))
    assert validate_document(read_document(str(tmp_path / "tiny.yaml"))).ok
    export_to_file(read_document(str(tmp_path / "tiny.yaml")), "torch", str(tmp_path / "tiny.py"))
    init = _rendezvous(tmp_path)
    assert run_forked(_tp_worker, [(r, init, str(tmp_path / "tiny.py"), str(tmp_path)) for r in (0, 1)], 120) == [0, 0]
    for r in (0, 1):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["err"] < 1e-5, res
        assert res["q_local"] == [TINY["hidden"] // 2, TINY["hidden"]] and "Shard(dim=0)" in res["q_placements"]
        assert "Shard(dim=1)" in res["o_placements"]


@pytest.mark.jax
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_export_places_each_phase_on_its_own_devices(tmp_path):
    doc = declare_serving_phases("mixtral-8x7b", cluster="dgx-h100", prompt_len=16, gen_len=8,
                                 overrides=dict(TINY, experts=4, top_k=2), prefill=dict(tp=2, dp=2, batch=1),
                                 decode=dict(dp=4, batch=2))
    path = tmp_path / "serve_jax.py"
    export_to_file(doc, "jax", str(path))
    names = {"model.layers.0.self_attn.q_proj.weight": [64, 64], "model.layers.0.mlp.experts.gate_up_proj": [4, 256, 64]}
    got = run_jax_plan(path, 8, (
        "out = {}\n"
        "for phase in ('prefill', 'decode'):\n"
        "    m.use_program(phase)\n"
        "    mesh = m.build_mesh()\n"
        f"    arrays = m.shard_params({{n: np.zeros(s, np.float32) for n, s in {names!r}.items()}}, mesh)\n"
        "    out[phase] = {'devices': [d.id for d in mesh.devices.flat], 'shards': {n: sorted([s.device.id, "
        "[[i.start or 0, i.stop] for i in s.index]] for s in a.addressable_shards) for n, a in arrays.items()}}\n"
        "print(json.dumps(out))\n"
    ))
    assert got["prefill"]["devices"] == [0, 1, 2, 3] and got["decode"]["devices"] == [4, 5, 6, 7]
    q = dict((d, idx) for d, idx in got["prefill"]["shards"]["model.layers.0.self_attn.q_proj.weight"])
    assert [q[r][0] for r in range(4)] == [[0, 32], [32, 64]] * 2  # column-parallel over tp (the fastest axis)
    for phase, first in (("prefill", 0), ("decode", 4)):  # one expert per ep coordinate (tp + 2 dp, or dp)
        e = dict((d, idx) for d, idx in got[phase]["shards"]["model.layers.0.mlp.experts.gate_up_proj"])
        assert [e[first + c][0] for c in range(4)] == [[c, c + 1] for c in range(4)]


def test_onnx_export_annotates_every_node_for_both_phases(tmp_path):
    doc = declare_serving_phases("mixtral-8x7b", cluster="cloudmatrix384", devices=32, prompt_len=4096,
                                 gen_len=1024, prefill=dict(dp=8, pp=2, batch=10), decode=dict(dp=8, pp=2, batch=156))
    export_to_file(doc, "onnx", str(tmp_path / "serve.onnx"))
    model = onnx.load(str(tmp_path / "serve.onnx"), load_external_data=False)
    onnx.checker.check_model(model)
    k = doc["programs"][0]["ranks"]["count"]
    assert [(c.name, list(c.device)) for c in model.configuration] == [
        ("hyperplan/prefill", [str(r) for r in range(k)]), ("hyperplan/decode", [str(r) for r in range(k, 32)])]
    specs = {}
    for node in model.graph.node:
        for dc in node.device_configurations:
            for s in dc.sharding_spec:
                specs.setdefault((dc.configuration_id, s.tensor_name), (dc.pipeline_stage, s))
    pp, ep = (doc["programs"][0]["estimate"]["strategy"][k] for k in ("pp", "ep"))
    assert (pp, ep) == (2, 8)
    stage, spec = specs[("hyperplan/prefill", "model.layers.31.mlp.experts.gate_up_proj")]
    assert stage == pp - 1 and [(x.dim_value, x.num_shards) for x in spec.sharded_dim[0].simple_sharding] == [(8, 8)]
    groups = {e.key: list(e.value) for e in spec.index_to_device_group_map}
    held = [groups.get(d, [d]) for d in spec.device]
    assert held == [[(pp - 1) * ep + c] for c in range(ep)]  # the last stage's ranks, one ep coordinate each
    stage, spec = specs[("hyperplan/decode", "model.layers.0.mlp.experts.gate_up_proj")]
    groups = {e.key: list(e.value) for e in spec.index_to_device_group_map}
    held = [groups.get(d, [d]) for d in spec.device]
    assert stage == 0 and [(x.dim_value, x.num_shards) for x in spec.sharded_dim[0].simple_sharding] == [(8, 8)]
    names = list(model.configuration[1].device)  # decode's devices, named by global rank
    assert [[names[i] for i in g] for g in held] == [[str(k + c)] for c in range(ep)]  # its first stage, after prefill
