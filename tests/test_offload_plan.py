"""HyperOffload in the search: it makes models fit, a faster host link gets more offloaded, and it can be turned off."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models import load_cluster
from planner.api import load_graph, plan_model
from planner.errors import Infeasible
from planner.graph.blocks import discover_blocks
from planner.search.plan_search import search
from planner.strategy import Workload

W = Workload(global_batch=64, seq_len=4096)


@pytest.fixture(scope="module")
def llama20():
    """40 layers of Llama-3-70B on 16 CloudMatrix384 NPUs at 4096 tokens: tight enough that offloading pays."""
    g = load_graph("llama3-70b", batch=1, seq_len=4096, overrides=dict(layers=40))
    return g, discover_blocks(g)


def _offloaded_gib(c) -> float:
    return sum(v for k, v in c.memory_bytes.items() if k.startswith("offloaded_")) / 2**30


def _pcie_host(cluster):
    """The same supernode with its pooled DRAM replaced by a PCIe-attached host (16 GB/s per device)."""
    tier = cluster.memory_tiers[0]
    host = dataclasses.replace(tier, name="host", bandwidth_bytes_per_s=16e9, pooled=False, link="PCIe Gen4 x16")
    return dataclasses.replace(cluster, memory_tiers=(host,))


def test_a_faster_host_link_gets_more_offloaded(llama20):
    g, st = llama20
    pooled = load_cluster("cloudmatrix384", devices=16)
    fast = search(g, st, pooled, W)
    slow = search(g, st, _pcie_host(pooled), W)
    assert fast.best and slow.best
    assert _offloaded_gib(fast.best) > _offloaded_gib(slow.best)
    # and the offload pays: the pooled tier's plan is at least as fast as the PCIe one
    assert fast.best.step_s <= slow.best.step_s


def test_no_offload_reproduces_the_plain_search(llama20):
    g, st = llama20
    pcie = _pcie_host(load_cluster("cloudmatrix384", devices=16))
    plain = search(g, st, pcie, W, allow_offload=False)
    assert plain.best is not None and not any(f for _, f in plain.best.strategy.offload)
    assert _offloaded_gib(plain.best) == 0


def test_offload_makes_a_model_fit_and_its_traffic_is_costed():
    """10 layers of Llama-3-70B (9.6 B parameters, ~160 GiB of training states) on one 128 GiB NPU: nothing
    fits in HBM, so the search without offload prunes nothing (one mesh keeps that search short)."""
    kw = dict(cluster="cloudmatrix384", devices=1, global_batch=8, seq_len=4096, overrides=dict(layers=10),
              time_limit_s=None)
    with pytest.raises(Infeasible):
        plan_model("llama3-70b", offload=False, **kw)
    r = plan_model("llama3-70b", **kw)
    est = r["estimate"]
    assert est["fits"]
    moved = {k: v for k, v in est["memory_gib"].items() if k.startswith("offloaded_")}
    assert moved and sum(moved.values()) > 0
    assert r["strategy"]["offload"]
    # the optimizer update runs where its states live: its host traffic is on the critical path
    if r["strategy"]["offload"].get("optimizer"):
        assert est["breakdown_s"]["offload"] > 0
