"""Bounds on the numbers a user gives (planner/bounds.py): refused with the reason, before any heavy work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import estimate_cmd, plan_cmd
from cli.app import app
from cost_models import load_cluster
from planner import bounds
from planner.errors import InvalidInput

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()
SMALL = ["--layers", "2"]
TRAIN = ["--cluster", "dgx-h100", "--devices", "8", "--global-batch", "8", "--seq-len", "512"]


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4"])
def test_a_degree_is_a_whole_number_of_at_least_one(value):
    with pytest.raises(InvalidInput, match=r"^--tp .*the tensor-parallel degree is (at least 1|a whole number)"):
        bounds.degrees(tp=value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -3.0, "many"])
def test_a_positive_number_is_finite(value):
    with pytest.raises(InvalidInput, match=r"^--memory-gib .*(finite number above 0|is a number)"):
        bounds.memory_cap(value)


def test_the_memory_cap_is_at_most_a_device():
    h100 = load_cluster("dgx-h100")
    assert bounds.memory_cap(40, [h100]) == 40.0
    with pytest.raises(InvalidInput, match="a device of dgx-h100 has 80 GiB of HBM; give at most 80"):
        bounds.memory_cap(81, [h100])


def test_time_limits_and_device_counts_have_ceilings():
    assert bounds.time_limit(30) == 30.0
    with pytest.raises(InvalidInput, match="at most 86400"):
        bounds.time_limit(86401)
    assert bounds.devices("--devices", None) is None
    with pytest.raises(InvalidInput, match="at most 524,288"):
        bounds.devices("--devices", 524_289)


def test_tokens_per_step_are_bounded():
    bounds.step_tokens(15_360, 4_096)  # DeepSeek-V3's batch passes
    with pytest.raises(InvalidInput, match=r"= 8,000,000,000 tokens per step is more than 4,294,967,296"):
        bounds.step_tokens(8, 10**9)


def test_a_sequence_longer_than_all_memory_is_refused_with_the_arithmetic():
    h100 = load_cluster("dgx-h100", devices=8)
    bounds.sequence("--seq-len", 131_072, "llama3-8b", h100)  # 128k tokens fit on 8 H100s
    with pytest.raises(InvalidInput) as err:
        bounds.sequence("--seq-len", 10**9, "llama3-8b", h100)
    msg = str(err.value)
    assert "2 B x hidden 4096 x (32 layers + 17) = 392 KiB per token" in msg
    assert "365 TiB" in msg and "all 8 devices of dgx-h100" in msg
    with pytest.raises(InvalidInput, match="of all 64 devices"):  # a sweep asks at its largest count
        bounds.sequence("--seq-len", 10**9, "llama3-8b", h100, devices=64)


def test_the_width_of_a_file_is_read_without_importing_it(manifest):
    cfg = manifest["gpt2"]["config"]
    assert bounds._file_width(str(FIXTURES / "gpt2.onnx")) == (cfg["n_embd"], cfg["n_layer"])
    assert bounds._width("no-such-model", None) == (0, 0, False)  # the import says what is wrong with it


def _no_work(*args, **kwargs):
    raise AssertionError("the model was read or planned before its numbers were checked")


@pytest.mark.parametrize("args, words", [
    (["--tp", "0"], "--tp 0: the tensor-parallel degree is at least 1"),
    (["--pp", "0"], "--pp 0: the number of pipeline stages is at least 1"),
    (["--micro-batch", "0"], "--micro-batch 0: a micro-batch is at least 1"),
    (["--vpp", "-2"], "--vpp -2: the number of interleaved chunks per stage is at least 1"),
    (["--full-recompute-layers", "-1"], "--full-recompute-layers -1: the layers fully recomputed per chunk is at "
                                        "least 0"),
])
def test_estimate_checks_its_numbers_first(args, words, monkeypatch):
    monkeypatch.setattr(estimate_cmd, "estimate_model", _no_work)
    r = runner.invoke(app, ["estimate", "llama3-8b", *SMALL, *TRAIN, *args])
    assert r.exit_code == 2 and words in r.output, r.output


@pytest.mark.parametrize("args, words", [
    (["--memory-gib", "nan"], "--memory-gib nan: the HBM a plan may use per device (GiB) must be a finite number"),
    (["--time-limit", "-1"], "--time-limit -1.0: the search's time limit in seconds must be a finite number above 0"),
    (["--seq-len", "1000000000", "--global-batch", "1"], "one sequence needs at least"),
    (["--devices", "1000000"], "--devices 1000000: a device count is at most 524,288"),
])
def test_plan_checks_its_numbers_first(args, words, monkeypatch):
    monkeypatch.setattr(plan_cmd, "plan_model", _no_work)
    r = runner.invoke(app, ["plan", "llama3-8b", *TRAIN, *args])
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_file_at_a_billion_tokens_is_refused_before_shape_inference(monkeypatch):
    import planner.graph.onnx_import as onnx_import

    monkeypatch.setattr(onnx_import, "import_model", _no_work)
    r = runner.invoke(app, ["estimate", str(FIXTURES / "gpt2.onnx"), "--cluster", "dgx-h100", "--devices", "8",
                            "--global-batch", "1", "--seq-len", "1000000000"])
    assert r.exit_code == 2 and "--seq-len 1,000,000,000: " in r.output, r.output


def test_sane_numbers_pass_through(tmp_path):
    r = runner.invoke(app, ["estimate", "llama3-8b", *SMALL, *TRAIN, "--tp", "2", "--micro-batch", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["strategy"]["tp"] == 2


def test_inspect_bounds_what_it_reads(monkeypatch):
    import planner.graph.onnx_import as onnx_import

    monkeypatch.setattr(onnx_import, "import_model", _no_work)
    gpt2 = str(FIXTURES / "gpt2.onnx")
    r = runner.invoke(app, ["inspect", gpt2, "--seq-len", "1000000000"])
    assert r.exit_code == 2 and "ONNX shape inference holds about 1 KiB per token" in r.output, r.output
    r = runner.invoke(app, ["inspect", gpt2, "--batch", "0"])
    assert r.exit_code == 2 and "--batch 0: the sequences per batch is at least 1" in r.output, r.output
    # a zoo model is built at any length, but not past a step's tokens: GPT's position table at 1e11 tokens had been
    # described (inspect) and written (zoo export) as a 76.8T-parameter model (QA of 2026-12-07)
    for command in (["inspect", "gpt"], ["zoo", "export", "gpt", "-o", "never.onnx"]):
        r = runner.invoke(app, [*command, "--seq-len", str(10**11)])
        assert r.exit_code == 2 and "--seq-len 100000000000: the sequence length (tokens) is at most 4,294,967,296" \
            in " ".join(r.output.split()), r.output


@given(st.integers(1, 5000), st.integers(1, 5000), st.booleans(), st.integers(0, 3000), st.sampled_from([1, 64, 128]))
@settings(max_examples=200)
def test_flash_tiles_in_closed_form_equal_the_row_by_row_count(q_len, kv_len, causal, window, tile):
    """kept_fraction counts a million-token sequence's tiles without walking its rows; the count is the same."""
    from planner.costing.attention import kept_fraction

    if not (causal or window):
        assert kept_fraction(q_len, kv_len, causal, window, tile) == 1.0
        return
    rows, cols = -(-q_len // tile), -(-kv_len // tile)
    band = -(-window // tile) + 1 if window else cols
    tiles = sum(min(band, r + 1 + cols - rows) if causal else min(band, cols) for r in range(rows))
    assert kept_fraction(q_len, kv_len, causal, window, tile) == min(1.0, tiles / (rows * cols))


def test_a_zoo_model_of_two_billion_layers_is_refused_before_it_is_built():
    from planner.api import load_graph

    with pytest.raises(InvalidInput, match="gpt with layers=2,000,000,000: a zoo model is built with at most 1,024"):
        load_graph("gpt", batch=1, seq_len=8, overrides={"layers": 2 * 10**9})


def test_a_declarations_sequence_is_bounded_like_a_given_one(tmp_path, monkeypatch):
    plan = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "llama3-8b", *SMALL, *TRAIN, "--tp", "2", "--pp", "1", "--dp", "4",
                            "--micro-batch", "1", "--recompute", "none", "--zero", "1", "--no-offload", "-o", str(plan)])
    assert r.exit_code == 0, r.output
    import planner.hypershard.declared as declared

    monkeypatch.setattr(declared, "estimate_declared", _no_work)
    r = runner.invoke(app, ["estimate", "llama3-8b", *SMALL, "--plan", str(plan), "--seq-len", "1000000000"])
    assert r.exit_code == 2 and "--seq-len 1,000,000,000: one sequence needs at least" in r.output, r.output


