"""The torch serving export of a mixture-of-experts model applied for real: a tiny Hugging Face Mixtral (4 experts,
top-2) served by the exported decode plan over 2 gloo processes on the CPU gives the single-process logits.

Each rank keeps its 2 of the 4 experts (`shard_experts`), so a token whose experts live on the other rank must be
sent there and its result sent back (`route_experts`). With the experts over the data-parallel ranks each rank serves
its own sequences; with them over the tensor-parallel ranks both serve the same ones, attention split as the plan
lays it out, and each sends half of them through the experts. Before the exchange the exported plan only cut the
experts, and the model then failed in its first MoE layer (RuntimeError: matrix batch sizes have to match: its
experts module indexes all 4 experts' weights).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.hypershard import read_document, write_document  # noqa: E402
from planner.hypershard.backends import export_to_file  # noqa: E402
from planner.hypershard.serving_doc import declare_serving_phases  # noqa: E402
from planner.hypershard.validate import validate_document  # noqa: E402
from tests.forked import run_forked  # noqa: E402
from tests.torch_runs import tiny_mixtral  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

VOCAB, EXPERTS, SEQ = 128, 4, 8
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=VOCAB, ffn=32, experts=EXPERTS, top_k=2)
#: name -> the decode phase's layout (experts over its tp x dp ranks)
LAYOUTS = {"ep_over_dp": dict(dp=2, batch=2), "ep_over_tp": dict(tp=2, batch=2)}


def _tiny_mixtral():
    return tiny_mixtral(VOCAB, EXPERTS).eval()


def _counting(model, pairs: list[int]):
    """`model` with each experts module's own forward counting into `pairs` the (token, expert) pairs it computes;
    the export's routing then calls the counting forward on what reaches the rank."""
    for name, module in model.named_modules():
        if name.endswith("mlp.experts"):
            def forward(hidden_states, top_k_index, top_k_weights, compute=module.forward):
                pairs.append(top_k_index.numel())
                return compute(hidden_states, top_k_index, top_k_weights)
            module.forward = forward
    return model


def _worker(rank: int, init: str, folder: str, names: list[str]) -> None:
    """Each layout's plan applied in turn (one process group, one fork) to a fresh model; rank{r}_{name}.json."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    for name in names:
        own = "dp" in LAYOUTS[name]  # data-parallel ranks serve sequences of their own
        ids = torch.randint(0, VOCAB, (2, 2, SEQ), generator=torch.Generator().manual_seed(1))[rank if own else 0]
        ref_pairs, pairs = [], []
        with torch.no_grad():
            ref = _counting(_tiny_mixtral(), ref_pairs)(ids).logits
        spec = importlib.util.spec_from_file_location("serve_plan", os.path.join(folder, f"{name}.py"))
        plan = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plan)
        plan.use_program("decode")
        model = plan.parallelize(_counting(_tiny_mixtral(), pairs), plan.build_mesh("cpu"), rank)
        with torch.no_grad():
            out = model(ids).logits
        experts = model.model.layers[0].mlp.experts
        res = {"err": float((out - ref).abs().max()), "scale": float(ref.abs().max()),
               "kept": int(experts.gate_up_proj.shape[0]), "num_experts": int(experts.num_experts),
               "pairs": sum(pairs), "ref_pairs": sum(ref_pairs), "own": own}
        with open(os.path.join(folder, f"rank{rank}_{name}.json"), "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, list[dict]]:
    """Every layout's decode plan, declared, written, validated and exported, served on the same 2 processes; each
    layout's two ranks' results."""
    folder = tmp_path_factory.mktemp("serving_experts")
    for name, layout in LAYOUTS.items():
        doc = declare_serving_phases("mixtral-8x7b", cluster="dgx-h100", prompt_len=SEQ, gen_len=4, overrides=TINY,
                                     prefill=layout, decode=layout, mode="co-located")
        write_document(doc, str(folder / f"{name}.yaml"))
        assert validate_document(read_document(str(folder / f"{name}.yaml"))).ok
        export_to_file(read_document(str(folder / f"{name}.yaml")), "torch", str(folder / f"{name}.py"))
    init = f"file://{folder}/rendezvous"
    assert run_forked(_worker, [(r, init, str(folder), sorted(LAYOUTS)) for r in (0, 1)], 180) == [0, 0]
    return {name: [json.loads((folder / f"rank{r}_{name}.json").read_text()) for r in (0, 1)] for name in LAYOUTS}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_rank_serves_its_tokens_through_the_experts_of_both(name, served):
    for res in served[name]:
        assert res["kept"] == res["num_experts"] == EXPERTS // 2, res
        assert res["err"] < 1e-5 * max(1.0, res["scale"]), res


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_token_goes_through_its_experts_once(name, served):
    """The (token, expert) pairs the experts compute over both ranks are those of the tokens served, each token
    through its top-k experts once: with the experts over the tensor ranks, which hold the same tokens, each rank
    sends its half (the estimate's tokens / tp a rank); before, both sent all of them and every pair ran twice."""
    ranks = served[name]
    assert all(r["pairs"] > 0 for r in ranks), ranks
    served_pairs = sum(r["ref_pairs"] for r in ranks) if ranks[0]["own"] else ranks[0]["ref_pairs"]
    a_rank = TINY["layers"] * 2 * SEQ * TINY["top_k"]  # layers x sequences x tokens x top-k
    assert served_pairs == a_rank * (2 if ranks[0]["own"] else 1)
    assert sum(r["pairs"] for r in ranks) == served_pairs, ranks
