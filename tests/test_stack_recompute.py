"""What a stack's framework can recompute bounds what `plan` picks (`Execution.recompute_policies` and
`Execution.full_layers_beside`), so that a plan made for a stack goes out to that stack's launcher.

Megatron-LM takes one --recompute-granularity: full recompute of a chunk's first k layers (method block) leaves the
rest unrecomputed, never selective; torchtitan applies one checkpointing policy to every block; DeepSpeed checkpoints
what the model calls, so neither selective recompute nor a count of layers. The launchers refuse what their
framework cannot run (`tests/test_launch_*.py` hold them to the real frameworks); these tests hold each stack's
recompute settings to its launcher's, and the plan to its stack's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from planner.api import estimate_model, plan_model
from planner.costing.execution import load_execution, parse_execution
from planner.costing.stack_choices import RECOMPUTE_POLICIES
from planner.errors import InvalidInput
from planner.hypershard import Request, declare, declare_plan, read_document, write_document
from planner.hypershard.backends import export, plan_limits
from planner.hypershard.validate import validate_document
from planner.search.constraints import Constraints
from planner.strategy import Strategy

TINY = dict(layers=8, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
#: a stack preset -> the launch backend of its framework
LAUNCHER = {"megatron-core": "megatron", "megatron-core-2024": "megatron", "megatron-2021": "megatron",
            "mindspeed": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}


def _settings():
    """(recompute, fully recomputed layers a chunk): every policy alone, and two layers beside none or selective."""
    return [(rc, 0) for rc in RECOMPUTE_POLICIES] + [("none", 2), ("selective", 2)]


@pytest.mark.parametrize("stack", sorted(LAUNCHER))
def test_each_stack_recomputes_what_its_launcher_writes(stack):
    ex = load_execution(stack)
    for rc, k in _settings():
        runs = rc in ex.recompute_policies if k == 0 else ex.full_layers_beside == rc
        doc = declare("llama3-8b", overrides=TINY, cluster="dgx-h100", devices=8, global_batch=16, seq_len=32,
                      dp=8, zero=1, recompute=rc, full_recompute_layers=k, stack=stack)
        if runs:
            assert export(doc, LAUNCHER[stack])
        else:
            with pytest.raises(InvalidInput, match="recompute") as err:
                export(doc, LAUNCHER[stack])
            assert "\n" not in str(err.value)


_TIGHT = dict(model="gpt", cluster="dgx-a100", overrides=dict(layers=16, hidden=4096, heads=32, vocab=51200))


def _tight(stack: str | None, **constraints) -> dict:
    """A plan that fits only with every layer or some layers recomputed: 16 layers at 8K tokens, 4 sequences a
    micro-batch, on 8 A100s given 12 GiB (15.4 GiB at its peak without recompute)."""
    return plan_model(_TIGHT["model"], cluster=_TIGHT["cluster"], devices=8, global_batch=32, seq_len=8192,
                      memory_gib=12.0, offload=False, mpmd=False, time_limit_s=None, stack=stack,
                      overrides=_TIGHT["overrides"], constraints=dict(tp=8, micro_batch=4) | constraints)


@pytest.mark.parametrize("stack", [None, "torchtitan", "deepspeed"])
def test_a_plan_that_needs_recompute_goes_out_to_its_stacks_launcher(stack):
    plan = _tight(stack)
    s = plan["strategy"]
    ex = load_execution(stack)
    assert s["recompute"] in ex.recompute_policies, s["summary"]
    assert not s["full_recompute_layers"] or s["recompute"] == ex.full_layers_beside, s["summary"]
    assert s["recompute"] != "none" or s["full_recompute_layers"], s["summary"]  # it had to recompute something
    doc = declare_plan(plan, Request(model=_TIGHT["model"], cluster=_TIGHT["cluster"], overrides=_TIGHT["overrides"],
                                     memory_gib=12.0))
    assert export(doc, LAUNCHER[ex.name])


def test_a_recompute_the_stack_cannot_run_is_refused_in_one_sentence():
    with pytest.raises(InvalidInput, match="the deepspeed stack cannot run selective recompute") as err:
        _tight("deepspeed", recompute="selective")
    assert "--recompute none or full" in str(err.value) and "\n" not in str(err.value)
    run = subprocess.run([sys.executable, "-m", "cli.app", "plan", "llama3-8b", "--cluster", "dgx-h100",
                          "--devices", "8", "--global-batch", "16", "--seq-len", "1024", "--stack", "deepspeed",
                          "--recompute", "selective"], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "cannot run selective recompute" in run.stderr


@pytest.mark.parametrize("body, words", [
    ('recompute_policies = ["none", "some"]', "expected a list of none, selective, full"),
    ('recompute_policies = []', "expected a list of none, selective, full"),
    ('full_layers_beside = "full"', "expected one of none, selective, off"),
    ('recompute_policies = ["none", "full"]\nfull_layers_beside = "selective"', "not among its recompute_policies"),
])
def test_a_stack_files_recompute_settings_are_checked(body, words):
    with pytest.raises(InvalidInput, match=words) as err:
        parse_execution(f'[stack]\nbase = "megatron-core"\n[recompute]\n{body}\n', source="my.toml",
                        default_name="my")
    assert "\n" not in str(err.value)


def test_a_stack_files_recompute_policies_read_in_one_order():
    ex = parse_execution('[stack]\nbase = "megatron-core"\n[recompute]\nrecompute_policies = ["full", "none"]\n'
                         'full_layers_beside = "none"\n', source="my.toml", default_name="my")
    assert ex.recompute_policies == ("none", "full") and ex.full_layers_beside == "none"


@pytest.mark.parametrize("stack, strategy, words", [
    (None, dict(recompute="selective", full_recompute_layers=2),
     "megatron-core stack recomputes some layers fully only where it recomputes nothing of the others"),
    (None, dict(recompute="none", full_recompute_layers=2), None),
    ("torchtitan", dict(recompute="none", full_recompute_layers=2, sp=True),
     "torchtitan stack cannot recompute only some layers fully"),
    ("deepspeed", dict(recompute="selective"), "deepspeed stack runs none or full recompute, not selective"),
    ("deepspeed", dict(recompute="full", sp=True), "deepspeed stack runs tensor parallelism without sequence"),
    ("deepspeed", dict(recompute="full", sp=False), None),
])
def test_an_estimate_says_when_its_stack_cannot_launch_the_strategy(stack, strategy, words):
    est = estimate_model("llama3-8b", overrides=TINY, cluster="dgx-h100", devices=8, global_batch=16, seq_len=32,
                         tp=2, stack=stack, **strategy)
    said = [w for w in est["warnings"] if "cannot launch" in w]
    assert (said == []) if words is None else (len(said) == 1 and words in said[0]), said


@pytest.mark.parametrize("backend", ["megatron", "torchtitan", "deepspeed", "mindformers"])
def test_a_plan_searched_for_a_backend_recomputes_as_its_framework_does(backend, tmp_path):
    """`plan --backend` adds the launch framework's own limits to the stack's (`PLAN_LIMITS`): the default stack's
    plan of a job that must recompute goes out to each launcher, whose framework may recompute otherwise, and
    its declaration, which keeps those limits among its constraints, validates."""
    plan = _tight(None, **plan_limits(backend))
    s = plan["strategy"]
    limits = Constraints.from_mapping(plan_limits(backend))
    ex = load_execution(None)
    assert s["recompute"] in limits.recompute_runs(ex), s["summary"]
    assert not s["full_recompute_layers"] or s["recompute"] == limits.beside_full_layers(ex), s["summary"]
    assert not s["sp"] or limits.sequence_parallel_runs(ex), s["summary"]
    doc = declare_plan(plan, Request(model=_TIGHT["model"], cluster=_TIGHT["cluster"], overrides=_TIGHT["overrides"],
                                     memory_gib=12.0))
    assert export(doc, backend)
    write_document(doc, str(tmp_path / "plan.yaml"))
    assert validate_document(read_document(str(tmp_path / "plan.yaml"))).ok


def test_a_launch_frameworks_limits_are_checked_and_written_back():
    c = Constraints.from_mapping({"recompute_policies": ["full", "none"], "full_layers_beside": "off",
                                  "sequence_parallel": False})
    assert c.recompute_policies == ("full", "none") and c.as_section()["recompute_policies"] == ["full", "none"]
    assert c.unmet(experts=False, inout=False) == ""  # limits of a framework, not knobs the user fixed
    wide = Strategy(tp=8, pp=2, dp=1, stage_tp=(4, 8), sp=True)
    assert Constraints().allows(wide, experts=False, inout=False)
    assert not Constraints(stage_widths=False).allows(wide, experts=False, inout=False)
    assert all(plan_limits(b)["stage_widths"] is False for b in ("megatron", "torchtitan", "mindformers", "deepspeed"))
    ds = Constraints.from_mapping(plan_limits("deepspeed"))  # AutoEP: experts over data-parallel ranks only
    assert not ds.allows_mesh(2, 1, 1, 4, 2, 1, experts=True, inout=False)
    assert ds.allows_mesh(1, 1, 1, 8, 8, 1, experts=True, inout=False) and ds.allows_mesh(2, 1, 1, 4, 1, 1,
                                                                                         experts=True, inout=False)
    for bad, words in ((dict(recompute_policies=["some"]), "recompute_policies must be some of"),
                       (dict(full_layers_beside="all"), "full_layers_beside must be one of")):
        with pytest.raises(InvalidInput, match=words):
            Constraints.from_mapping(bad)


def test_a_plan_file_of_one_launcher_replans_for_another(tmp_path):
    """A plan file keeps its backend's launch limits among its constraints; `plan --constraints FILE --backend X`
    takes X's instead of refusing the two as a disagreement, and keeps the knobs the user fixed."""
    from typer.testing import CliRunner

    from cli.app import app

    limits = Constraints.from_mapping(plan_limits("deepspeed") | dict(tp=8, micro_batch=4)).as_section()
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump({"constraints": limits}))
    args = ["plan", "gpt", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "32", "--seq-len", "8192",
            "--memory-gib", "12", "--no-offload", "--set", "layers=16", "--set", "hidden=4096", "--set", "heads=32",
            "--set", "vocab=51200", "--constraints", str(tmp_path / "ds.yaml"), "--backend", "megatron", "--json"]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    s = json.loads(run.output)["strategy"]
    assert (s["tp"], s["micro_batch"], s["sp"]) == (8, 4, True)  # the user's knobs kept, megatron's SP taken


