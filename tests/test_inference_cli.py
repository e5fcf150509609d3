"""`hyperplan plan --mode infer` and `hyperplan whatif --mode infer`: the report, the switches, the errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from planner.api import plan_inference
from planner.errors import InvalidInput

runner = CliRunner()
SMALL = ["deepseek-v3", "--layers", "4", "--cluster", "cloudmatrix384", "--devices", "32", "--mode", "infer",
         "--prompt-len", "2048", "--gen-len", "512", "--dtype", "int8"]


def run(*args: str, width: int = 200):
    return runner.invoke(app, ["plan", *args], terminal_width=width)


@pytest.fixture(scope="module")
def planned():
    r = run(*SMALL, "--ttft-ms", "1500", "--tpot-ms", "40", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_json_carries_both_phases_and_their_figures(planned):
    p = planned
    assert p["mode"] == "infer" and p["serving"] in ("disaggregated", "co-located")
    assert p["prefill_tokens_per_s_per_device"] == p["prefill"]["tokens_per_s_per_device"] > 0
    assert p["decode_tokens_per_s_per_device"] == p["decode"]["tokens_per_s_per_device"] > 0
    assert p["prefill"]["ttft_ms"] <= 1500 and p["decode"]["tpot_ms"] <= 40
    for ph in (p["prefill"], p["decode"]):
        assert ph["limiter"] in ("compute", "hbm_bandwidth", "communication")
        assert sum(ph["breakdown_ms"].values()) == pytest.approx(ph["stage_ms"])
        assert ph["memory_gib"]["total"] <= ph["usable_hbm_gib"]
        assert ph["strategy"]["tp"] * ph["strategy"]["dp"] * ph["strategy"]["pp"] == ph["devices"]
    assert p["decode"]["kv_cache_gib"] > 0 and p["kv_cache"]["latent"]
    if p["serving"] == "disaggregated":
        assert p["prefill"]["devices"] + p["decode"]["devices"] == 32
    rate = min(p["prefill"]["tokens_per_s_per_device"] * p["prefill"]["devices"] / 2048,
               p["decode"]["tokens_per_s_per_device"] * p["decode"]["devices"] / 512)
    if p["serving"] == "disaggregated":
        assert p["requests_per_s"] == pytest.approx(rate)


def test_the_plan_says_how_far_off_serving_estimates_on_its_hardware_may_be(planned):
    """No deployment on the CloudMatrix384 is compared: the plan says so, in --json and in its report."""
    assert planned["accuracy"]["category"] == "serving" and planned["accuracy"]["deployments"] == 0
    assert "unchecked" in planned["accuracy"]["sentence"]
    r = run(*SMALL, "--batch", "8")
    assert "checked: no published serving deployment on cloudmatrix384 is compared" in r.output


def test_same_inputs_same_bytes(planned):
    again = run(*SMALL, "--ttft-ms", "1500", "--tpot-ms", "40", "--json")
    assert json.loads(again.output) == planned


def test_tables_name_the_phases_and_the_limiter():
    r = run(*SMALL, "--batch", "8")
    assert r.exit_code == 0, r.output
    assert "prefill" in r.output and "decode" in r.output and "limited by" in r.output
    assert "tokens/s per device" in r.output


def test_no_mpmd_co_locates_and_a_fixed_batch_is_kept():
    p = plan_inference("deepseek-v3", overrides={"layers": 4}, cluster="cloudmatrix384", devices=16, prompt_len=2048,
                       gen_len=512, batch=4, dtype="int8", disaggregate=False)
    assert p["serving"] == "co-located" and p["prefill"]["devices"] == p["decode"]["devices"] == 16
    assert p["prefill"]["batch_per_replica"] == p["decode"]["batch_per_replica"] == 4


def test_tighter_tpot_means_smaller_decode_batches():
    kw = dict(overrides={"layers": 4}, cluster="cloudmatrix384", devices=16, prompt_len=2048, gen_len=512,
              dtype="int8", disaggregate=False)
    loose = plan_inference("deepseek-v3", ttft_ms=5000, tpot_ms=80, **kw)
    tight = plan_inference("deepseek-v3", ttft_ms=5000, tpot_ms=15, **kw)
    assert tight["decode"]["tpot_ms"] <= 15 < loose["decode"]["tpot_ms"] <= 80
    assert tight["decode_tokens_per_s_per_device"] < loose["decode_tokens_per_s_per_device"]


@pytest.mark.parametrize("args, words", [
    (["--mode", "infer", "--cluster", "dgx-h100", "--gen-len", "8", "--batch", "1"], "needs --prompt-len"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "8", "--gen-len", "8"], "needs --batch, or"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "8", "--gen-len", "8", "--batch", "2",
      "--tpot-ms", "20"], "not both"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "8", "--gen-len", "8", "--batch", "2", "-o",
      "p.txt"], "use a .yaml, .yml or .json file name"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "8", "--gen-len", "8", "--batch", "2",
      "--global-batch", "4"], "describe a training step"),
    (["--mode", "infer", "--cluster", "cloudmatrix384", "--prompt-len", "8", "--gen-len", "8", "--batch", "2",
      "--dtype", "fp8"], "lists no fp8 peak"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "0", "--gen-len", "8", "--batch", "2"],
     "--prompt-len 0: a prompt's length (tokens) is at least 1"),
    (["--mode", "infer", "--cluster", "dgx-h100", "--prompt-len", "8", "--gen-len", "8", "--tpot-ms", "-1"],
     "--tpot-ms -1.0: a latency target in milliseconds must be a finite number above 0"),
    (["--mode", "serve", "--cluster", "dgx-h100", "--global-batch", "8", "--seq-len", "8"], "use train or infer"),
    (["--cluster", "dgx-h100", "--seq-len", "8"], "--global-batch is needed to plan training"),
    (["--cluster", "dgx-h100", "--prompt-len", "8"], "add --mode infer"),
])
def test_bad_input_is_one_sentence_and_exit_2(args, words):
    r = run("llama3-8b", "--layers", "2", *args)
    assert r.exit_code == 2 and words in r.output, r.output
    assert "Traceback" not in r.output


def test_a_model_too_big_for_the_devices_says_how_much():
    r = run("llama3-405b", "--cluster", "dgx-h100", "--devices", "1", "--mode", "infer", "--prompt-len", "128",
            "--gen-len", "16", "--batch", "1")
    assert r.exit_code == 3 and "GiB per device" in r.output and "add devices" in r.output


def test_whatif_sweeps_device_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("HYPERPLAN_CACHE", str(tmp_path))
    args = ["whatif", "deepseek-v3", "--layers", "4", "--mode", "infer", "--cluster", "cloudmatrix384", "--devices",
            "8,16", "--prompt-len", "2048", "--gen-len", "512", "--batch", "4", "--dtype", "int8", "--workers", "1",
            "--json", "--csv", str(tmp_path / "s.csv")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    pts = doc["points"]
    assert [p["devices"] for p in pts] == [8, 16] and {p["status"] for p in pts} == {"ok"}
    assert all(p["decode_tokens_per_s_per_device"] > 0 and p["prefill_tokens_per_s_per_device"] > 0 for p in pts)
    assert pts[0]["scaling_efficiency"] == 1.0
    assert (tmp_path / "s.csv").read_text().startswith("cluster,devices,status,serving")
    cached = runner.invoke(app, [*args, "--force"])  # --force: the CSV of the first run is there
    assert json.loads(cached.stdout) == doc  # the second run reads the cache and prints the same


def test_training_whatif_still_needs_its_flags():
    r = runner.invoke(app, ["whatif", "gpt", "--cluster", "dgx-h100", "--devices", "8", "--seq-len", "64"])
    assert r.exit_code == 2 and "--global-batch is needed for a training sweep" in r.output


def test_api_refuses_batch_with_targets():
    with pytest.raises(InvalidInput, match="not both"):
        plan_inference("llama3-8b", cluster="dgx-h100", prompt_len=8, gen_len=8, batch=2, ttft_ms=100)


def test_a_serving_plan_says_what_its_hardware_figures_assume():
    kw = dict(devices=8, prompt_len=1024, gen_len=128, batch=4)
    b200 = plan_inference("llama3-8b", cluster="dgx-b200", **kw)["notes"]
    assert any(n.startswith("dgx-b200: matmul_plateau, memory_plateau, kernel_overhead_us not fitted") for n in b200)
    assert any(n.startswith("dgx-b200's cudnn figures stand in for the serving engine's") for n in b200)
    assert any("flash attention efficiency (cudnn): GB200's measured" in n for n in b200)
    h100 = plan_inference("llama3-8b", cluster="dgx-h100", **kw)["notes"]
    assert not any("flash attention" in n or "stand in" in n for n in h100)  # FlashAttention-3 on H100: measured
    cm = plan_inference("llama3-8b", cluster="cloudmatrix384", **kw)["notes"]
    assert any("transferred from the ascend-910b fit" in n for n in cm)
    assert not any("head dim" in n for n in b200 + cm)  # Llama's heads are 128 wide
    oss = plan_inference("gpt-oss-20b", cluster="gb200-nvl72", **kw)["notes"]
    assert any(n.startswith("gb200-nvl72's flash attention at head dim 64: the head-dim law") for n in oss)


def test_co_located_decode_takes_the_largest_batch_that_meets_the_tpot_target():
    """The time per token a request sees, a decode step's latency over decode's share of the devices' time, grows
    with the batch; the plan's batch meets --tpot-ms and one more sequence would not."""
    from cost_models import load_cluster
    from planner.inference.phase_cost import StepModel
    from planner.inference.plan import co_located, plan_serving
    from planner.inference.search import phase_plan
    from planner.inference.serve import load_profile, serving_options
    from planner.search.program_groups import group_cluster

    hw, profile = load_cluster("dgx-h100", devices=8), load_profile("llama3-8b")
    serving = serving_options(prompt_len=1024, gen_len=128, batch=None, ttft_ms=2000, tpot_ms=15, dtype="bf16",
                              kv_dtype="bf16", offload=False)
    plan, _ = plan_serving(profile, hw, serving, disaggregate=False)
    dec = plan.decode
    model = StepModel(profile, group_cluster(hw, 8), dec.layout, serving.precision)

    def seen(batch: int) -> float:
        d = phase_plan(model, serving, "decode", batch, dec.kv_offload)
        return d.latency_s / co_located(plan.prefill, d, serving, 8).decode_share

    assert seen(dec.batch) <= 0.015 < seen(dec.batch + 1)


