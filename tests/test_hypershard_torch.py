"""The torch export applied for real: a tiny Llama, parallelised by the exported plan over 4 gloo processes on
the CPU, gives the single-process loss and gradients.

Scenarios (one process group, one fork, so torch and transformers are imported once): tensor parallel,
tensor + sequence parallel, FSDP2 ZeRO-3 with full recompute, HSDP ZeRO-0 with selective recompute,
FSDP2 ZeRO-2 with the first layer fully recomputed and the other selectively, 1F1B pipeline x tensor
parallel, the same with sequence parallelism (the sequence-split stream crosses the stage boundary as each
rank's slice), the same with one micro-batch for two stages (torch's 1F1B refuses it; run in GPipe's order, which
1F1B is then), 1F1B pipeline x FSDP, and FSDP2 with its parameters in host memory (no pinned memory on a host
without a GPU); interleaved pipelines of a 4-layer Llama (two chunks per stage, with FSDP and with TP + SP);
and on 3 processes, 1F1B pipelines whose two stages differ in width
(1 + 2 and 2 + 1 tensor ranks), each stage on its own mesh. Each declaration goes through a file and
`validate` before it is exported. The tensor-parallel ones are hand-edited to Megatron's layouts: at hidden
64 the planner keeps most weights whole (splitting them does not pay), and hand-edited files are
first-class.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.torch_runs import launch, ok  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORLD, BATCH, SEQ, VOCAB = 4, 8, 16, 128
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=VOCAB, ffn=128)
#: name -> (strategy, hand-edited to Megatron layouts, run as a pipeline)
SCENARIOS = {
    "tp": (dict(tp=4), True, False),
    "tp_sp": (dict(tp=4, sp=True), True, False),
    "fsdp_zero3_full": (dict(zero=3, recompute="full"), False, False),
    "hsdp_zero0_selective": (dict(zero=0, recompute="selective"), False, False),
    "fsdp_first_layer_full": (dict(zero=2, recompute="selective", full_recompute_layers=1), False, False),
    "pp_tp": (dict(pp=2, tp=2), True, True),
    "pp_tp_sp": (dict(pp=2, tp=2, sp=True), True, True),
    "pp_fsdp": (dict(pp=2, zero=1), False, True),
    "pp_tp_one_microbatch": (dict(pp=2, tp=2, micro_batch=BATCH), True, True),  # fewer micro-batches than stages
    "fsdp_offload": (dict(zero=3, offload=(("params", 1.0),)), False, False),  # host memory, nothing pinned
}
#: stages of different widths, on WIDTH_WORLD processes (widest stage on the first ranks)
WIDTH_WORLD = 3
WIDTH_SCENARIOS = {
    "pp_widths_1_2": (dict(tp=2, pp=2, stage_tp=(1, 2)), True, True),
    "pp_widths_2_1": (dict(tp=2, pp=2, stage_tp=(2, 1)), True, True),
}


#: interleaved pipelines (two chunks per stage) of a 4-layer Llama, on WORLD processes
VPP_SCENARIOS = {
    "pp_vpp_fsdp": (dict(pp=2, vpp=2, zero=1), False, True),
    "pp_vpp_tp_sp": (dict(pp=2, vpp=2, tp=2, sp=True), True, True),
    # the embedding alone in the first chunk, the final norm and head alone in the last (Megatron's accounted split)
    "pp_vpp_ends_alone": (dict(pp=2, vpp=2, zero=1, stage_layers=(0, 2, 2, 0)), False, True),
}


def _tiny_llama(layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).float()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("torch_export"), WORLD, SCENARIOS, "llama3-8b", TINY, _tiny_llama,
                  (BATCH, SEQ, VOCAB))


@pytest.fixture(scope="module")
def width_runs(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("torch_widths"), WIDTH_WORLD, WIDTH_SCENARIOS, "llama3-8b", TINY,
                  _tiny_llama, (BATCH, SEQ, VOCAB))


@pytest.fixture(scope="module")
def vpp_runs(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("torch_vpp"), WORLD, VPP_SCENARIOS, "llama3-8b", dict(TINY, layers=4),
                  lambda: _tiny_llama(4), (BATCH, SEQ, VOCAB))


@pytest.mark.parametrize("name", ["tp", "tp_sp", "fsdp_zero3_full", "hsdp_zero0_selective", "fsdp_first_layer_full",
                                  "fsdp_offload"])
def test_loss_and_gradients_match_the_single_process_run(runs, name):
    for r, row in zip(runs, ok(runs, name)):
        assert row["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)


def test_tensor_parallel_really_shards_the_weights(runs):
    for name in ("tp", "tp_sp"):
        for row in ok(runs, name):
            assert row["q_placements"] == "(Shard(dim=0),)" and row["q_local"] == [16, 64]


def test_fsdp_shards_by_the_zero_stage_and_wraps_layers_for_recompute(runs):
    for row in ok(runs, "fsdp_zero3_full"):
        assert "Shard(dim=0)" in row["q_placements"] and row["q_local"] == [16, 64]
        assert row["layer0"].startswith("FSDPCheckpointWrapper")
    for row in ok(runs, "hsdp_zero0_selective"):  # ZeRO-0: replicated over dp (HSDP with one shard)
        assert row["q_placements"].startswith("(Replicate()") and row["q_local"] == [64, 64]
        assert "CheckpointWrapper" in row["layer0"]


@pytest.mark.parametrize("name", ["pp_tp", "pp_tp_sp", "pp_fsdp", "pp_tp_one_microbatch"])
def test_pipeline_stages_match_the_single_process_run(runs, name):
    rows = ok(runs, name)
    last = [row for row in rows if row["last"]]
    assert len(last) == 2 and all(len(row) for row in rows)
    mean = sum(row["loss"] for row in last) / len(last)  # pp_fsdp: two data-parallel pipelines, half a batch each
    assert mean == pytest.approx(runs[0]["ref_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(WIDTH_SCENARIOS))
def test_stages_of_different_widths_match_the_single_process_run(width_runs, name):
    """Each stage on its own mesh (the wide one tensor-parallel over 2 ranks, the narrow one whole on 1), the
    hand-off between them point to point: the last stage's loss and every rank's gradients are the reference's."""
    rows = ok(width_runs, name)
    widths = WIDTH_SCENARIOS[name][0]["stage_tp"]
    wide = 0 if widths[0] == 2 else 1
    assert [row["last"] for row in rows] == [wide == 1] * 2 + [wide == 0]  # ranks 0-1: the wide stage
    assert [row["tp_sharded"] for row in rows] == [True, True, False]
    for row in rows:
        if row["last"]:
            assert row["loss"] == pytest.approx(width_runs[0]["ref_loss"], rel=1e-5)


@pytest.mark.parametrize("name", sorted(VPP_SCENARIOS))
def test_interleaved_pipelines_match_the_single_process_run(vpp_runs, name):
    """Two chunks per stage (torch's ScheduleInterleaved1F1B): the last stage's loss and every rank's gradients
    are the reference's."""
    rows = ok(vpp_runs, name)
    last = [row["loss"] for row in rows if row["last"]]
    assert len(last) == 2 and sum(last) / len(last) == pytest.approx(vpp_runs[0]["ref_loss"], rel=1e-5)
