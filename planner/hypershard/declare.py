"""Declarations of strategies chosen by hand or by `plan`: each scored on the model and cluster it names, then
written as the document `plan -o` writes (`planner.hypershard.document.build_document`)."""

from __future__ import annotations

from typing import Any, Mapping

from planner.costing.execution import load_execution
from planner.hypershard.declared import score, score_split
from planner.hypershard.document import Request, build_document
from planner.strategy import Strategy, Workload


def declare(model: str, *, cluster: str, global_batch: int, seq_len: int, devices: int, dtype: str = "bf16",
            mode: str = "train", overrides: Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None,
            memory_gib: float | None = None, stack: str | None = None, **strategy: Any) -> dict[str, Any]:
    """Score one given strategy and declare it: the document `plan -o` writes, for a strategy you chose
    (`stage_tp=(4, 8)` with tp=8, pp=2 gives stages of different widths), run by `stack` (default: the default)."""
    _default_dp(strategy, devices)
    request = Request(model=model, cluster=cluster, overrides=dict(overrides or {}), dims=dict(dims or {}),
                      memory_gib=memory_gib)
    wl = Workload(mode=mode, global_batch=global_batch, seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]
                  execution=load_execution(stack))
    sc = score(request, wl, Strategy(**strategy), devices)
    return build_document(sc.plan, sc.graph, sc.structure, request)


def _default_dp(kw: dict[str, Any], devices: int) -> None:
    """dp, when not given, is what the devices leave beside the tensor (per stage), pipeline and context ranks."""
    widths = tuple(kw.get("stage_tp") or ())
    inner = (sum(widths) if widths else kw.get("tp", 1) * kw.get("pp", 1)) * kw.get("cp", 1)
    kw.setdefault("dp", max(1, devices // inner))


def declare_programs(model: str, *, cluster: str, global_batch: int, seq_len: int,
                     programs: list[Mapping[str, Any]], dtype: str = "bf16", mode: str = "train",
                     overrides: Mapping[str, Any] | None = None, dims: Mapping[str, int] | None = None,
                     memory_gib: float | None = None) -> dict[str, Any]:
    """Score given strategies for the model's programs and declare them: the document `plan -o` writes when
    HyperMPMD wins, for a split you chose.

    `programs` follows `mpmd.split_programs` (encoders first, then the backbone): each a dict of `devices` and
    Strategy fields (dp defaults to what the devices leave); the groups take consecutive ranks from 0.
    """
    request = Request(model=model, cluster=cluster, overrides=dict(overrides or {}), dims=dict(dims or {}),
                      memory_gib=memory_gib)
    wl = Workload(mode=mode, global_batch=global_batch, seq_len=seq_len, dtype=dtype)  # type: ignore[arg-type]
    ranks, strategies, first = [], [], 0
    for given in programs:
        kw = dict(given)
        n = int(kw.pop("devices"))
        _default_dp(kw, n)
        ranks.append((first, n))
        strategies.append(Strategy(**kw))
        first += n
    sc = score_split(request, wl, first, ranks, strategies, None, None)
    return build_document(sc.plan, sc.graph, sc.structure, request)


def declare_plan(plan: Mapping[str, Any], request: Request) -> dict[str, Any]:
    """The declaration of a `plan_model` result, on the graph it was planned on (remembered for the process, so
    `plan -o` does not import the model twice); several programs when HyperMPMD won."""
    from planner.api import _graph_for_costing
    from planner.graph.blocks import discover_blocks

    graph = _graph_for_costing(request.model, plan["workload"]["seq_len"], dict(request.dims) or None,
                               request.overrides)
    return build_document(plan, graph, discover_blocks(graph), request)


__all__ = ["declare", "declare_plan", "declare_programs"]