def test_co_located_decode_keeps_its_cache_beside_a_prefill():
    """Co-located, a prefill runs while decode's cache stays resident: the plan had checked each phase alone, and a
    Qwen3-30B prefill filling 71.9 of 72 GiB sat beside a decode cache of 18 GiB (QA of 2026-12-07). The plan's
    prefill memory and decode cache now fit together, and one more decode sequence would not, or the TPOT stops it."""
    from cost_models import load_cluster
    from planner.inference.phase_cost import StepModel
    from planner.inference.plan import co_located, plan_serving
    from planner.inference.search import phase_plan
    from planner.inference.serve import load_profile, serving_options
    from planner.search.program_groups import group_cluster

    hw = load_cluster("dgx-h100", devices=16)
    profile = load_profile("qwen3-30b-a3b", overrides={"layers": 4})
    serving = serving_options(prompt_len=1024, gen_len=512, batch=None, ttft_ms=500, tpot_ms=20, dtype="fp8",
                              kv_dtype="fp8", offload=False)
    plan, _ = plan_serving(profile, hw, serving, disaggregate=False)
    pre, dec = plan.prefill, plan.decode
    usable = pre.step.usable_bytes
    assert pre.memory_bytes["total"] + dec.memory_bytes["kv_cache"] <= usable
    model = StepModel(profile, group_cluster(hw, 16), dec.layout, serving.precision)
    more = phase_plan(model, serving, "decode", dec.batch + 1, dec.kv_offload)
    assert (pre.memory_bytes["total"] + more.memory_bytes["kv_cache"] > usable
            or more.latency_s / co_located(pre, more, serving, 16).decode_share > 0.020)