def test_torchtitans_one_dimensional_ddp_keeps_unsharded_data_parallelism_alone():
    """torchtitan's DDP is one-dimensional: `plan --backend torchtitan` shards data parallelism (ZeRO >= 1) beside
    tensor, pipeline or context parallelism, as its export requires."""
    tt = Constraints.from_mapping(plan_limits("torchtitan"))
    assert not tt.zero_allowed(0, 4, 2) and tt.zero_allowed(1, 4, 2) and tt.zero_allowed(0, 8, 1)
    plan = plan_model("llama3-8b", cluster="dgx-h100", devices=8, global_batch=16, seq_len=64, overrides=TINY,
                      offload=False, mpmd=False, time_limit_s=None, stack="torchtitan",
                      constraints=plan_limits("torchtitan") | dict(tp=2, zero=0))
    assert plan["strategy"]["dp"] == 1 or plan["strategy"]["zero"] > 0, plan["strategy"]["summary"]


def test_a_launcher_runs_selective_recompute_only_as_its_framework_defines_it():
    """Megatron-LM's selective recompute is its --recompute-modules and torchtitan's its op policy: `plan --backend`
    takes selective recompute only where the stack means the same (the megatron export refuses torchtitan's)."""
    tt, mc = load_execution("torchtitan"), load_execution("megatron-core")
    meg, titan = (Constraints.from_mapping(plan_limits(b)) for b in ("megatron", "torchtitan"))
    assert "selective" not in meg.recompute_runs(tt) and "selective" in meg.recompute_runs(mc)
    assert "selective" not in titan.recompute_runs(mc) and "selective" in titan.recompute_runs(tt)
    with pytest.raises(InvalidInput, match="the torchtitan stack with this backend cannot run selective recompute"):
        Constraints.from_mapping(plan_limits("megatron") | {"recompute": "selective"}).check_stack(tt, True)
    with pytest.raises(InvalidInput, match="selective must be one of"):
        Constraints(selective="ops")


def test_a_plan_says_which_launch_configs_write_it():
    """`plan` names the training launch backends that write its plan and what the others cannot express, so a
    plan made without --backend says where it launches (here Megatron-LM's block recompute, which torchtitan and
    DeepSpeed cannot say)."""
    from typer.testing import CliRunner

    from cli.app import app

    args = ["plan", "gpt", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "32", "--seq-len", "8192",
            "--memory-gib", "12", "--no-offload", "--set", "layers=16", "--set", "hidden=4096", "--set", "heads=32",
            "--set", "vocab=51200", "--tp", "8", "--micro-batch", "4"]
    configs = json.loads(CliRunner().invoke(app, args + ["--json"]).output)["launch_configs"]
    assert configs["megatron"] == "" and configs["mindformers"] == ""
    assert configs["torchtitan"].startswith("full recompute of the first") and "\n" not in configs["torchtitan"]
    text = " ".join(CliRunner().invoke(app, args).output.split())
    assert "launch configs: megatron, mindformers write this plan; torchtitan cannot express its full recompute" \
        in text, text[-800:]
