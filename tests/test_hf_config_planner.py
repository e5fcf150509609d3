"""A Hugging Face config.json as MODEL in the planner and the CLI: the preset's graph, plans, declarations, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import models_zoo
from cli.app import app
from planner.api import load_graph
from planner.errors import InvalidInput
from planner.inference.serve import profile_seq
from planner.model_source import display_name, kind_of
from planner.whatif import identity

runner = CliRunner()
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
LLAMA3 = CONFIGS / "Meta-Llama-3-8B"
#: A small Qwen3-style config (so plans take a second), written as a published file would be.
TINY = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 512, "intermediate_size": 1536,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
        "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
WHERE = ["--cluster", "dgx-h100", "--devices", "8", "--global-batch", "32", "--seq-len", "512"]


@pytest.fixture()
def tiny(tmp_path) -> Path:
    folder = tmp_path / "tiny-qwen3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def _rows(graph) -> list[tuple]:
    return [(n.name, n.op_type, n.scope, n.flops, n.bytes_read, n.bytes_written) for n in graph.nodes]


def test_config_and_preset_import_to_the_same_graph():
    ours = load_graph(LLAMA3, batch=1, seq_len=512, overrides={"layers": 2})
    zoo = load_graph("llama3-8b", batch=1, seq_len=512, overrides={"layers": 2})
    assert ours.param_count == zoo.param_count and len(ours.nodes) == len(zoo.nodes)
    assert _rows(ours) == _rows(zoo) and ours.flops == zoo.flops
    assert [ours.tensors[p] for p in ours.params] == [zoo.tensors[p] for p in zoo.params]
    assert load_graph(LLAMA3 / "config.json", batch=1, seq_len=512, overrides={"layers": 2}).param_count == \
        ours.param_count


def test_a_vision_language_config_is_two_sub_models():
    """Qwen2-VL: the tower and its merger under model.visual, the Qwen2 decoder under model.language_model: the
    sub-models a plan may give device groups of their own."""
    from planner.graph.blocks import discover_blocks

    graph = load_graph(CONFIGS / "Qwen2-VL-7B-Instruct", batch=1, seq_len=1024,
                       overrides={"layers": 2, "vision_layers": 2})
    names = [s.name for s in discover_blocks(graph).submodels]
    assert names == ["visual", "language_model"]
    assert "model.visual.merger.ln_q.weight" in graph.params and "model.visual.blocks.1.attn.qkv.bias" in graph.params


def test_kinds_and_names_of_model_arguments(tiny):
    assert kind_of(tiny) == kind_of(tiny / "config.json") == "hf_config"
    assert kind_of("llama3-8b") == "zoo" and kind_of("no-such") == "unknown"
    assert display_name(tiny) == display_name(tiny / "config.json") == "tiny-qwen3"
    assert profile_seq(tiny) is None  # built at the serving profile's own length, as a zoo model
    model_id, _ = identity(str(tiny), "dgx-h100")
    assert set(model_id) == {"hf_config_sha256"} and identity(str(tiny / "config.json"), "dgx-h100")[0] == model_id


@pytest.mark.parametrize(
    ("edit", "kwargs", "words"),
    [
        ({"model_type": "t5"}, {}, "has model_type 't5'; the zoo builds deepseek_v3, gemma2"),
        ({}, {"dims": {"seq": 8}}, "--dim applies to ONNX files, and '"),
        ({}, {"overrides": {"experts_count": 4}}, "has no setting 'experts_count'; valid settings:"),
        ({}, {"overrides": {"heads": 7}}, "': heads=7 is not a multiple of kv_heads=4"),
    ],
)
def test_bad_configs_and_options_are_one_sentence(tiny, edit, kwargs, words):
    (tiny / "config.json").write_text(json.dumps(TINY | edit))
    with pytest.raises(InvalidInput) as err:
        load_graph(tiny, batch=1, seq_len=128, **kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_config_json_is_named(tmp_path):
    with pytest.raises(InvalidInput, match="holds no config.json"):
        load_graph(tmp_path)
    with pytest.raises(InvalidInput, match="does not exist"):
        load_graph(tmp_path / "missing" / "config.json")


def test_plan_estimate_and_inspect_take_a_config(tiny, tmp_path):
    plan = runner.invoke(app, ["plan", str(tiny), *WHERE, "--json", "-o", str(tmp_path / "plan.yaml")])
    assert plan.exit_code == 0, plan.output
    result = json.loads(plan.output)
    assert result["model"]["name"] == "tiny-qwen3" and result["estimate"]["step_time_s"] > 0
    doc = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert doc["model"]["source"] == "hf_config" and doc["model"]["path"] == str(tiny)
    valid = runner.invoke(app, ["validate", str(tmp_path / "plan.yaml"), "--json"])
    assert valid.exit_code == 0 and json.loads(valid.output)["ok"], valid.output
    estimate = runner.invoke(app, ["estimate", str(tiny / "config.json"), "--plan", str(tmp_path / "plan.yaml"),
                                   "--json"])
    assert estimate.exit_code == 0, estimate.output
    assert json.loads(estimate.output)["step_time_s"] == result["estimate"]["step_time_s"]
    inspect = runner.invoke(app, ["inspect", str(tiny), "--layers", "2", "--seq-len", "128", "--json"])
    assert inspect.exit_code == 0
    assert json.loads(inspect.output)["params"]["total"] == models_zoo.hf_param_counts(tiny, layers=2)[0]
    (tiny / "config.json").write_text(json.dumps(TINY | {"intermediate_size": 2048}))
    changed = runner.invoke(app, ["validate", str(tmp_path / "plan.yaml")], terminal_width=200)
    assert changed.exit_code == 2 and "changed since the plan was made" in changed.output


def test_cli_errors_on_configs_are_one_line(tiny):
    (tiny / "config.json").write_text(json.dumps(TINY | {"model_type": "bert"}))
    r = runner.invoke(app, ["plan", str(tiny), *WHERE])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.count("\n") == 1 and "export any other model to ONNX" in r.output
