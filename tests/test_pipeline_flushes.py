"""Several pipeline schedules per step (`Strategy.flushes`: torchtitan's and NeMo Automodel's gradient-accumulation
steps under a pipeline): each schedule fills and drains the pipeline, and holds only its own micro-batches."""

from __future__ import annotations

import pytest

from planner.api import estimate_model
from planner.errors import InvalidInput
from planner.hypershard import declare, strategy_of
from planner.hypershard.backends import export
from planner.strategy import Strategy, Workload

SMALL = dict(layers=8, vocab=32000)


def _estimate(flushes: int, **kw) -> dict:
    base = dict(cluster="dgx-h100", devices=16, global_batch=32, seq_len=2048, pp=4, dp=4, overrides=SMALL)
    return estimate_model("llama3-8b", flushes=flushes, **(base | kw))


def test_each_schedule_fills_and_drains_the_pipeline():
    """1F1B over m micro-batches idles each stage for the others' fill and drain once (Narayanan 2021: the bubble
    is (pp - 1) micro-batch times whatever m is), so k schedules idle k times; the work itself is the step's."""
    one, two, four = (_estimate(k)["breakdown_s"] for k in (1, 2, 4))
    assert one["pp_bubble"] > 0
    assert two["pp_bubble"] == pytest.approx(2 * one["pp_bubble"], rel=1e-9)
    assert four["pp_bubble"] == pytest.approx(4 * one["pp_bubble"], rel=1e-9)
    assert four["compute"] == pytest.approx(one["compute"], rel=1e-12)


def test_a_schedule_holds_only_its_own_micro_batches():
    """The first stage of 1F1B holds min(pp, m) micro-batches' activations: with 8 over 4 schedules, 2 of 4."""
    one, four = (_estimate(k)["memory_gib"] for k in (1, 4))
    assert four["activations"] == pytest.approx(one["activations"] / 2, rel=1e-6)


def test_schedules_split_the_step_evenly_and_need_a_pipeline():
    work = Workload(global_batch=32, seq_len=128)
    assert Strategy(pp=4, dp=4, flushes=2).schedule_micro_batches(work) == 4
    with pytest.raises(InvalidInput, match="needs --pp greater than 1"):
        Strategy(dp=4, flushes=2)
    with pytest.raises(InvalidInput, match="do not split evenly over --flushes 3"):
        Strategy(pp=4, dp=4, flushes=3).micro_batches(work)
    with pytest.raises(InvalidInput, match="needs the 2 micro-batches per schedule to be a multiple of --pp 4"):
        Strategy(pp=4, vpp=2, dp=4, flushes=4).micro_batches(work)


@pytest.fixture(scope="module")
def flushed():
    return declare("llama3-8b", overrides=dict(layers=4, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128),
                   cluster="dgx-h100", devices=8, global_batch=16, seq_len=32, pp=2, dp=4, zero=1, flushes=2,
                   stack="torchtitan")


def test_a_declaration_keeps_its_schedules(flushed):
    assert flushed["programs"][0]["pipeline_flushes"] == 2
    assert strategy_of(flushed).flushes == 2


@pytest.mark.parametrize("backend", ["megatron", "deepspeed", "mindformers", "torch", "jax", "mindspore",
                                     "hyper-parallel", "onnx"])
def test_formats_that_run_one_schedule_per_step_refuse_in_one_sentence(flushed, backend):
    with pytest.raises(InvalidInput, match=f"runs 2 pipeline schedules per step .* the {backend} backend runs all "
                                           "of a step's micro-batches in one") as err:
        export(flushed, backend)
    assert "\n" not in str(err.value)


def test_a_hand_edited_schedule_count_is_scored_as_written(flushed, tmp_path):
    """Editing pipeline_flushes in the file changes the estimate as the option does: the declaration is read back."""
    import copy

    from planner.hypershard.declared import estimate_declared
    from planner.hypershard.io import write_document

    doc = copy.deepcopy(flushed)
    doc["programs"][0]["pipeline_flushes"] = 1
    path = tmp_path / "one.yaml"
    write_document(doc, str(path))
    got = estimate_declared(str(path), "llama3-8b")
    kw = dict(cluster="dgx-h100", devices=8, global_batch=16, seq_len=32, pp=2, dp=4, zero=1, stack="torchtitan",
              overrides=dict(layers=4, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128))
    assert got["step_time_s"] == estimate_model("llama3-8b", flushes=1, **kw)["step_time_s"]
    two = estimate_model("llama3-8b", flushes=2, **kw)["step_time_s"]
    assert flushed["estimate"]["step_time_s"] == pytest.approx(two, rel=1e-12)
    assert got["step_time_s"] < flushed["estimate"]["step_time_s"]
