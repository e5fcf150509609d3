"""The torch export of a mixture-of-experts model applied for real: a tiny Mixtral (4 experts, top-2),
parallelised by the exported plan over 4 gloo processes on the CPU, gives the single-process loss and
gradients.

Scenarios (one process group, one fork): data parallel with whole experts (FSDP2, ZeRO-1); expert parallel
over 2 of the 4 data-parallel ranks (ZeRO-1, so experts are sharded over the 2 expert-data-parallel ranks);
over all 4 with ZeRO-3 and full recompute (the all-to-all runs again in the recomputed forward); over 2
with ZeRO-0 (plain data parallel, HSDP with one shard); and a 1F1B pipeline of 2 stages whose 2
data-parallel ranks split the experts. Each declaration goes through a file and `validate` before it is
exported, as the planner wrote it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.torch_runs import launch, ok  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORLD, BATCH, SEQ, VOCAB, EXPERTS = 4, 8, 16, 128, 4
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=VOCAB, ffn=32, experts=EXPERTS, top_k=2)
#: name -> (strategy, hand-edited, run as a pipeline): as the planner declares them
SCENARIOS = {
    "dp_zero1": (dict(zero=1, ep=1), False, False),
    "ep2_zero1": (dict(zero=1, ep=2), False, False),
    "ep4_zero3_full": (dict(zero=3, ep=4, recompute="full"), False, False),
    "ep2_zero0": (dict(zero=0, ep=2), False, False),
    "pp2_ep2": (dict(pp=2, zero=1, ep=2), False, True),
}


def _tiny_mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, num_local_experts=EXPERTS,
                        num_experts_per_tok=2, max_position_embeddings=64, use_cache=False,
                        attn_implementation="eager")
    model = MixtralForCausalLM(cfg).float()
    with torch.no_grad():  # experts at 0.2, so that their outputs and gradients stand well above the tolerance
        for p in model.parameters():
            if p.dim() == 3:
                p.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("torch_experts"), WORLD, SCENARIOS, "mixtral-8x7b", TINY, _tiny_mixtral,
                  (BATCH, SEQ, VOCAB))


@pytest.mark.parametrize("name", ["dp_zero1", "ep2_zero1", "ep4_zero3_full", "ep2_zero0"])
def test_loss_and_gradients_match_the_single_process_run(runs, name):
    rows = ok(runs, name)
    assert abs(rows[0]["loss"] - runs[0]["ref_loss"]) < 1e-5


@pytest.mark.parametrize("name, ep", [("dp_zero1", 1), ("ep2_zero1", 2), ("ep4_zero3_full", 4), ("ep2_zero0", 2),
                                      ("pp2_ep2", 2)])
def test_each_rank_keeps_only_its_share_of_the_experts(runs, name, ep):
    assert {r[name]["local_experts"] for r in runs} == {EXPERTS // ep}


def test_a_pipeline_whose_data_parallel_ranks_split_the_experts_matches(runs):
    rows = ok(runs, "pp2_ep2")
    last = [r["loss"] for r in rows if r["last"]]
    assert len(last) == 2 and abs(sum(last) / 2 - runs[0]["ref_loss"]) < 1e-5
