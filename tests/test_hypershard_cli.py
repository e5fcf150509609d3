"""The CLI around declarations: plan -o, validate, export, estimate --plan; errors are one line."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from planner.hypershard.io import read_document

runner = CliRunner()
MODEL = ["gpt", "--layers", "2", "--hidden", "512", "--heads", "8"]
WHERE = ["--cluster", "dgx-a100", "--devices", "8", "--global-batch", "32", "--seq-len", "512"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    r = runner.invoke(app, ["plan", *MODEL, *WHERE, "--json", "-o", str(folder / "plan.yaml")])
    assert r.exit_code == 0, r.output
    return folder, json.loads(r.output)


def test_plan_writes_a_declaration_that_validates_to_its_numbers(planned):
    folder, plan = planned
    r = runner.invoke(app, ["validate", str(folder / "plan.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["ok"] and report["estimate"]["step_time_s"] == plan["estimate"]["step_time_s"]
    human = runner.invoke(app, ["validate", str(folder / "plan.yaml")], terminal_width=120)
    assert human.exit_code == 0 and "valid" in human.output and "equal to the recorded estimate" in human.output
    narrow = runner.invoke(app, ["validate", str(folder / "plan.yaml")], terminal_width=60)
    lines = narrow.output.splitlines()
    checks = lines[1:next(i for i, line in enumerate(lines) if line.startswith("gpt on dgx-a100"))]
    assert max(len(line.rstrip()) for line in checks) <= 60, narrow.output  # it had run on past the width
    estimate_line = next(i for i, line in enumerate(checks) if line.startswith("  ok  estimate"))
    follow = checks[estimate_line + 1]  # its detail, some 65 characters, goes on under itself
    assert follow.startswith(" " * 16) and follow.strip() and "estimate" in follow


def test_the_declaration_says_how_far_off_its_estimate_may_be(planned):
    """What `plan` said of its figures travels with the file: its hardware's held-out runs and its assumptions."""
    folder, plan = planned
    doc = read_document(str(folder / "plan.yaml"))
    assert doc["accuracy"] == plan["accuracy"] and doc["accuracy"]["sentence"].startswith("6 held-out dense training")
    assert doc["assumptions"] == plan["assumptions"]
    doc["accuracy"]["sentence"] = "6 held-out dense training runs on dgx-a100: mean |error| 9.9 %, max 9.9 %"
    edited = folder / "refitted.yaml"
    edited.write_text(yaml.safe_dump(doc, sort_keys=False))
    report = json.loads(runner.invoke(app, ["validate", str(edited), "--json"]).output)
    assert report["ok"] and any(w.startswith("how far off its estimate may be changed since it was planned")
                                and "then 6 held-out" in w and plan["accuracy"]["sentence"] in w
                                for w in report["warnings"])


def test_estimate_with_plan_scores_the_file(planned):
    folder, plan = planned
    r = runner.invoke(app, ["estimate", "gpt", "--plan", str(folder / "plan.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["step_time_s"] == plan["estimate"]["step_time_s"]
    clash = runner.invoke(app, ["estimate", "gpt", "--plan", str(folder / "plan.yaml"), "--tp", "2"])
    assert clash.exit_code == 2 and "--tp and --plan both set the strategy" in clash.output
    missing = runner.invoke(app, ["estimate", "gpt", "--cluster", "dgx-a100"])
    assert missing.exit_code == 2 and "--global-batch, --seq-len are needed" in missing.output


def test_an_edited_file_fails_validation_but_is_scored(planned, tmp_path):
    folder, plan = planned
    doc = yaml.safe_load((folder / "plan.yaml").read_text())
    doc["programs"][0]["micro_batch_size"] = 1
    doc["programs"][0]["micro_batches"] = plan["workload"]["global_batch"] // plan["strategy"]["dp"]
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["validate", str(tmp_path / "edited.yaml")], terminal_width=200)
    assert r.exit_code == 2 and "FAIL" in r.output and "not valid" in r.output
    scored = runner.invoke(app, ["estimate", "gpt", "--plan", str(tmp_path / "edited.yaml"), "--json"])
    assert scored.exit_code == 0 and json.loads(scored.output)["strategy"]["micro_batch"] == 1


@pytest.mark.parametrize("backend, name", [("torch", "p.py"), ("jax", "p.py"), ("mindspore", "p.py"),
                                           ("hyper-parallel", "p.py"), ("onnx", "p.onnx")])
def test_export_writes_each_backend(planned, tmp_path, backend, name):
    folder, _ = planned
    r = runner.invoke(app, ["export", str(folder / "plan.yaml"), "--backend", backend, "-o", str(tmp_path / name)])
    assert r.exit_code == 0, r.output
    assert f"{backend} export written" in r.output and (tmp_path / name).stat().st_size > 1000


def _imports(monkeypatch) -> list:
    """The model imports (`load_graph` calls) of what runs next, with the process's graph store emptied."""
    import planner.api

    calls: list = []
    real = planner.api.load_graph
    monkeypatch.setattr(planner.api, "_GRAPHS", {})
    monkeypatch.setattr(planner.api, "load_graph", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_plan_and_an_onnx_export_import_the_model_once(planned, tmp_path, monkeypatch):
    """The search and the declaration it writes, and validate's checks before an export and the annotation itself,
    each read one graph: neither command imports the model a second time (both did, through the uncached loader)."""
    folder, _ = planned
    calls = _imports(monkeypatch)
    r = runner.invoke(app, ["plan", *MODEL, *WHERE, "-o", str(tmp_path / "again.yaml")])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1
    calls = _imports(monkeypatch)
    r = runner.invoke(app, ["export", str(folder / "plan.yaml"), "--backend", "onnx", "-o", str(tmp_path / "p.onnx")])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1


def test_errors_are_one_line(planned, tmp_path):
    folder, _ = planned
    (tmp_path / "bad.yaml").write_text("hypershard: 2\n")
    cases = [
        (["validate", str(tmp_path / "bad.yaml")], "declares format version 2; this hyperplan reads version 1"),
        (["validate", str(tmp_path / "none.yaml")], "does not exist"),
        (["export", str(folder / "plan.yaml"), "--backend", "caffe", "-o", str(tmp_path / "x.py")], "unknown backend"),
        (["export", str(folder / "plan.yaml"), "--backend", "torch", "-o", str(tmp_path / "x.yaml")], "writes a .py"),
        (["export", str(folder / "plan.yaml"), "--backend", "onnx", "-o", str(folder / "plan.yaml")],
         "is an input of this command"),
    ]
    for args, message in cases:
        r = runner.invoke(app, args, terminal_width=300)
        assert r.exit_code == 2, r.output
        assert message in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1