def test_a_declarations_step_is_bounded_like_a_given_one(tmp_path):
    """A declaration of 10^30 sequences a step had been re-scored, to a step of 6.5e27 hours (QA of 2026-12-07)."""
    plan = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--cluster", "dgx-a100", "--devices", "2",
                            "--global-batch", "4", "--seq-len", "128", "-o", str(plan)])
    assert r.exit_code == 0, r.output
    plan.write_text(plan.read_text().replace("global_batch: 4\n", f"global_batch: {10**30}\n", 1))
    for command in (["validate", str(plan)], ["export", str(plan), "--backend", "megatron"]):
        r = runner.invoke(app, command)
        assert r.exit_code == 2, r.output
        assert "workload.global_batch x workload.seq_len = 128,000,000,000,000,000,000,000,000,000,000 tokens per " \
               "step is more than 4,294,967,296" in " ".join(r.output.split()), r.output


def test_a_step_of_hours_is_flagged_and_a_step_of_seconds_is_not():
    args = ["estimate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--seq-len", "4096", "--dp", "8",
            "--zero", "1", "--json"]
    # 2**18 sequences of 4,096 tokens of an 8B model: 6 x 8e9 x 1.07e9 = 5.2e19 FLOP, 6.4e18 per device: 1.8 h
    # even at the H100's whole 989 TFLOP/s
    long = json.loads(runner.invoke(app, [*args, "--global-batch", str(8 * 2**15)]).stdout)
    assert long["step_time_s"] > 3600
    assert long["warnings"] and "--global-batch counts sequences per step" in long["warnings"][0]
    short = json.loads(runner.invoke(app, [*args, "--global-batch", "64"]).stdout)
    assert short["step_time_s"] < 60 and short["warnings"] == []


