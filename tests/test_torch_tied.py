"""The torch export of a model whose head is tied to its embedding, applied for real: GPT-2 (the exported
fixture `tests/fixtures/gpt2.onnx`, planned from its ONNX graph, run on Hugging Face's GPT2LMHeadModel of the
same config) over 4 gloo processes on the CPU gives the single-process loss and gradients.

Scenarios: data parallel (FSDP2); tensor parallel as the planner lays it out (the tied vocabulary weight and
the position embedding split, the lookup as an embedding and the head as a linear, one weight still); a
1F1B pipeline of 2 stages, the lookup in the first and the head in the second (their gradients summed
across the stages after the step); and the same pipeline with tensor parallelism. Without that sum the
pipeline's tied weight had a gradient error of 0.067 here. A plan that splits GPT-2's Conv1D weights
(stored [in, out]) is refused before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.errors import InvalidInput  # noqa: E402
from planner.hypershard import declare  # noqa: E402
from planner.hypershard.backends import export  # noqa: E402
from tests.torch_runs import launch, ok  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

GPT2 = Path(__file__).parent / "fixtures" / "gpt2.onnx"
CONFIG = json.loads((GPT2.parent / "manifest.json").read_text())["gpt2"]["config"]
WORLD, BATCH, SEQ, VOCAB = 4, 8, 8, CONFIG["vocab_size"]
#: name -> (strategy, hand-edited, run as a pipeline): as the planner declares them
SCENARIOS = {
    "dp": (dict(zero=1), False, False),
    "tp": (dict(tp=2), False, False),
    "pp": (dict(pp=2, zero=1), False, True),
    "pp_tp": (dict(pp=2, tp=2), False, True),
}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = {k: v for k, v in CONFIG.items() if k != "transformers_version"}
    cfg.update(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)  # dropout draws differ between the runs
    return GPT2LMHeadModel(GPT2Config(**cfg)).float()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory.mktemp("torch_tied"), WORLD, SCENARIOS, str(GPT2), None, _gpt2,
                  (BATCH, SEQ, VOCAB))


@pytest.mark.parametrize("name", ["dp", "tp"])
def test_loss_and_gradients_match_the_single_process_run(runs, name):
    for r, row in zip(runs, ok(runs, name)):
        assert row["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["pp", "pp_tp"])
def test_a_pipeline_sums_the_tied_weights_gradients_across_its_stages(runs, name):
    rows = ok(runs, name)  # every rank's gradients, the tied weight's copy on both stages among them
    last = [row["loss"] for row in rows if row["last"]]
    assert len(last) == 2 and sum(last) / len(last) == pytest.approx(runs[0]["ref_loss"], rel=1e-5)


def test_the_tensor_parallel_plan_splits_the_tied_weight():
    doc = declare(str(GPT2), cluster="dgx-a100", devices=WORLD, global_batch=BATCH, seq_len=SEQ, dtype="fp32", tp=2)
    assert doc["layouts"]["params"]["lm_head.weight"]["dims"] == ["tp", None]  # what the runs above apply


def test_a_split_conv1d_weight_is_refused_in_one_sentence():
    doc = declare(str(GPT2), cluster="dgx-a100", devices=WORLD, global_batch=BATCH, seq_len=SEQ, dtype="fp32", tp=2,
                  sp=True)
    assert doc["layouts"]["params"]["transformer.h.*.attn.c_attn.weight"]["dims"] == [None, "tp"]
    with pytest.raises(InvalidInput, match=r"splits linear weights stored \[out, in\] \(nn.Linear\), and "
                                           r"transformer.h.\*.attn.c_attn.weight \(in .*\) is split as an \[in, out\]"):
        export(doc, "torch")


def test_a_head_tied_to_a_hidden_split_embedding_gives_whole_logits():
    """Qwen2's tied head under TP2 with sequence parallelism, its embedding split on the hidden dim: the head is
    row-parallel and its logits had left as a DTensor split by sequence, which the loss refused ('mixed
    torch.Tensor and DTensor') and a pipeline's last stage cut to half the sequence (QA of 2026-12-07)."""
    from torch import nn
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,
                                                   SequenceParallel)

    from planner.hypershard.backends.torch_tp import TP_SRC

    table = {"op": "embedding", "dims": [None, "tp"], "input": ["dp", None]}
    ns = dict(nn=nn, Replicate=Replicate, Shard=Shard, ColwiseParallel=ColwiseParallel, RowwiseParallel=RowwiseParallel,
              PrepareModuleOutput=PrepareModuleOutput, SequenceParallel=SequenceParallel, SEQUENCE_PARALLEL=True,
              layout_of=lambda name: table)
    exec(TP_SRC, ns)  # the generated module's own source
    head = ns["_as_used_by"](table, nn.Linear(8, 16, bias=False), True)
    style = ns["_style"](head)
    assert isinstance(style, RowwiseParallel)
    assert style.output_layouts == (Replicate(),) and style.use_local_output  # whole logits, a plain tensor
    assert style.input_layouts == (Shard(1),)  # the stream arrives split by sequence
    lookup = ns["_style"](ns["_as_used_by"](table, nn.Embedding(16, 8), False))
    assert isinstance(lookup, ColwiseParallel)
