"""`hyperplan inspect` through typer's CliRunner: JSON numbers, tables, and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import models_zoo
from cli import inspect_cmd
from cli.options import parse_dims
from planner.api import load_graph
from planner.errors import InvalidInput

app = typer.Typer(pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """Test root."""


inspect_cmd.register(app)
runner = CliRunner()
ENV = {"COLUMNS": "120", "NO_COLOR": "1"}
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ZOO = ["llama3-8b", "--layers", "2", "--seq-len", "128"]


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, ["inspect", *args, "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_numbers_of_a_zoo_model():
    data = _json(ZOO)
    total, _ = models_zoo.param_counts("llama3-8b", layers=2)
    assert data["params"]["total"] == total
    graph = load_graph("llama3-8b", overrides={"layers": 2}, seq_len=128)
    assert data["workload"] == {"batch": 1, "seq_len": 128, "unit": "token", "units": 128, "source": "zoo config"}
    assert data["flops"]["forward"] == graph.flops
    assert data["flops"]["forward_per_token"] == pytest.approx(graph.flops / 128)
    # a decoder's forward pass costs about 2 FLOPs per parameter per token (Kaplan et al. 2020)
    non_embedding = total - data["params"]["by_type"]["model.embed_tokens"]
    assert 2 * non_embedding < data["flops"]["forward_per_token"] < 2.2 * non_embedding
    assert data["layers"] == {"count": 2, "types": len(data["block_types"]), "repeated_types": 1}
    layer = next(t for t in data["block_types"] if t["label"] == "model.layers (transformer layer)")
    assert layer["count"] == 2 and layer["params"] == 2 * layer["params_per_instance"]
    assert sum(data["params"]["by_type"].values()) + data["params"]["outside_blocks"] == total
    assert [s["name"] for s in data["submodels"]] == ["model"]
    assert sum(data["ops"]["histogram"].values()) == data["model"]["nodes"] == len(graph.nodes)
    assert data["weights_bytes_by_dtype"] == {"bfloat16": 2 * total}


def test_json_is_sorted_and_deterministic():
    first = runner.invoke(app, ["inspect", *ZOO, "--json"], env=ENV).stdout
    second = runner.invoke(app, ["inspect", *ZOO, "--json"], env=ENV).stdout
    assert first == second
    assert first.strip() == json.dumps(json.loads(first), indent=2, sort_keys=True)


def test_json_of_exported_files_per_token_and_per_sample():
    clip = _json([str(FIXTURES / "clip.onnx"), "--batch", "2", "--seq-len", "8"])
    assert [s["name"] for s in clip["submodels"]] == ["vision_model", "text_model"]
    assert clip["model"]["dims"] == {"batch": 2, "seq": 8} and clip["workload"]["unit"] == "token"
    assert clip["weights_bytes_by_dtype"].keys() == {"bfloat16"}
    vit = _json([str(FIXTURES / "vit.onnx"), "--dim", "batch=4"])
    assert vit["workload"] == {"batch": 4, "seq_len": None, "unit": "sample", "units": 4,
                               "source": "symbolic dims"}
    assert vit["flops"]["forward_per_sample"] == pytest.approx(vit["flops"]["forward"] / 4)


def test_tables():
    result = runner.invoke(app, ["inspect", str(FIXTURES / "qwen3_moe_mixed.onnx"), "--batch", "2",
                                 "--seq-len", "8"], env=ENV)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("Block types", "model.layers[dense]", "model.layers[moe]", "Sub-models", "Ops",
                 "forward FLOPs per token", "Weight memory", "bfloat16", "batch=2, seq=8"):
        assert text in out, text
    assert max(len(line) for line in out.splitlines()) <= 120


def test_registered_on_the_real_app():
    from cli.app import app as real_app

    result = runner.invoke(real_app, ["inspect", "--help"], env=ENV)
    assert result.exit_code == 0 and "--seq-len" in result.stdout and "--kv-heads" in result.stdout
    short = runner.invoke(real_app, ["inspect", "-h"], env=ENV)  # -h too (QA of 2026-12-07: "No such option")
    assert short.exit_code == 0 and short.stdout == result.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["no/such/model.onnx"], "does not exist"),
    ([os.devnull], "is not a regular file"),  # it exists: "does not exist" had said otherwise
    (["GARBAGE"], "not a readable ONNX model"),
    ([str(FIXTURES / "llama_gqa.onnx")], "--dim"),
    (["llama3-8c"], "did you mean 'llama3-8b'"),
    ([str(FIXTURES / "gpt2.onnx"), "--dim", "batch"], "NAME=VALUE"),
    ([str(FIXTURES / "gpt2.onnx"), "--dim", "batch=two"], "integer"),
    ([str(FIXTURES / "gpt2.onnx"), "--batch", "0", "--seq-len", "8"], "--batch 0: the sequences per batch is at least 1"),
    ([str(FIXTURES / "gpt2.onnx"), "--batch", "1", "--seq-len", "8", "--layers", "2"], "only zoo models"),
    (["llama3-8b", "--heads", "7"], "llama3-8b"),
])
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path):
    if args == ["GARBAGE"]:
        garbage = tmp_path / "garbage.onnx"
        garbage.write_bytes(b"\x00\xffnot onnx at all" * 50)
        args = [str(garbage)]
    result = runner.invoke(app, ["inspect", *args], env=ENV)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""


def test_parse_dims():
    assert parse_dims(["batch=8", " seq = 4096 "]) == {"batch": 8, "seq": 4096}
    assert parse_dims(None) == {}
    with pytest.raises(InvalidInput, match="given twice"):
        parse_dims(["seq=1", "seq=2"])
