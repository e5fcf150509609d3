"""Published serving deployments (tests/data/serving_deployments.json) against the estimate at their configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import load_cluster
from planner.inference.phase_cost import Precision
from planner.inference.search import Serving, best_phase
from planner.inference.serve import load_profile
from planner.inference.validation import estimate_row, load_rows

DATA = Path(__file__).parent / "data" / "serving_deployments.json"
DOC, CLUSTERS = load_rows(DATA)
ROWS = {r["id"]: r for r in DOC["rows"]}


def test_every_row_is_sourced_and_uncompared_rows_say_why():
    assert len(ROWS) >= 5 and sum(r["compared"] for r in ROWS.values()) >= 4
    for r in ROWS.values():
        assert r["source"] and r["measured_tokens_per_s_per_device"] > 0
        assert r["compared"] or r["why_not_compared"]
        assert r["layout"]["tp"] * r["layout"]["dp"] * r["layout"]["pp"] == r["devices"]
    assert {r["phase"] for r in ROWS.values() if r["compared"]} == {"prefill", "decode"}


@pytest.mark.parametrize("row_id", sorted(i for i, r in ROWS.items() if r["compared"]))
def test_published_throughput_within_tolerance(row_id):
    got = estimate_row(ROWS[row_id], CLUSTERS)
    assert got["fits"], f"{row_id} does not fit in memory at its published configuration"
    assert abs(got["error"]) <= DOC["tolerance"], (
        f"{row_id}: estimate {got['estimate']:.0f} tokens/s per device, measured {got['measured']:.0f} "
        f"({got['error']:+.1%})")


def test_the_search_finds_at_least_the_published_layout():
    row = ROWS["sglang-decode-h100"]
    profile = load_profile(row["model"])
    serving = Serving(prompt_len=row["context"], gen_len=1, batch=row["batch"], precision=Precision(dtype="fp8"),
                      even_experts=False)  # EP72 over 256 experts: SGLang's redundant experts, uneven for the planner
    found = best_phase(profile, load_cluster(row["cluster"]), serving, "decode", row["devices"])
    assert found.tokens_per_s_per_device >= 0.99 * estimate_row(row, CLUSTERS)["estimate"]


def test_an_inline_cluster_shares_a_presets_efficiency_by_name(tmp_path):
    h800 = CLUSTERS["hgx-h800"]
    h100 = load_cluster("dgx-h100")
    assert h800.matmul_plateau == h100.matmul_plateau and h800.attention_plateaus == h100.attention_plateaus
    doc = {"clusters": {"x": {**json.loads(DATA.read_text())["clusters"]["hgx-h800"], "efficiency": "dgx-h99"}}}
    bad = tmp_path / "rows.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="names 'dgx-h99', not a preset"):
        load_rows(bad)
