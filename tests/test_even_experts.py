"""Plans split routed experts evenly, as every backend does: a declared ep must divide each MoE layer's experts,
and the searches (training meshes, the attention | experts split, serving's layouts) only try such an ep; the
README's serving plan of DeepSeek-V3 on a whole CloudMatrix384 once spread 256 experts over 29 and 152 ranks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from planner.errors import Infeasible, InvalidInput
from planner.hypershard import declare
from planner.inference.search import layouts
from planner.inference.serve import load_profile, plan_inference
from planner.search.moe_programs import expert_group_sizes

MOE = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=64, experts=4, top_k=2)
DENSE = dict(layers=2, hidden=64, heads=4, kv_heads=4, vocab=128, ffn=64)
COMMON = dict(cluster="dgx-a100", global_batch=48, seq_len=32)


@pytest.mark.parametrize("ep, devices", [(8, 8), (3, 24)])
def test_a_declared_ep_that_does_not_divide_the_experts_is_one_sentence(ep, devices):
    with pytest.raises(InvalidInput) as err:
        declare("mixtral-8x7b", overrides=MOE, ep=ep, devices=devices, **COMMON)
    msg = str(err.value)
    assert msg == (f"--ep {ep} does not divide the 4 routed experts of a MoE layer, so its ranks would hold unequal "
                   "shares; use an ep that divides them (1, 2, 4)")
    assert msg.count(". ") == 0


def test_an_ep_that_divides_the_experts_is_declared_and_ep_on_a_dense_model_is_refused():
    doc = declare("mixtral-8x7b", overrides=MOE, ep=2, devices=8, **COMMON)
    assert [a["size"] for a in doc["meshes"][0]["aliases"] if a["name"] == "ep"] == [2]
    with pytest.raises(InvalidInput, match="--ep 2: the model has no routed experts"):
        declare("llama3-8b", overrides=DENSE, ep=2, devices=8, **COMMON)


def test_expert_groups_hold_an_equal_share_or_whole_replicas_of_the_experts():
    cm = load_cluster("cloudmatrix384")
    sizes = expert_group_sizes(cm, 256)
    assert sizes and all(256 % c == 0 or c % 256 == 0 for c in sizes)
    assert 128 in sizes and not {24, 40, 152} & set(sizes)  # whole fabric groups that split 256 unevenly are out


def test_serving_layouts_of_a_moe_model_split_its_experts_evenly():
    profile = load_profile("mixtral-8x7b")
    cm = load_cluster("cloudmatrix384")
    lays = layouts(profile, cm, 64)
    assert lays and all(8 % lay.ep == 0 and lay.ep == lay.tp * lay.dp for lay in lays)
    assert layouts(profile, cm, 40) == []  # 40 = 5 x 8: no stage of 1, 2, 4 or 8 pipeline steps divides 8 experts
    assert {(lay.tp, lay.dp, lay.pp) for lay in layouts(load_profile("llama3-8b"), cm, 40)} >= {(1, 40, 1)}


@pytest.mark.slow
def test_the_readme_serving_plan_spreads_experts_evenly():
    r = plan_inference("deepseek-v3", cluster="cloudmatrix384", prompt_len=4096, gen_len=1024, ttft_ms=2000,
                       tpot_ms=50, dtype="int8")
    for phase in ("prefill", "decode"):
        s = r[phase]["strategy"]
        assert 256 % s["ep"] == 0 and s["ep"] == s["tp"] * s["dp"], (phase, s)
    assert r["prefill"]["devices"] + r["decode"]["devices"] == 384


ON_40 = ["mixtral-8x7b", "--mode", "infer", "--cluster", "cloudmatrix384", "--devices", "40", "--prompt-len", "512",
         "--gen-len", "128", "--batch", "1", "--no-mpmd"]


def test_co_located_serving_with_no_even_layout_says_why_and_uneven_ranges_are_asked_for():
    with pytest.raises(Infeasible) as err:
        plan_inference("mixtral-8x7b", cluster="cloudmatrix384", devices=40, prompt_len=512, gen_len=128, batch=1,
                       disaggregate=False)
    assert str(err.value) == ("no layout of mixtral-8x7b on 40 devices splits its 8 routed experts evenly: a pipeline "
                              "stage's tp x dp devices must divide them, with pp 1, 2, 4 or 8; pick a device count "
                              "that is such a stage times pp, or allow uneven expert ranges (--uneven-experts)")
    refused = CliRunner().invoke(app, ["plan", *ON_40, "--json"], terminal_width=200)
    assert refused.exit_code != 0 and "--uneven-experts" in refused.output
    r = CliRunner().invoke(app, ["plan", *ON_40, "--uneven-experts", "--json"], terminal_width=200)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)["decode"]["strategy"]
    assert 8 % s["ep"] and s["ep"] == s["tp"] * s["dp"]  # experts over the whole stage, in uneven ranges
