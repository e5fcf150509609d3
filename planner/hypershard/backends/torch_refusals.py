"""What the torch export cannot run, said in one sentence before anything is written.

Each rule names the first parameter (or degree) of the first program that breaks it and what to do
instead. The torch backend's `plan --backend torch` limits (`PLAN_LIMITS`) keep the planner's own plans
inside these rules; a hand-edited or foreign declaration can still break them.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.graph.onnx_folded import FOLDED_NAME
from planner.hypershard.backends import common
from planner.hypershard.layouts import dim_axes
from planner.hypershard.pins import REPLICATED, tp_layout
from planner.hypershard.programs import rank_label, views

_ELSEWHERE = "export with --backend jax, mindspore or hyper-parallel"


def stacked_experts(doc: Mapping[str, Any]) -> list[str]:
    """The declared stacked expert weights [experts, ...] (3-D linears)."""
    return [p for p, e in doc["layouts"]["params"].items() if len(e["dims"]) == 3 and e.get("op") == "linear"]


def check(doc: Mapping[str, Any]) -> None:
    """InvalidInput, in one sentence, for the first thing of `doc` the torch export cannot run."""
    multi = common.grouped(doc)
    for k, v in enumerate(views(doc)):
        where = rank_label(doc, k)
        sizes = common.axis_sizes(v)
        ep, tp, cp = sizes.get("ep", 1), sizes.get("tp", 1), sizes.get("cp", 1)
        params = v["layouts"]["params"]
        stacked = stacked_experts(v)
        renamed = [p for p, e in params.items() if len(e["dims"]) == 3 and FOLDED_NAME.fullmatch(p)]
        if ep > 1 and renamed:  # the module applies layouts by the model's own names, which these are not
            raise InvalidInput(f"the torch backend places a MoE layer's stacked expert weights by their module's "
                               f"names, and the exporter renamed {renamed[0]} (in {where}); plan from the model's "
                               f"config.json, or {_ELSEWHERE}")
        if ep > 1 and (multi or cp > 1 or tp > 1):
            what = "several programs" if multi else f"cp {cp}" if cp > 1 else f"tp {tp}, so it spans tensor ranks"
            raise InvalidInput(f"the torch backend runs expert parallelism over the data-parallel ranks of one "
                               f"program only (ep {ep} with {what} in {where}); plan with --backend torch, or "
                               f"{_ELSEWHERE}")
        owners = {p.rsplit(".", 1)[0] for p in stacked}  # a stacked module's per-expert biases are its own
        per_expert = [p for p, e in params.items() if len(e["dims"]) != 3 and p.rsplit(".", 1)[0] not in owners
                      and any("ep" in dim_axes(d) for d in e["dims"])]
        if per_expert:
            raise InvalidInput(f"the torch backend splits stacked expert weights [experts, ...] over ep, and "
                               f"{per_expert[0]} (in {where}) is one expert's own weight; export a model whose "
                               f"experts are stacked (Hugging Face experts modules), or {_ELSEWHERE}")
        transposed = [p for p, e in params.items() if e.get("op") == "linear" and len(e["dims"]) == 2
                      and tp_layout(e["dims"]) not in (REPLICATED, 1 if e.get("output_partial") else 0)]
        if transposed:
            raise InvalidInput(f"the torch backend splits linear weights stored [out, in] (nn.Linear), and "
                               f"{transposed[0]} (in {where}) is split as an [in, out] one (GPT-2's Conv1D), which "
                               f"no torch style splits; plan with --tp 1, or {_ELSEWHERE}")
        split = [p for p in stacked if tp_layout(params[p]["dims"]) != REPLICATED]
        if stacked and (split or cp > 1 or (tp > 1 and not v["layouts"]["sequence_parallel"])):
            why = (f"{split[0]} is split over tp" if split else f"cp is {cp}" if cp > 1
                   else f"tp {tp} has no sequence parallelism")
            raise InvalidInput(f"the torch backend runs a MoE layer on each tensor rank's slice of the sequence "
                               f"with its experts whole (sequence parallel at tp > 1, etp 1, cp 1), and in {where} "
                               f"{why}; plan with --backend torch, or {_ELSEWHERE}")


__all__ = ["check", "stacked_experts"]
