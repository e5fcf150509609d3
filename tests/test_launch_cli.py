"""`hyperplan export --backend NAME` for launch configs: printed without -o (--json: the config as data), written
atomically with -o (never over an existing file without --force, never over an input), errors in one line; the
issue's acceptance: a llama3-70b plan exported to megatron prints a command line Megatron-LM's flags accept with
the plan's degrees."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from cli.app import app
from launch_plans import parse_pinned
from planner.hypershard.backends import LAUNCH

runner = CliRunner()
TRAIN = ["llama3-8b", "--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads", "4", "--vocab", "512",
         "--ffn", "512", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "32", "--seq-len", "256",
         "--no-offload", "--tp", "2", "--zero", "1", "--recompute", "full"]
SERVE = ["mixtral-8x7b", "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "4", "--vocab", "512",
         "--ffn", "256", "--experts", "4", "--top-k", "2", "--mode", "infer", "--cluster", "dgx-h100", "--devices", "8",
         "--prompt-len", "64", "--gen-len", "16", "--batch", "2", "--no-offload"]


def cli(*args: str):
    return runner.invoke(app, list(args), terminal_width=300)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launch")
    for name, args in (("train", TRAIN), ("serve", SERVE)):
        r = cli("plan", *args, "-o", str(folder / f"{name}.yaml"))
        assert r.exit_code == 0, r.output
    return folder


def test_export_help_lists_the_launch_backends():
    r = cli("export", "--help")
    assert r.exit_code == 0
    for name in LAUNCH:
        assert name in r.output


@pytest.mark.parametrize("backend, words", [("megatron", "--tensor-model-parallel-size 2"),
                                            ("torchtitan", "tensor_parallel_degree = 2"),
                                            ("mindformers", "model_parallel: 2")])
def test_a_training_launch_config_is_printed_and_written(plans, tmp_path, backend, words):
    r = cli("export", str(plans / "train.yaml"), "--backend", backend)
    assert r.exit_code == 0, r.output
    assert words in r.output and r.output.startswith("#")
    j = cli("export", str(plans / "train.yaml"), "--backend", backend, "--json")
    assert j.exit_code == 0 and set(json.loads(j.output)) == {"backend", "declaration", "config", "notes"}
    suffix = {"megatron": ".sh", "torchtitan": ".toml", "mindformers": ".yaml"}[backend]
    out = tmp_path / f"launch{suffix}"
    w = cli("export", str(plans / "train.yaml"), "--backend", backend, "-o", str(out))
    assert w.exit_code == 0 and out.read_text() == r.output
    again = cli("export", str(plans / "train.yaml"), "--backend", backend, "-o", str(out))
    assert again.exit_code == 2 and "already exists; pass --force" in again.output
    assert cli("export", str(plans / "train.yaml"), "--backend", backend, "-o", str(out), "--force").exit_code == 0


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_a_serving_plan_prints_a_command_per_server(plans, backend):
    r = cli("export", str(plans / "serve.yaml"), "--backend", backend)
    assert r.exit_code == 0, r.output
    program = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server"}[backend]
    j = json.loads(cli("export", str(plans / "serve.yaml"), "--backend", backend, "--json").output)
    assert r.output.count(program) == len(j["config"]["commands"]) >= 1
    # planned with --layers 2 and the like: the command serves the checkpoint as it is, and says so (QA)
    assert any("its architecture overridden" in n and "layers 2" in n for n in j["notes"])
    assert "# Note: this plan is of the model with" in r.output


def test_launch_errors_are_one_line(plans, tmp_path):
    cases = [
        (["export", str(plans / "train.yaml"), "--backend", "megatron", "-o", str(tmp_path / "x.py")], "writes a .sh"),
        (["export", str(plans / "train.yaml"), "--backend", "mindformers", "-o", str(plans / "train.yaml")],
         "is an input of this command"),
        (["export", str(plans / "train.yaml"), "--backend", "torch"], "the torch backend writes a file: give -o FILE"),
        (["export", str(plans / "train.yaml"), "--backend", "caffe"], "unknown backend"),
        (["export", str(plans / "train.yaml"), "--backend", "vllm"], "is of a training plan"),
        (["export", str(plans / "serve.yaml"), "--backend", "deepspeed"], "is of a serving plan"),
    ]
    for args, message in cases:
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert message in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1


def test_a_declaration_validate_refuses_is_not_exported(plans, tmp_path):
    """A hand edit that validate refuses (a tp axis of 3 on 8 devices) had gone out as a Megatron command line,
    exit 0, with --tensor-model-parallel-size 3 (QA of 2026-12-07): export checks what validate checks first."""
    import yaml

    doc = yaml.safe_load((plans / "train.yaml").read_text())
    axes = next(m for m in doc["meshes"] if m["name"] == "world")["axes"]
    next(a for a in axes if a["name"] == "tp")["size"] = 3
    bad = tmp_path / "edited.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert cli("validate", str(bad)).exit_code != 0
    for args in (["--backend", "megatron"], ["--backend", "torch", "-o", str(tmp_path / "p.py")]):
        r = cli("export", str(bad), *args)
        assert r.exit_code == 2, r.output
        assert "does not validate (" in r.output and "3" in r.output and "then export" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "p.py").exists()


@pytest.mark.slow
def test_a_llama3_70b_plan_exports_to_a_megatron_command_line_with_its_degrees(tmp_path):
    """The issue's acceptance: plan llama3-70b -o p.yaml, then export p.yaml --backend megatron prints a command line
    whose every flag and value Megatron-LM's parser (core_v0.16.1, pinned) takes, with the plan's degrees."""
    from test_launch_megatron import PINNED

    p = cli("plan", "llama3-70b", "--cluster", "cloudmatrix384", "--devices", "64", "--global-batch", "256",
            "--seq-len", "4096", "--json", "-o", str(tmp_path / "p.yaml"))
    assert p.exit_code == 0, p.output
    s = json.loads(p.output)["strategy"]
    r = cli("export", str(tmp_path / "p.yaml"), "--backend", "megatron")
    assert r.exit_code == 0, r.output
    line = r.output[r.output.index("torchrun"):].replace("\\\n", " ")
    words = shlex.split(line)
    ns, _ = parse_pinned(words[words.index("pretrain_gpt.py") + 3:], PINNED)
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (s["tp"], s["pp"])
    assert (getattr(ns, "context_parallel_size", None) or 1) == s["cp"]
    assert 64 // (s["tp"] * s["pp"] * s["cp"]) == s["dp"]
    assert ns.global_batch_size == 256 and ns.seq_length == 4096 and ns.micro_batch_size == s["micro_batch"]
