"""`hyperplan zoo list` and `hyperplan zoo export`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx
import pytest
import typer
from typer.testing import CliRunner

import models_zoo
from cli import zoo_cmd


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test root."""

    zoo_cmd.register(app)
    return app


runner = CliRunner()


def invoke(app, *args):
    return runner.invoke(app, list(args), terminal_width=160)


def test_list_json_carries_every_preset_with_its_source(app):
    res = invoke(app, "zoo", "list", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["name"] for r in rows] == models_zoo.names()
    ds = next(r for r in rows if r["name"] == "deepseek-v3")
    assert ds["family"] == "deepseek" and ds["layers"] == 61 and ds["source"]
    assert abs(ds["params"] / 671e9 - 1) < 0.01 and ds["active_params"] < ds["params"]


def test_list_table_names_presets(app):
    res = invoke(app, "zoo", "list")
    assert res.exit_code == 0
    assert "llama3-405b" in res.output and "mixtral-8x22b" in res.output and "671.0B" in res.output
    assert "HF Qwen/Qwen3-8B config.json" in res.output and "36 layers" not in res.output  # each source briefly


def test_list_table_cites_each_source_briefly():
    """Where the figures come from, not all that was read there (QA of 2026-12-08: 272 lines at 80 columns, six
    a preset); `--json` keeps the whole sentence."""
    from cli.zoo_cmd import short_source

    qwen = "HF Qwen/Qwen3-8B config.json (36 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, ...); 8.2B"
    assert short_source(qwen) == "HF Qwen/Qwen3-8B config.json"
    assert short_source("Brown et al. 2020 (GPT-3), Table 2.1: n_layers, d_model") == \
        "Brown et al. 2020 (GPT-3), Table 2.1"
    assert short_source("HF Qwen/Qwen3-235B-A22B config.json, as MindSpeed-RL configs/model/q.yaml repeats it") == \
        "HF Qwen/Qwen3-235B-A22B config.json"
    assert all(len(short_source(r.source)) <= 80 for r in models_zoo.presets())


def test_export_writes_a_loadable_weightless_file_with_overrides(app, tmp_path):
    out = tmp_path / "m.onnx"
    res = invoke(app, "zoo", "export", "mixtral-8x7b", "-o", str(out), "--layers", "2", "--experts", "4",
                 "--top-k", "1", "--seq-len", "64", "--batch", "2", "--hidden", "256", "--heads", "8",
                 "--kv-heads", "2", "--vocab", "1000", "--ffn", "512")
    assert res.exit_code == 0, res.output
    model = onnx.load(str(out), load_external_data=False)
    onnx.checker.check_model(model)
    total = sum(math.prod(t.dims) for t in model.graph.initializer)
    assert total == models_zoo.param_counts("mixtral-8x7b", layers=2, experts=4, top_k=1, hidden=256, heads=8,
                                            kv_heads=2, vocab=1000, ffn=512)[0]
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [2, 64]
    assert "wrote" in res.output


def test_export_writes_layer_functions_unless_flat(app, tmp_path):
    compact, flat = tmp_path / "c.onnx", tmp_path / "f.onnx"
    res = invoke(app, "zoo", "export", "deepseek-v3", "-o", str(compact))
    assert res.exit_code == 0, res.output
    assert "9159 nodes in 2 layer function(s)" in res.output
    res = invoke(app, "zoo", "export", "deepseek-v3", "-o", str(flat), "--flat")
    assert res.exit_code == 0 and "9159 nodes," in res.output
    a, b = (onnx.load(str(p), load_external_data=False) for p in (compact, flat))
    assert [f.name for f in a.functions] == ["DeepseekV3DenseLayer", "DeepseekV3MoeLayer"] and not b.functions
    assert compact.stat().st_size < 250_000 < 1_500_000 < flat.stat().st_size
    assert [t.name for t in a.graph.initializer] == [t.name for t in b.graph.initializer]


def test_export_refuses_to_overwrite_without_force(app, tmp_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"keep me")
    res = invoke(app, "zoo", "export", "gpt", "-o", str(out), "--layers", "1")
    assert res.exit_code == 2 and "already exists" in res.output and "--force" in res.output
    assert out.read_bytes() == b"keep me"
    res = invoke(app, "zoo", "export", "gpt", "-o", str(out), "--layers", "1", "--force")
    assert res.exit_code == 0 and out.read_bytes() != b"keep me"


def test_export_takes_a_config_json_and_any_setting(app, tmp_path):
    config = str(Path(__file__).parent / "data" / "hf_configs" / "Qwen3-8B")
    res = invoke(app, "zoo", "export", config, "-o", str(tmp_path / "q.onnx"), "--layers", "2", "--set",
                 "rope_theta=5e5", "--head-dim", "64")
    assert res.exit_code == 0, res.output
    model = onnx.load(str(tmp_path / "q.onnx"), load_external_data=False)
    saved = json.loads({p.key: p.value for p in model.metadata_props}["hyperplan.config"])
    assert (saved["layers"], saved["rope_theta"], saved["head_dim"], saved["qk_norm"]) == (2, 5e5, 64, True)
    bad = invoke(app, "zoo", "export", "llama3-8b", "-o", str(tmp_path / "x.onnx"), "--set", "colour=red")
    assert bad.exit_code == 2 and "no setting 'colour'; valid settings:" in bad.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["nope"], "unknown zoo model 'nope'"),
        (["vit-l-16", "--seq-len", "64"], "no setting 'seq_len'"),
        (["llama3-8b", "--heads", "7"], "not a multiple of heads=7"),
    ],
)
def test_export_errors_are_one_line_without_traceback(app, tmp_path, args, words):
    res = invoke(app, "zoo", "export", args[0], "-o", str(tmp_path / "x.onnx"), *args[1:])
    assert res.exit_code == 2
    assert words in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x.onnx").exists()
