"""Architecture overrides from the CLI: the named flags, --set KEY=VALUE for any config field, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import models_zoo
from cli.app import app
from cli.arch_options import FLAGS, collect, parse_set
from planner.errors import InvalidInput

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def inspect(*args: str) -> dict:
    r = runner.invoke(app, ["inspect", *args, "--seq-len", "128", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def error(*args: str) -> str:
    r = runner.invoke(app, [*args], terminal_width=400)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    return r.output


def test_parse_set_reads_json_values_and_keeps_words():
    assert parse_set(["rope_theta=1e6", "mlp=relu2", "qk-norm=true", "deepstack=[8, 16]", "layers=4"]) == {
        "rope_theta": 1e6, "mlp": "relu2", "qk_norm": True, "deepstack": (8, 16), "layers": 4}
    for bad, words in ((["layers"], "is not KEY=VALUE"), (["=3"], "is not KEY=VALUE"),
                       (["layers=2", "layers=3"], "given twice")):
        with pytest.raises(InvalidInput, match=words):
            parse_set(bad)


def test_flags_and_set_merge_by_config_field():
    assert collect({"kv_lora": 256, "q_lora": 0, "layers": None}, ["v_head_dim=64"]) == {
        "kv_lora_rank": 256, "q_lora_rank": 0, "v_head_dim": 64}
    with pytest.raises(InvalidInput, match="set by --kv-lora 256 and by --set kv_lora_rank=128"):
        collect({"kv_lora": 256}, ["kv_lora_rank=128"])
    assert [f for _, f, _, _ in FLAGS] == ["--layers", "--hidden", "--heads", "--kv-heads", "--head-dim", "--vocab",
                                          "--ffn", "--experts", "--top-k", "--expert-ffn", "--shared-experts",
                                          "--kv-lora", "--q-lora"]


@pytest.mark.parametrize(
    ("model", "flags", "settings"),
    [
        ("deepseek-v3", ["--layers", "4", "--kv-lora", "256", "--q-lora", "0", "--expert-ffn", "1024",
                         "--shared-experts", "2", "--ffn", "9216", "--experts", "16"],
         dict(layers=4, kv_lora_rank=256, q_lora_rank=0, expert_ffn=1024, shared_experts=2, ffn=9216, experts=16)),
        ("llama3-8b", ["--layers", "2", "--head-dim", "64", "--ffn", "8192", "--set", "qk_norm=true",
                       "--set", "rope_theta=1e6"],
         dict(layers=2, head_dim=64, ffn=8192, qk_norm=True, rope_theta=1e6)),
        ("llava-style-7b", ["--layers", "2", "--set", "vision_layers=2", "--set", "vision_image_size=112",
                            "--set", "projector_norm=true"],
         dict(layers=2, vision_layers=2, vision_image_size=112, projector_norm=True)),
    ],
)
def test_every_flag_and_set_reach_the_config(model, flags, settings):
    got = inspect(model, *flags)["params"]["total"]
    assert got == models_zoo.param_counts(model, **settings, seq_len=128)[0]
    assert got != models_zoo.param_counts(model, layers=settings["layers"])[0]


def test_set_reaches_a_config_json():
    folder = str(Path(__file__).parent / "data" / "hf_configs" / "gemma-2-9b")
    assert inspect(folder, "--layers", "2", "--set", "full_every=0")["params"]["total"] == \
        models_zoo.hf_param_counts(folder, layers=2, full_every=0)[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["inspect", "llama3-8b", "--set", "expert_width=4"],  # the model named once (QA of 2026-12-07: twice)
         "error: zoo model 'llama3-8b' has no setting 'expert_width'; valid settings: attn_scale, batch, dense_ffn,"),
        (["inspect", "llama3-8b", "--experts", "8"],
         "top_k=0 must be between 1 and experts=8; set top_k too (--top-k)."),
        (["inspect", "deepseek-v3", "--head-dim", "64"], "has no setting 'head_dim'; valid settings: batch, dense_"),
        (["inspect", "llama3-8b", "--set", "qk_norm=yes"], "qk_norm must be true or false, got 'yes'."),
        (["inspect", "llama3-8b", "--set", "rope_theta=fast"], "rope_theta must be a number, got 'fast'."),
        (["inspect", "llama3-8b", "--layers", "3", "--set", "layers=4"], "layers is set by --layers 3 and by --set"),
        (["estimate", "llama3-8b", "--set", "nope", "--cluster", "dgx-h100", "--global-batch", "8", "--seq-len", "64"],
         "--set 'nope' is not KEY=VALUE"),
        (["inspect", str(FIXTURES / "gpt2.onnx"), "--set", "layers=2"], "only zoo models and config.json files"),
    ],
)
def test_bad_overrides_are_one_line(args, words):
    assert words in error(*args)


@pytest.mark.parametrize("command", ["inspect", "estimate", "plan", "whatif", "zoo export"])
def test_every_model_command_lists_the_architecture_options(command):
    r = runner.invoke(app, [*command.split(), "--help"], terminal_width=200)
    assert r.exit_code == 0
    for _, flag, _, _ in FLAGS:
        assert flag in r.output
    assert "--set" in r.output and "KEY=VALUE" in r.output
