"""`plan --backend NAME` searches only what that backend runs, and says so when a fixed knob disagrees.

Each case is one where the unrestricted search picks what the backend cannot run (context parallelism of a
MoE model for torch, which folds expert parallelism into data parallelism only; host offload for jax), so the
restriction is seen to change the plan, and the restricted plan exports.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app

runner = CliRunner()


def _plan(*args: str) -> dict:
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("backend, args, unrestricted, restricted", [
    ("torch", ["mixtral-8x7b", "--layers", "4", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "64",
               "--seq-len", "131072", "--memory-gib", "8"],
     lambda s: s["cp"] > 1, lambda s: s["cp"] == 1 and s["etp"] in (None, 1)),
    ("torch", ["gpt3-6.7b", "--cluster", "dgx-h100", "--devices", "16", "--global-batch", "64", "--seq-len", "2048",
               "--memory-gib", "20"],  # GPT-2 style Conv1D weights, [in, out]: no torch style splits them
     lambda s: s["tp"] > 1, lambda s: s["tp"] == 1),
    ("jax", ["llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "64", "--seq-len", "4096"],
     lambda s: any(f > 0 for f in s["offload"].values()),
     lambda s: s["pp"] == 1 and not any(f > 0 for f in s["offload"].values())),
])
def test_the_backend_limits_the_search_and_its_plan_exports(tmp_path, backend, args, unrestricted, restricted):
    free = _plan(*args)
    assert unrestricted(free["strategy"]), free["strategy"]["summary"]
    out = tmp_path / "p.yaml"
    kept = _plan(*args, "--backend", backend, "-o", str(out))
    assert restricted(kept["strategy"]), kept["strategy"]["summary"]
    assert kept["estimate"]["step_time_s"] >= free["estimate"]["step_time_s"]  # a smaller space cannot do better
    r = runner.invoke(app, ["export", str(out), "--backend", backend, "-o", str(tmp_path / "p.py")])
    assert r.exit_code == 0, r.output


def test_a_fixed_knob_against_the_backend_is_refused_in_one_sentence():
    r = runner.invoke(app, ["plan", "mixtral-8x7b", "--layers", "2", "--cluster", "dgx-h100", "--devices", "8",
                            "--global-batch", "64", "--seq-len", "4096", "--backend", "torch", "--cp", "2"])
    assert r.exit_code == 2
    assert ("no mesh of 8 devices keeps --cp 2 and etp 1 and cp 1 and ep 1 at tp > 1 for a model with routed "
            "experts with a global "
            "batch of 64; relax a constraint or change --devices") in " ".join(r.output.split())
    r = runner.invoke(app, ["plan", "mixtral-8x7b", "--layers", "2", "--cluster", "dgx-h100", "--devices", "8",
                            "--global-batch", "64", "--seq-len", "4096", "--backend", "torch", "--etp", "2"])
    assert r.exit_code == 2
    assert ("--etp 2 disagrees with --backend torch's constraints (moe_etp: a model with routed experts runs at "
            "etp 1); drop --etp or export with another backend") in " ".join(r.output.split())
    r = runner.invoke(app, ["plan", "gpt3-1.3b", "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "64",
                            "--seq-len", "2048", "--backend", "torch", "--tp", "2"])
    assert r.exit_code == 2
    assert ("no mesh of 8 devices keeps --tp 2 and tp 1 for a model with [in, out] linear weights with a global "
            "batch of 64") in " ".join(r.output.split())
    r = runner.invoke(app, ["plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "64",
                            "--seq-len", "4096", "--backend", "tf"])
    assert r.exit_code == 2 and "unknown backend 'tf'" in r.output


@pytest.mark.parametrize("model, stored_in_out", [("gpt", True), ("llama3-8b", False), ("mixtral-8x7b", False)])
def test_linear_weights_stored_in_out_are_found_from_the_graph(model, stored_in_out):
    """GPT-2's Conv1D multiplies by its weight as stored, [in, out]; nn.Linear's [out, in] goes through a
    transpose (the zoo writes each as its Hugging Face model holds it)."""
    from planner.api import load_graph
    from planner.search.grid import in_out_linears

    assert in_out_linears(load_graph(model, batch=1, seq_len=64, overrides=dict(layers=2))) is stored_in_out
