"""The CLI's error boundary: one sentence and an exit code by kind, a traceback only with --debug.

The kinds are checked on a small typer app whose commands raise each kind through the same `guarded`
boundary the real commands use; the real app is checked on inputs that used to end in a traceback or be
silently accepted (issue 17).
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from cli.errors import guarded
from planner.errors import Infeasible, InvalidInput, SolverTimeout

runner = CliRunner()
SMALL = ["--layers", "2"]
TRAIN = ["--cluster", "dgx-h100", "--devices", "8", "--global-batch", "8", "--seq-len", "512"]


def _boundary_app(exc: BaseException) -> typer.Typer:
    demo = typer.Typer()

    @demo.callback()
    def _root(debug: bool = typer.Option(False, "--debug")) -> None:
        """A root with the real app's --debug flag."""

    @demo.command("go")
    @guarded
    def go() -> None:
        raise exc

    return demo


@pytest.mark.parametrize("exc, code, words", [
    (InvalidInput("--tp 0: the tensor-parallel degree is at least 1"), 2, "error: --tp 0"),
    (Infeasible("no strategy fits x on 8 devices"), 3, "error: no strategy fits"),
    (SolverTimeout("the layout solver found no strategy within 1 s"), 4, "error: the layout solver"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (ValueError("unknown schedule 'zigzag'"), 1, "hyperplan bug"),
])
def test_each_kind_is_one_line_and_its_exit_code(exc, code, words):
    r = runner.invoke(_boundary_app(exc), ["go"])
    assert r.exit_code == code, r.output
    assert words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_a_bug_names_itself_and_the_flag_that_shows_it():
    r = runner.invoke(_boundary_app(ValueError("bad\nsecond line")), ["go"])
    assert r.output.strip() == ("error: internal error (ValueError: bad); this is a hyperplan bug: please report it "
                                "with the command, and rerun with --debug for the traceback")


@pytest.mark.parametrize("exc", [InvalidInput("x"), ValueError("y")])
def test_debug_lets_the_exception_through(exc):
    r = runner.invoke(_boundary_app(exc), ["--debug", "go"])
    assert isinstance(r.exception, type(exc)) and "error:" not in r.output


def test_the_real_app_has_debug():
    quiet = runner.invoke(app, ["hardware", "show", "no-such-cluster"])
    assert quiet.exit_code == 2 and "unknown hardware 'no-such-cluster'" in quiet.output
    loud = runner.invoke(app, ["--debug", "hardware", "show", "no-such-cluster"])
    assert loud.exception is not None and "unknown hardware" in str(loud.exception)
    assert "error:" not in loud.output


@pytest.mark.parametrize("args, words", [
    (["estimate", "llama3-8b", *SMALL, *TRAIN, "--schedule", "zigzag"], "--schedule must be 1f1b or gpipe"),
    (["estimate", "llama3-8b", *SMALL, *TRAIN, "--ep", "2"], "--ep 2: the model has no routed experts"),
    (["estimate", "llama3-8b", *SMALL, *TRAIN, "--etp", "2", "--tp", "4"], "--etp 2: the model has no routed"),
    (["whatif", "llama3-8b", *SMALL, "--cluster", "dgx-h100", "--devices", "\u00b2", "--global-batch", "8",
      "--seq-len", "512"], "'\u00b2' is neither a device count nor a range"),
    (["whatif", "llama3-8b", *SMALL, "--cluster", "dgx-h100", "--devices", "8..\u00b2", "--global-batch", "8",
      "--seq-len", "512"], "is neither a device count nor a range"),
])
def test_inputs_that_used_to_give_a_traceback_or_nonsense(args, words):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_a_plan_is_scored_only_on_its_own_model(tmp_path):
    out = tmp_path / "plan.yaml"
    made = runner.invoke(app, ["plan", "gpt", *SMALL, "--cluster", "dgx-h100", "--devices", "2", "--global-batch",
                               "4", "--seq-len", "128", "-o", str(out)])
    assert made.exit_code == 0, made.output
    same = runner.invoke(app, ["estimate", "gpt", "--plan", str(out), "--json"])
    assert same.exit_code == 0, same.output
    scored = json.loads(same.output)  # as an estimate given by flags: with what it rests on and how far off it may be
    stated = load_cluster("dgx-h100").checked("dense_training")
    assert scored["accuracy"]["sentence"] == stated.sentence("dgx-h100", shipped=True)
    assert any("memory_plateau not fitted" in a for a in scored["assumptions"])
    other = runner.invoke(app, ["estimate", "llama3-8b", "--plan", str(out)])
    assert other.exit_code == 2, other.output
    assert "llama3-8b is not the model the declaration was planned for (gpt)" in other.output
    # nor on another layer count: the declared pipeline's chunks had been cut anew, and 4 layers scored as 2 chunks
    # of 2 were reported as the declaration (QA of 2026-12-07); a width change keeps its layers and is scored
    for layers in ("4", "1"):
        deeper = runner.invoke(app, ["estimate", "gpt", "--plan", str(out), "--layers", layers])
        assert deeper.exit_code == 2, deeper.output
        assert (f"the architecture options make a model of {layers} layers where the declaration's pipeline lists "
                "2") in " ".join(deeper.output.split()), deeper.output
    wider = runner.invoke(app, ["estimate", "gpt", "--plan", str(out), "--layers", "2", "--hidden", "384"])
    assert wider.exit_code == 0, wider.output


def test_a_model_without_repeated_layers_is_told_so(tmp_path):
    """One MatMul and no repeated block: plan had said no strategy fits (exit 3, as if memory were short) and estimate
    that its 0 layers were too few for 1 pipeline chunk, to be lowered with --pp (QA of 2026-12-07)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one_matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 16])], [w])
    path = tmp_path / "one_matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    job = ["--cluster", "dgx-h100", "--devices", "2", "--global-batch", "2", "--seq-len", "16"]
    for command in ("plan", "estimate"):
        r = runner.invoke(app, [command, str(path), *job])
        assert r.exit_code == 2, r.output
        assert "no repeated layer was found in the model" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize(("args", "words"), [
    (["--global-batch", "8", "--seq-len", "64", "--backend", "vllm"],
     "--backend vllm launches serving, not training; add --mode infer"),
    (["--mode", "infer", "--prompt-len", "64", "--gen-len", "8", "--backend", "megatron"],
     "--backend megatron launches training, not serving"),
])
def test_a_launch_backend_of_the_other_mode_is_refused_before_the_search(args, words, monkeypatch):
    """They had searched in full and then ended at exit 3, the best plan not exporting (QA of 2026-12-07)."""
    from cli import plan_cmd

    monkeypatch.setattr(plan_cmd, "plan_model", lambda *a, **k: pytest.fail("searched"))
    monkeypatch.setattr(plan_cmd, "plan_inference", lambda *a, **k: pytest.fail("searched"))
    r = runner.invoke(app, ["plan", "gpt", *SMALL, "--cluster", "dgx-h100", "--devices", "2", *args])
    assert r.exit_code == 2 and words in " ".join(r.output.split()), r.output


def test_an_offload_class_given_twice_is_refused():
    """The last value had won without a word (QA of 2026-12-07)."""
    r = runner.invoke(app, ["estimate", "gpt", *SMALL, "--cluster", "dgx-h100", "--devices", "2", "--global-batch",
                            "4", "--seq-len", "128", "--offload", "params=1", "--offload", "params=0"])
    assert r.exit_code == 2 and "--offload params is given twice (1 and 0); give it once" in r.output, r.output


def test_an_export_says_its_estimate_is_the_declarations_record(tmp_path):
    """Export checks a declaration through its layouts, not its figures: an edited step time went out as 'hyperplan's
    analytic estimate' while validate refused the file (QA of 2026-12-07). The header says whose figure it is."""
    out = tmp_path / "plan.yaml"
    made = runner.invoke(app, ["plan", "gpt", *SMALL, "--cluster", "dgx-h100", "--devices", "2", "--global-batch",
                               "4", "--seq-len", "128", "-o", str(out)])
    assert made.exit_code == 0, made.output
    for backend in ("megatron", "jax"):  # a launch config's header and a file's
        target = [] if backend == "megatron" else ["-o", str(tmp_path / "plan.py")]
        r = runner.invoke(app, ["export", str(out), "--backend", backend, *target], terminal_width=400)
        assert r.exit_code == 0, r.output
        text = r.output if backend == "megatron" else (tmp_path / "plan.py").read_text()
        assert "(hyperplan's analytic estimate as the declaration records it; `hyperplan validate` re-scores it)" \
            in " ".join(text.replace("#", " ").split()), text[:600]
