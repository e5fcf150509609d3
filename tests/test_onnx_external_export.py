"""The ONNX export of a model whose weights are external data: from any directory, into the model's folder only.

ONNX reads external data relative to the model file and refuses locations outside its folder, so the annotated
model (which keeps the original references rather than copying the weights) is checked and written there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from typer.testing import CliRunner

from cli.app import app

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def test_a_model_with_external_weights_exports_from_elsewhere_into_its_own_folder(tmp_path, monkeypatch):
    home = tmp_path / "model"
    home.mkdir()
    for name in ("llama_gqa_external.onnx", "llama_gqa_external.onnx.data"):
        shutil.copy(FIXTURES / name, home / name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # neither the model's folder nor the repository
    r = runner.invoke(app, ["plan", str(home / "llama_gqa_external.onnx"), "--cluster", "dgx-a100", "--devices", "4",
                            "--global-batch", "4", "--seq-len", "64", "--tp", "2", "-o", "plan.yaml"])
    assert r.exit_code == 0, r.output

    r = runner.invoke(app, ["export", "plan.yaml", "--backend", "onnx", "-o", "annotated.onnx"])
    assert r.exit_code == 2
    assert "keeps its weights in llama_gqa_external.onnx.data, which ONNX reads only from the model's own folder" \
        in r.output and not (work / "annotated.onnx").exists()

    out = home / "annotated.onnx"
    r = runner.invoke(app, ["export", "plan.yaml", "--backend", "onnx", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in home.iterdir()) == ["annotated.onnx", "llama_gqa_external.onnx",
                                                      "llama_gqa_external.onnx.data"]  # no check file left behind
    onnx.checker.check_model(str(out))
    model = onnx.load(str(out))  # the weights read back through the kept references
    original = onnx.load(str(home / "llama_gqa_external.onnx"))
    assert {t.name: t.raw_data for t in model.graph.initializer} == \
        {t.name: t.raw_data for t in original.graph.initializer}
    assert any(len(n.device_configurations) for n in model.graph.node)  # annotated


def test_a_missing_external_data_file_is_named_before_anything_is_written(tmp_path, monkeypatch):
    """Planning reads no weights, so a model copied without its .data file plans; its ONNX export had then failed
    inside onnx.checker ('... is not regular file; re-plan, or check the declaration's layouts') (QA)."""
    shutil.copy(FIXTURES / "llama_gqa_external.onnx", tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").write_bytes(b"")  # the location the copy names: created, then removed below
    monkeypatch.chdir(tmp_path)
    model = onnx.load("m.onnx", load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "m.onnx.data"
    onnx.save(model, "m.onnx")
    (tmp_path / "m.onnx.data").unlink()
    r = runner.invoke(app, ["plan", "m.onnx", "--cluster", "dgx-a100", "--devices", "4", "--global-batch", "4",
                            "--seq-len", "64", "--tp", "2", "-o", "plan.yaml"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", "plan.yaml", "--backend", "onnx", "-o", "annotated.onnx"])
    assert r.exit_code == 2 and "keeps its weights in m.onnx.data, which is not in" in r.output, r.output
    assert "copy it beside the model" in r.output and not (tmp_path / "annotated.onnx").exists()


def test_a_saved_weightless_zoo_file_exports_anywhere(tmp_path, monkeypatch):
    """`zoo export` writes weightless initializers at '#weightless', which names no file: the annotated model is
    checked in memory and may be written in any folder."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["zoo", "export", "gpt", "--layers", "2", "--seq-len", "256", "-o", "gpt.onnx"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "gpt.onnx", "--cluster", "dgx-a100", "--devices", "4", "--global-batch", "8",
                            "--seq-len", "256", "--tp", "2", "-o", "plan.yaml"])
    assert r.exit_code == 0, r.output
    (tmp_path / "out").mkdir()
    r = runner.invoke(app, ["export", "plan.yaml", "--backend", "onnx", "-o", "out/annotated.onnx"])
    assert r.exit_code == 0, r.output
    model = onnx.load(str(tmp_path / "out" / "annotated.onnx"), load_external_data=False)
    onnx.checker.check_model(model)
    assert any(len(n.device_configurations) for n in model.graph.node)
