"""The mindformers export: every key is one MindFormers' config template checks (pinned from its source in
tests/data/mindformers_config.json), unequal chunks come back from `offset` by MindFormers' own rule, the batch
by its own formula, and MindSpore 2.10's set_auto_parallel_context takes the `parallel` section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch_plans import REFUSES, WRITES, plan
from planner.errors import InvalidInput
from planner.hypershard import strategy_of
from planner.hypershard.backends import export, launch_config

PINNED = json.loads((Path(__file__).parent / "data" / "mindformers_config.json").read_text())
MAPPED = {name for name, _ in PINNED["model_config_mapping"]}


def chunk_sizes(doc: dict) -> list[int]:
    return [n for _, n in sorted((c["chunk"], len(c["layers"])) for st in doc["programs"][0]["stages"]
                                 for c in st["chunks"])]


@pytest.mark.parametrize("name", WRITES["mindformers"])
def test_every_key_is_mindformers_and_reads_back_as_the_plan(name):
    doc = plan(name)
    cfg = yaml.safe_load(export(doc, "mindformers"))
    assert cfg == launch_config(doc, "mindformers")["config"]
    for section in ("parallel_config", "recompute_config", "swap_config", "moe_config", "runner_config", "parallel"):
        for key in cfg.get(section, {}):
            assert key in PINNED["sections"][section]["keys"] or not PINNED["sections"][section]["refuses_unknown_keys"]
    assert set(cfg["model"]["model_config"]) <= MAPPED
    par = cfg["parallel"]
    assert set(par.get("parallel_optimizer_config", {})) <= set(PINNED["mindspore"]["_ParallelOptimizerConfig"])
    if "pipeline_config" in par:
        assert set(par["pipeline_config"]) == set(PINNED["mindspore"]["_PipelineConfig"])
        assert par["pipeline_config"]["pipeline_scheduler"] in PINNED["mindspore"]["_PipelineScheduler"]
    s, pc = strategy_of(doc), cfg["parallel_config"]
    assert (pc["data_parallel"], pc["model_parallel"], pc["context_parallel"], pc["pipeline_stage"]) == (
        s.dp, s.tp, s.cp, s.pp)
    assert pc.get("expert_parallel", 1) == s.ep and pc["use_seq_parallel"] == s.sp
    # MindFormers' LayerSetting: chunk (i, j) holds num_layers // (pp x vpp) + offset[i][j] layers, and the offsets
    # add up to the remainder (parallel_core/training_graph/transformer/utils.py)
    layers, mc = sum(chunk_sizes(doc)), cfg["model"]["model_config"]
    vpp = mc.get("pp_interleave_num", 1)
    offset = mc.get("offset", 0)
    rows = offset if isinstance(offset, list) and isinstance(offset[0], list) else [offset] * vpp
    rows = [r if isinstance(r, list) else [r] * s.pp for r in rows]
    assert sum(map(sum, rows)) == layers % (s.pp * vpp)
    assert [layers // (s.pp * vpp) + o for r in rows for o in r] == chunk_sizes(doc)
    # MindFormers' global batch (trainer/base_trainer.py): batch_size x dp x micro_batch_num with a pipeline,
    # batch_size x dp x gradient_accumulation_steps without (micro_batch_interleave_num 1)
    run = cfg["runner_config"]
    rounds = pc["micro_batch_num"] if s.pp > 1 else run["gradient_accumulation_steps"]
    assert run["batch_size"] * pc["data_parallel"] * rounds * cfg["micro_batch_interleave_num"] == \
        doc["workload"]["global_batch"]
    assert par["enable_parallel_optimizer"] == (s.zero > 0)


@pytest.mark.parametrize("name, words", list(REFUSES["mindformers"].items()))
def test_what_mindformers_cannot_run_is_refused_in_one_sentence(name, words):
    with pytest.raises(InvalidInput, match="the mindformers backend cannot express this plan's") as err:
        export(plan(name), "mindformers")
    assert words in str(err.value) and "\n" not in str(err.value)


_CONTEXT = r'''
import json, sys
import mindspore as ms
for case in json.loads(sys.stdin.read()):
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", pipeline_stages=case["stages"], **case["parallel"])
    print(json.dumps([ms.get_auto_parallel_context("pipeline_stages"),
                      ms.get_auto_parallel_context("enable_parallel_optimizer")]))
'''


@pytest.mark.slow
@pytest.mark.launch
def test_mindspores_parallel_context_takes_the_parallel_section():
    """The `parallel` section is what MindFormers hands to MindSpore's set_auto_parallel_context (with
    pipeline_stages from parallel_config): MindSpore 2.10 checks its optimizer level and pipeline config."""
    from test_mindspore_export import _env

    cases = []
    for name in WRITES["mindformers"]:
        cfg = launch_config(plan(name), "mindformers")["config"]
        cases.append({"stages": cfg["parallel_config"]["pipeline_stage"], "parallel": cfg["parallel"]})
    run = subprocess.run([sys.executable, "-c", _CONTEXT], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=300, env=_env())
    if "No module named 'mindspore'" in run.stderr:
        pytest.skip("mindspore is not installed")
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
    assert got == [[c["stages"], c["parallel"]["enable_parallel_optimizer"]] for c in cases]
