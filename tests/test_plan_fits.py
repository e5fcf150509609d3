"""A plan fits by its own estimate: where the search's scoring (layouts solved once per tensor-axis size and
reused) and the plan's own solve disagree on memory, the plan is the next mesh's best whose estimate fits."""

from __future__ import annotations

import dataclasses

import pytest

import planner.costing.estimate as estimate_module
from planner.api import plan_model

JOB = dict(cluster="dgx-h100", devices=8, global_batch=32, seq_len=1024,
           overrides=dict(layers=4, hidden=512, heads=8, kv_heads=4, vocab=32000))


@pytest.fixture(scope="module")
def free():
    return plan_model("llama3-8b", **JOB)


def test_a_plan_whose_own_estimate_does_not_fit_gives_way_to_the_next_that_does(free, monkeypatch):
    real = estimate_module.estimate
    best = free["strategy"]["summary"]

    def estimate(graph, structure, cluster, workload, strategy, **kw):
        est = real(graph, structure, cluster, workload, strategy, **kw)
        if strategy.short() == best:  # as if its own solve needed more memory than the search's scoring
            return dataclasses.replace(est, fits=False)
        return est

    monkeypatch.setattr(estimate_module, "estimate", estimate)
    out = plan_model("llama3-8b", **JOB)
    assert out["strategy"]["summary"] != best and out["estimate"]["fits"]
    assert out["estimate"]["step_time_s"] >= free["estimate"]["step_time_s"]
    assert all(r["summary"] != best for r in out["runners_up"])  # not offered as a faster runner-up


def test_a_plan_that_fits_is_the_searchs_best(free):
    assert free["estimate"]["fits"]
