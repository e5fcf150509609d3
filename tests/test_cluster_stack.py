"""A hardware file may name the training stack its jobs run when `--stack` names none: the Ascend presets name
MindSpeed's (Megatron-Core's CUDA pieces, Transformer Engine, DeepEP and CUDA graphs, do not run on Ascend, and the
910B's efficiency is fitted on MindSpeed-LLM runs); the NVIDIA presets name none and take today's Megatron-Core."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster, preset_names
from planner.api import estimate_model
from planner.hypershard import declare

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=128)
PRESETS = Path(__file__).resolve().parents[1] / "cost_models" / "presets"


def test_the_ascend_presets_name_mindspeed_and_the_others_none():
    named = {name: load_cluster(name).stack for name in preset_names()}
    assert {n for n, s in named.items() if s} == {"ascend-910b", "cloudmatrix384", "cloudmatrix384-die"}
    assert set(named[n] for n in ("ascend-910b", "cloudmatrix384", "cloudmatrix384-die")) == {"mindspeed"}


@pytest.mark.parametrize("cluster, stack, runs", [
    ("cloudmatrix384", None, "mindspeed"),
    ("cloudmatrix384", "megatron-core", "megatron-core"),  # a named stack wins over the hardware file's
    ("dgx-h100", None, "megatron-core"),
])
def test_an_estimate_runs_the_named_stack_else_the_clusters_else_the_default(cluster, stack, runs):
    out = estimate_model("llama3-8b", cluster=cluster, devices=8, global_batch=8, seq_len=64, overrides=TINY,
                         stack=stack)
    assert out["workload"]["stack"] == runs


def test_a_declaration_on_ascend_is_mindspeeds():
    doc = declare("llama3-8b", cluster="cloudmatrix384", devices=8, global_batch=8, seq_len=64, overrides=TINY, dp=8)
    assert doc["workload"]["stack"] == "mindspeed"


def test_a_hardware_file_naming_no_stack_is_refused_in_one_sentence(tmp_path):
    text = (PRESETS / "ascend-910b.toml").read_text(encoding="utf-8").replace('stack = "mindspeed"', 'stack = "mindspede"')
    path = tmp_path / "my-910b.toml"
    path.write_text(text, encoding="utf-8")
    r = CliRunner().invoke(app, ["estimate", "llama3-8b", "--cluster", str(path), "--devices", "8", "--global-batch",
                                 "8", "--seq-len", "64"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "hardware file names stack = 'mindspede'" in r.output and "mindspeed" in r.output
    assert len([line for line in r.output.splitlines() if line.startswith("error:")]) == 1