def test_a_fixed_batch_co_located_keeps_decodes_cache_beside_a_prefill_too():
    """With --batch (no latency targets) the co-located plan had skipped the test above: at batch 240 of 8K-token
    prompts a Qwen3-30B prefill and decode's cache needed 72.7 GiB of 72 together. Now batch 232 fits together and
    240 is refused, saying which memory binds."""
    from cost_models import load_cluster
    from planner.errors import Infeasible
    from planner.inference.plan import plan_serving
    from planner.inference.serve import load_profile, serving_options

    hw = load_cluster("dgx-h100", devices=16)
    profile = load_profile("qwen3-30b-a3b", overrides={"layers": 4})

    def at(batch: int):
        serving = serving_options(prompt_len=8192, gen_len=512, batch=batch, ttft_ms=None, tpot_ms=None,
                                  dtype="fp8", kv_dtype="fp8", offload=False)
        return plan_serving(profile, hw, serving, disaggregate=False)[0]

    plan = at(232)
    assert plan.prefill.memory_bytes["total"] + plan.decode.memory_bytes["kv_cache"] <= plan.prefill.step.usable_bytes
    with pytest.raises(Infeasible, match=r"--batch 240 does not fit on 16 devices of dgx-h100: even on .* a prefill "
                                         r"beside decode's cache \(co-located\) needs 72.7 GiB per device"):
        at(240)


def test_a_hardware_file_without_attention_figures_is_refused_for_serving(tmp_path):
    from cost_models.loader import PRESET_DIR

    text = (PRESET_DIR / "dgx-a100.toml").read_text(encoding="utf-8")
    hw = tmp_path / "a100-no-attention.toml"
    hw.write_text("\n".join(l for l in text.splitlines() if not l.startswith("attention")) + "\n", encoding="utf-8")
    r = run("llama3-8b", "--mode", "infer", "--cluster", str(hw), "--devices", "8", "--prompt-len", "512",
            "--gen-len", "64", "--batch", "2")
    assert r.exit_code == 2 and "lists no flash-attention efficiency" in r.output and "Traceback" not in r.output
