"""Writes: never an input of the same command, never an existing file without --force, always atomic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import whatif_cmd
from cli.app import app
from planner.errors import InvalidInput
from planner.hypershard.io import check_output, write_atomically

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()
PLAN = ["--cluster", "dgx-h100", "--devices", "2", "--global-batch", "4", "--seq-len", "16"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Path:
    """A folder with an ONNX model and the declaration planned for it."""
    folder = tmp_path_factory.mktemp("planned")
    shutil.copy(FIXTURES / "gpt2.onnx", folder / "gpt2.onnx")
    # --tp 1: the torch export splits no GPT-2 Conv1D weight (it refuses such a plan in one sentence)
    r = runner.invoke(app, ["plan", str(folder / "gpt2.onnx"), *PLAN, "--tp", "1", "-o", str(folder / "plan.yaml")])
    assert r.exit_code == 0, r.output
    return folder


def test_plan_replaces_its_output_only_with_force(planned, tmp_path):
    out = tmp_path / "plan.yaml"
    out.write_text("mine\n")
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", *PLAN, "-o", str(out)])
    assert r.exit_code == 2 and "already exists; pass --force to replace it" in r.output, r.output
    assert out.read_text() == "mine\n"
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", *PLAN, "-o", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("hypershard:")


def test_export_never_replaces_the_model_the_plan_reads(planned):
    model = planned / "gpt2.onnx"
    before = model.read_bytes()
    for extra in ([], ["--force"]):
        r = runner.invoke(app, ["export", str(planned / "plan.yaml"), "--backend", "onnx", "-o", str(model), *extra])
        assert r.exit_code == 2 and "is an input of this command" in r.output, r.output
    assert model.read_bytes() == before


def test_export_says_what_it_wrote_as_json(planned, tmp_path):
    out = tmp_path / "plan.py"
    r = runner.invoke(app, ["export", str(planned / "plan.yaml"), "--backend", "torch", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got == {"backend": "torch", "declaration": str(planned / "plan.yaml"), "output": str(out),
                   "bytes": out.stat().st_size}
    again = runner.invoke(app, ["export", str(planned / "plan.yaml"), "--backend", "torch", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output


def test_whatif_refuses_an_existing_csv_before_the_sweep(tmp_path, monkeypatch):
    def no_sweep(*args, **kwargs):
        raise AssertionError("the sweep ran before the output was checked")

    monkeypatch.setattr(whatif_cmd, "run_sweep", no_sweep)
    out = tmp_path / "points.csv"
    out.write_text("keep\n")
    r = runner.invoke(app, ["whatif", "gpt", "--layers", "2", "--cluster", "dgx-h100", "--devices", "1,2",
                            "--global-batch", "4", "--seq-len", "16", "--csv", str(out)])
    assert r.exit_code == 2 and "already exists; pass --force" in r.output, r.output
    assert out.read_text() == "keep\n"


def test_check_output_names_the_problem(tmp_path):
    (tmp_path / "in.onnx").write_bytes(b"model")
    with pytest.raises(InvalidInput, match="is an input of this command"):
        check_output(tmp_path / "in.onnx", "-o", protect=(str(tmp_path / "in.onnx"),), force=True)
    with pytest.raises(InvalidInput, match="folder .* does not exist"):
        check_output(tmp_path / "no" / "x.yaml", "-o")
    with pytest.raises(InvalidInput, match="is a folder"):
        check_output(tmp_path, "-o", force=True)
    check_output(tmp_path / "new.yaml", "-o")  # a new file in an existing folder is fine


def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    """A folder no file can be made in (Linux's /proc refuses even root) and a name too long for the file system
    had ended, after the whole search, as an 'internal error' (OSError 2 and 36) from the temporary file (QA of
    2026-12-07)."""
    with pytest.raises(InvalidInput, match=r"cannot write in folder /proc \(No such file or directory\)"):
        check_output("/proc/x.yaml", "-o")
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", *PLAN, "-o", "/proc/x.yaml"])
    assert r.exit_code == 2 and "cannot write in folder /proc" in r.output, r.output
    long = tmp_path / ("a" * 300 + ".yaml")
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", *PLAN, "-o", str(long)])
    assert r.exit_code == 2, r.output
    assert "the file name is longer than the 255 bytes its folder allows" in " ".join(r.output.split())
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_the_old_file_and_no_debris(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("old\n")

    def broken() -> str:
        raise OSError(28, "No space left on device")

    with pytest.raises((InvalidInput, OSError)):
        write_atomically(str(out), broken, (), "CSV")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]
    write_atomically(str(out), lambda: "new\n", (), "CSV")
    assert out.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_plan_written_into_another_folder_names_its_model_from_there(tmp_path, monkeypatch):
    """`plan ../m.onnx -o ../p.yaml` from a subfolder had stored '../m.onnx', which `validate` from the plan's own
    folder then could not find: a relative model path is written relative to the plan's folder."""
    shutil.copy(FIXTURES / "gpt2.onnx", tmp_path / "gpt2.onnx")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    r = runner.invoke(app, ["plan", "../gpt2.onnx", *PLAN, "--tp", "1", "-o", "../plan.yaml"])
    assert r.exit_code == 0, r.output
    assert "  path: gpt2.onnx\n" in (tmp_path / "plan.yaml").read_text()
    for where in (tmp_path, tmp_path / "sub"):
        monkeypatch.chdir(where)
        r = runner.invoke(app, ["validate", str(tmp_path / "plan.yaml")])
        assert r.exit_code == 0 and "not valid" not in r.output, r.output


def test_a_plan_written_into_another_folder_names_its_hardware_and_stack_files_from_there(tmp_path, monkeypatch):
    """`--cluster hw/my.toml --stack hw/stack.toml -o out/plan.yaml` had stored the paths as given, so `validate`
    from the plan's folder found no hardware ('unknown hardware') and stopped: they are written relative to the
    plan's folder, and a file reads them from wherever it is run; a preset's name stays a name."""
    (tmp_path / "hw").mkdir()
    (tmp_path / "out").mkdir()
    presets = Path(__file__).parents[1]
    shutil.copy(presets / "cost_models" / "presets" / "dgx-h100.toml", tmp_path / "hw" / "my.toml")
    shutil.copy(presets / "planner" / "costing" / "stacks" / "megatron-core.toml", tmp_path / "hw" / "stack.toml")
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                            *PLAN[2:], "--cluster", "hw/my.toml", "--stack", "hw/stack.toml", "-o", "out/plan.yaml"])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "out" / "plan.yaml").read_text()
    assert "  spec: ../hw/my.toml\n" in text and "  stack: ../hw/stack.toml\n" in text
    for where in (tmp_path, tmp_path / "out", tmp_path / "hw"):
        monkeypatch.chdir(where)
        r = runner.invoke(app, ["validate", str(tmp_path / "out" / "plan.yaml")])
        assert r.exit_code == 0 and "not valid" not in r.output, r.output
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128",
                            *PLAN, "-o", str(tmp_path / "out" / "preset.yaml")])
    assert r.exit_code == 0 and "  spec: dgx-h100\n" in (tmp_path / "out" / "preset.yaml").read_text()

