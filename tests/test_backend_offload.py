"""`plan --backend megatron` offloads what Megatron-LM offloads, and nothing else (`Constraints.offload_when`).

Megatron-LM core_v0.16.1 moves two things to the host: a fraction of the optimizer's states
(--optimizer-cpu-offload, which asks the precision-aware optimizer, which asks the distributed optimizer) and the
activations of whole layers (--cpu-offloading-num-layers, with one pipeline stage, no recomputation and no CUDA
graphs; megatron-core's TransformerConfig refuses the rest). The export writes exactly those and refuses the rest
(`tests/test_launch_megatron.py` holds it to megatron-core's configs, `benchmarks/megatron_parser_check.json` to
Megatron-LM's validate_args); the search now plans them, so a job that fits only with offload gets a plan the
export writes.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.app import app
from planner.api import plan_model
from planner.costing.execution import load_execution
from planner.errors import Infeasible, InvalidInput
from planner.hypershard import declare
from planner.hypershard.backends import export, plan_limits
from planner.search.constraints import Constraints
from planner.strategy import Strategy

#: GPT, 16 layers of width 4096 at 8K tokens on 8 A100s, 32 sequences a step, given little HBM
MODEL, CLUSTER = "gpt", "dgx-a100"
SHAPE = dict(layers=16, hidden=4096, heads=32, vocab=51200)
MEGATRON = Constraints.from_mapping(plan_limits("megatron"))


def _plan(memory_gib: float, **limits) -> dict:
    return plan_model(MODEL, cluster=CLUSTER, devices=8, global_batch=32, seq_len=8192, overrides=SHAPE,
                      memory_gib=memory_gib, mpmd=False, time_limit_s=None,
                      constraints=plan_limits("megatron") | limits)


def _export(s: dict, memory_gib: float) -> str:
    """The Megatron-LM launch script of a plan's strategy (or a runner-up's), declared as planned."""
    knobs = dict(tp=s["tp"], pp=s["pp"], dp=s["dp"], cp=s["cp"], vpp=s["vpp"], micro_batch=s["micro_batch"],
                 recompute=s["recompute"], sp=s["sp"], zero=s["zero"], offload=tuple(sorted(s["offload"].items())),
                 stage_layers=tuple(s["stage_layers"]), full_recompute_layers=s["full_recompute_layers"])
    return export(declare(MODEL, cluster=CLUSTER, devices=8, global_batch=32, seq_len=8192, overrides=SHAPE,
                          memory_gib=memory_gib, **knobs), "megatron")


@pytest.mark.parametrize("memory_gib, flag", [(12.0, "--cpu-offloading-num-layers"),
                                              (6.0, "--optimizer-cpu-offload")])
def test_a_job_that_fits_only_with_offload_gets_a_plan_megatron_launches(memory_gib, flag):
    """Under 6 GiB nothing fits without offload (the closest, TP8 with full recompute, needs 6.7 GiB); under 12 GiB
    offloading 40 % of the activations beats every layout that fits without (3.936 s against 3.946 s when this was
    written). The plan and every runner-up that fits go out to Megatron-LM as planned."""
    plan = _plan(memory_gib)
    s = plan["strategy"]
    assert s["offload"], s["summary"]
    text = _export(s, memory_gib)
    assert flag in text
    if "optimizer" in s["offload"]:  # one data-parallel rank here: the distributed optimizer shards over it alone
        assert "--use-distributed-optimizer" in text and "--use-precision-aware-optimizer" in text
    for r in plan["runners_up"]:
        if r["fits"]:
            assert _export(r["strategy"], memory_gib), r["summary"]


def test_without_offload_the_tight_job_has_no_plan():
    with pytest.raises(Infeasible, match="no strategy fits"):
        _plan(6.0, offload=())


def _s(**kw) -> Strategy:
    return Strategy(**{"tp": 1, "pp": 1, "dp": 8, **kw})


@pytest.mark.parametrize("knobs", [
    dict(zero=1, offload=(("optimizer", 0.5),)),
    dict(dp=1, tp=4, sp=True, zero=0, offload=(("optimizer", 1.0),)),  # the distributed optimizer over one rank
    dict(zero=0, offload=(("optimizer", 0.5),)),  # it would shard the states the plan keeps whole
    dict(zero=3, offload=(("optimizer", 0.5),)),  # Megatron-FSDP offloads no optimizer states
    dict(offload=(("activations", 0.4),)),
    dict(pp=2, dp=4, offload=(("activations", 0.4),)),
    dict(recompute="selective", offload=(("activations", 0.4),)),
    dict(full_recompute_layers=2, offload=(("activations", 0.4),)),
    dict(offload=(("activations", 1.0),)),  # megatron-core keeps the last layer's on the device
    dict(zero=3, offload=(("params", 0.5),)),
    dict(zero=1, offload=(("grads", 1.0),)),
])
def test_what_the_search_offloads_for_megatron_is_what_its_export_writes(knobs):
    """The search's conditions (`Constraints.offload_refused`) and the exporter's refusals agree, case by case,
    on an 8-layer Llama: the export writes exactly the strategies the search may plan."""
    from launch_plans import TINY

    devices = 4 if knobs.get("dp") == 1 else 8
    doc = declare("llama3-8b", overrides=TINY, cluster="dgx-h100", devices=devices, global_batch=16, seq_len=32,
                  **knobs)
    refused = MEGATRON.offload_refused(_s(**knobs), load_execution(None), fp8=False, layers=TINY["layers"])
    if refused:
        with pytest.raises(InvalidInput, match="cannot express"):
            export(doc, "megatron")
    else:
        assert "--optimizer-cpu-offload" in export(doc, "megatron") or "optimizer" not in dict(knobs["offload"])
    assert not Constraints().offload_refused(_s(**knobs), load_execution(None), fp8=False, layers=8)


def test_multi_token_prediction_layers_are_not_offloaded_layers():
    """Megatron-LM builds MTP layers apart from the decoder's, whose last it keeps on the device: DeepSeek-V3 with
    4 decoder layers and one MTP layer cannot offload 80 % of its activations (4 of 4 decoder layers), which the
    search, counting 5 layers, had planned and the export then refused."""
    with pytest.raises(Infeasible, match="never the last layer's"):
        plan_model("deepseek-v3", cluster="dgx-h100", devices=8, global_batch=16, seq_len=64, mpmd=False,
                   overrides=dict(layers=4, mtp_layers=1), time_limit_s=None,
                   constraints=plan_limits("megatron") | dict(tp=8, zero=0, offload=(("activations", 0.8),)))


def test_fp8_weights_offload_their_optimizer_only_under_delayed_scaling():
    s = _s(zero=1, offload=(("optimizer", 0.5),))
    ex = load_execution(None)
    for recipe, runs in (("delayed", True), ("mxfp8", False)):
        fp8 = ex.__class__(**{**{f: getattr(ex, f) for f in ex.__slots__}, "fp8_params": True, "fp8_recipe": recipe})
        assert bool(MEGATRON.offload_refused(s, fp8, fp8=True, layers=8)) is not runs
        assert not MEGATRON.offload_refused(s, fp8, fp8=False, layers=8)  # 16-bit GEMMs keep 16-bit weights


def test_an_offload_megatron_cannot_run_is_refused_in_one_sentence():
    run = CliRunner().invoke(app, ["plan", MODEL, "--cluster", CLUSTER, "--devices", "8", "--global-batch", "32",
                                   "--seq-len", "8192", "--backend", "megatron", "--offload", "params=0.5"])
    assert run.exit_code != 0 and "Traceback" not in run.output
    assert "--offload params: the launch framework offloads activations and optimizer only" in run.output
    with pytest.raises(InvalidInput, match="offload_when grads: anywhere names no memory class and condition"):
        Constraints.from_mapping({"offload_when": {"grads": "anywhere"}})
    section = MEGATRON.as_section()["offload_when"]
    assert section == {"activations": "whole_layers_one_stage", "optimizer": "distributed_optimizer"}
    assert Constraints.from_mapping({"offload_when": section}) == MEGATRON.__class__(offload_when=MEGATRON.offload_when)


_CASES = {
    "deepspeed": [dict(zero=3, offload=(("optimizer", 0.5),)), dict(zero=1, offload=(("optimizer", 0.5),)),
                  dict(zero=1, offload=(("optimizer", 1.0),)), dict(zero=0, offload=(("optimizer", 1.0),)),
                  dict(zero=3, offload=(("params", 1.0),)), dict(zero=3, offload=(("params", 0.5),)),
                  dict(zero=2, offload=(("params", 1.0),)),
                  dict(zero=2, offload=(("grads", 1.0), ("optimizer", 1.0))),
                  dict(zero=3, offload=(("grads", 1.0), ("optimizer", 0.5))),
                  dict(recompute="full", offload=(("activations", 1.0),)),
                  dict(recompute="full", offload=(("activations", 0.5),)), dict(offload=(("activations", 1.0),))],
    "torchtitan": [dict(zero=3, offload=(("grads", 1.0), ("optimizer", 1.0), ("params", 1.0))),
                   dict(zero=2, offload=(("grads", 1.0), ("optimizer", 1.0), ("params", 1.0))),
                   dict(zero=3, offload=(("optimizer", 1.0),)),
                   dict(zero=3, offload=(("grads", 1.0), ("optimizer", 1.0), ("params", 0.5))),
                   dict(zero=0, offload=(("grads", 1.0), ("optimizer", 1.0), ("params", 1.0))),
                   dict(zero=3, offload=(("activations", 1.0),))],
    "mindformers": [dict(offload=(("activations", 1.0),)), dict(offload=(("activations", 0.5),)),
                    dict(zero=1, offload=(("optimizer", 1.0),))],
}


@pytest.mark.parametrize(("backend", "knobs"), [(b, k) for b, cases in _CASES.items() for k in cases])
def test_what_the_search_offloads_for_a_launch_backend_is_what_its_export_writes(backend, knobs):
    """DeepSpeed's ZeRO-Offload, FSDP2's CPU offload (torchtitan) and MindFormers' layer swap: the search's
    conditions (`plan_limits(backend)`'s offload_when) and each exporter's refusals agree case by case, so `plan
    --backend` plans the offload its export writes (it had refused any)."""
    from launch_plans import TINY

    doc = declare("llama3-8b", overrides=TINY, cluster="dgx-h100", devices=8, global_batch=16, seq_len=32, **knobs)
    limits = Constraints.from_mapping(plan_limits(backend))
    refused = limits.offload_refused(_s(**knobs), load_execution(None), fp8=False, layers=TINY["layers"])
    if refused:
        with pytest.raises(InvalidInput, match="offload"):
            export(doc, backend)
    else:
        assert export(doc, backend)


def test_plan_for_deepspeed_takes_the_offload_deepspeed_writes():
    """The QA case: `plan --backend deepspeed --offload optimizer=1 --zero 3` had been refused as disagreeing with
    the backend's `offload: ()`."""
    run = CliRunner().invoke(app, ["plan", "llama3-8b", "--layers", "4", "--hidden", "1024", "--heads", "16",
                                   "--kv-heads", "4", "--ffn", "4096", "--vocab", "32000", "--cluster", "dgx-h100",
                                   "--devices", "16", "--global-batch", "64", "--seq-len", "4096", "--backend",
                                   "deepspeed", "--offload", "optimizer=1", "--zero", "3", "--json"])
    assert run.exit_code == 0, run.output
    assert '"optimizer": 1.0' in run.output