@pytest.mark.parametrize(("command", "dtype", "words"), [
    ("plan", "int8", "--dtype int8: training runs in bf16, fp16, fp8 or fp32; give one of those"),
    ("plan", "fp64", "--dtype fp64: training runs in bf16, fp16, fp8 or fp32"),
    ("estimate", "tf32", "--dtype tf32: training runs in bf16, fp16, fp8 or fp32"),
    ("whatif", "int8", "--dtype int8: training runs in bf16, fp16, fp8 or fp32"),
    ("plan", "fp8", "--dtype fp8: dgx-a100's A100-SXM4-80GB has no fp8 peak; train in bf16, fp16 or fp32 there"),
    ("estimate", "fp8", "has no fp8 peak; train in bf16, fp16 or fp32 there"),
])
def test_a_training_precision_is_one_a_stack_trains_in_and_the_device_has(command, dtype, words):
    """int8, tf32 or fp64 training had planned (and crashed in an exporter's precision table) or estimated a step
    faster than bf16's; fp8 on an A100 pointed at the device's int8 peak."""
    args = [command, "gpt", "--layers", "2", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "8",
            "--seq-len", "512", "--dtype", dtype] + (["--dp", "8"] if command == "estimate" else [])
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split()) and "Traceback" not in r.output


@pytest.mark.parametrize(("knobs", "words"), [
    (["--micro-batch", "64"], "--micro-batch 64 is more than the global batch of 8 sequences; give a divisor of 8"),
    (["--micro-batch", "3"], "--micro-batch 3 does not divide the global batch of 8 sequences"),
    (["--pp", "2", "--vpp", "3"], "--pp 2 --vpp 3 makes 6 pipeline chunks, more than the model's 2 layers and its "
                                  "two ends; lower --vpp or --pp"),
    (["--ep", "2"], "--ep 2: the model has no routed experts (no MoE layer); drop --ep"),
    (["--tp", "8"], "--tp 8 does not divide the 12 query heads of an attention layer"),
    (["--pp", "3"], "--pp 3 does not divide the 8 devices; give degrees whose product divides 8"),
    (["--tp", "2", "--dp", "3"], "--tp 2 x --dp 3 = 6 does not divide the 8 devices"),
])
def test_fixed_knobs_no_strategy_of_the_model_can_take_are_named(knobs, words):
    """They had ended as 'no strategy fits ...: no strategy could be built' (exit 3) or as a mesh that keeps them."""
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--cluster", "dgx-a100", "--devices", "8",
                            "--global-batch", "8", "--seq-len", "512", *knobs])
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split())


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_a_tensor_degree_that_does_not_divide_the_heads_is_refused(command):
    """--tp 64 on llama3-8b's 32 query heads had planned (and exported a Megatron command line whose
    TransformerConfig refuses it: num_attention_heads must be a multiple of tensor_model_parallel_size) and
    estimated; --ep 16 on Mixtral's 8 experts had ended as a mesh the global batch did not keep (QA of
    2026-12-07)."""
    job = ["llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "64", "--seq-len", "4096"]
    r = runner.invoke(app, [command, *job, "--tp", "64"])
    assert r.exit_code == 2, r.output
    assert ("--tp 64 does not divide the 32 query heads of an attention layer, and attention is split by whole "
            "heads; use a tp that divides them (1, 2, 4, 8, 16, 32)") in " ".join(r.output.split())
    r = runner.invoke(app, [command, "mixtral-8x7b", *job[1:], "--ep", "16"])
    assert r.exit_code == 2, r.output
    assert "--ep 16 does not divide the 8 routed experts of a MoE layer" in " ".join(r.output.split()), r.output


def test_a_tensor_degree_that_does_not_split_the_sequence_is_refused_under_sequence_parallelism(tmp_path):
    """--tp 8 on 2,047 tokens had planned with sequence parallelism, validated, and gone out as a Megatron command
    line its own check refuses (QA of 2026-12-07)."""
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--cluster", "dgx-a100", "--devices", "8",
                            "--global-batch", "8", "--seq-len", "510", "--tp", "4"])
    assert r.exit_code == 2, r.output
    assert "--tp 4: sequence parallelism splits each sequence over the tensor ranks, and 510 tokens do not split " \
           "into 4" in " ".join(r.output.split())
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "gpt", "--layers", "2", "--cluster", "dgx-a100", "--devices", "8",
                            "--global-batch", "8", "--seq-len", "512", "--tp", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    out.write_text(out.read_text().replace("seq_len: 512", "seq_len: 510"))
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code != 0 and "510 tokens do not split into 4" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize(("args", "words"), [
    (["plan", "--devices", "0"], "--devices 0: a device count is at least 1"),
    (["plan", "--seq-len", str(2**40)], "give a smaller --seq-len"),
    (["estimate", "--dp", "8", "--dim", "foo=3"], "use --seq-len or the architecture options"),
    (["estimate", "--dp", "8", "--stage-layers", "1,1"], "stage_layers gives 2 layer counts, one a pipeline chunk, "
                                                        "but pp x vpp = 1; give --pp (and --vpp) whose product is 2"),
    (["estimate", "--dp", "8", "--recompute", "selective", "--full-recompute-layers", "50"],
     "--full-recompute-layers 50: a pipeline chunk here holds at most 2 layers; give at most 2"),
    # QA of 2026-12-07: taken and ignored in training, or printed as offloaded
    (["plan", "--kv-dtype", "int8"], "--kv-dtype describes serving; add --mode infer, or drop it to plan training"),
    (["estimate", "--dp", "8", "--offload", "kv_cache=0.5"], "--offload kv_cache: a training step keeps no KV cache"),
])
def test_a_refusal_names_what_to_change(args, words):
    """The QA round's messages: a device count of 0 had been explained by the largest network, a sequence of 2^40
    tokens answered with a smaller --global-batch, --dim on a zoo model pointed at a --batch estimate has not, a
    count of --stage-layers that pp x vpp does not take said nothing of --pp, and more fully recomputed layers than
    a chunk holds were taken."""
    base = dict(zip(["--cluster", "--devices", "--global-batch", "--seq-len"], ["dgx-a100", "8", "8", "512"]))
    given = dict(zip(args[1::2], args[2::2]))
    flags = [x for k, v in ({**base, **given}).items() for x in (k, v)]
    r = runner.invoke(app, [args[0], "gpt", "--layers", "2", *flags])
    assert r.exit_code == 2, r.output
    assert words in " ".join(r.output.split()) and "no network joins" not in r.output
