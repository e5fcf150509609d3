"""Tensor-parallel training and serving plans of GPT-OSS run in torch: its attention sinks (one a head, a parameter
of the attention module itself, which no torch parallel style splits) are split with the heads as declared (the
serving layouts, read from the graph, split them with the heads since `serving_layouts._per_head_vectors`).

The plans are made from `torch.onnx.export`'s default export (dynamo, optimised), where the sinks come out folded
into views (`onnx_folded.unview`), and applied to a fresh transformers model of the same config (the optimised
fixture's) on two gloo ranks.
Before `shard_own_params` the sinks stayed whole beside each rank's two heads of four and the attention's
concatenation failed ("Expected size 2 but got size 4").
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from planner.hypershard import read_document, write_document  # noqa: E402
from planner.hypershard.backends import export_to_file  # noqa: E402
from planner.hypershard.serving_doc import declare_serving_phases  # noqa: E402
from tests.forked import run_forked  # noqa: E402
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




def _serve(rank: int, folder: str) -> None:
    """The decode plan on this rank; its first attention layer (the sinks' module) run on the inputs the whole
    model gave it in one process. The serving module places the routed experts and leaves their exchange to the
    engine (`serving_py.shard_experts`), so the MoE blocks are not run."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    seen = {}
    ref = _tiny_gpt_oss()
    ref.model.layers[0].self_attn.register_forward_hook(
        lambda m, args, kwargs, out: seen.update(args=args, kwargs=kwargs, out=out[0]), with_kwargs=True)
    with torch.no_grad():
        ref(ids)
    spec = importlib.util.spec_from_file_location("serve_plan", os.path.join(folder, "serve.py"))
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    plan.use_program("decode")
    model = plan.parallelize(_tiny_gpt_oss(), plan.build_mesh("cpu"), rank)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        out = attention(*seen["args"], **seen["kwargs"])[0]
    sinks = attention._parameters["sinks"]  # the DTensor (the module reads its local shard)
    res = {"err": float((out - seen["out"]).abs().max()), "sinks": list(sinks.to_local().shape)}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def test_a_tensor_parallel_serving_plan_splits_the_sinks_with_the_heads(exported, tmp_path):
    """Read from the graph, the serving layouts split the sinks as the heads (they had declared them whole, and
    the attention's concatenation failed); the layer's output is the single process's."""
    doc = declare_serving_phases(exported, cluster="dgx-h100", prompt_len=SEQ, gen_len=4,
                                 prefill=dict(tp=2, batch=2), decode=dict(tp=2, batch=2), mode="co-located")
    write_document(doc, str(tmp_path / "serve.yaml"))
    export_to_file(read_document(str(tmp_path / "serve.yaml")), "torch", str(tmp_path / "serve.py"))
    assert "'model.layers.*.self_attn.sinks': {'dims': ['tp']" in (tmp_path / "serve.py").read_text()
    assert run_forked(_serve, [(r, str(tmp_path)) for r in range(WORLD)], 120) == [0] * WORLD
    for r in range(WORLD):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["err"] < 1e-5 and res["sinks"] == [2], res  # two sinks of four, with the rank's two heads
