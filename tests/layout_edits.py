"""A user's hand edit of a declaration, shared by the export tests and benchmarks/check_hyper_parallel.py."""

from __future__ import annotations

import copy


def megatron(doc: dict) -> dict:
    """Megatron-LM's layouts, as a user would write them: column-parallel in, row-parallel out, vocab split, norm
    weights whole.

    At hidden 64 the planner keeps most weights whole (splitting them does not pay), and hand-edited files are
    first-class. The estimate scores declared layouts, so the figures recorded for the planner's own layouts no
    longer hold: the edit drops them, and `validate` re-estimates the file as written."""
    doc = copy.deepcopy(doc)
    doc.pop("estimate", None)
    for name, entry in doc["layouts"]["params"].items():
        if entry["op"] == "scale":  # norm weights whole on every tensor rank
            entry["dims"] = [None] * len(entry["dims"])
            entry.pop("output_partial", None)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            entry.update(dims=[None, "tp"], output_partial=["tp"])
        elif entry["op"] in ("linear", "embedding"):
            entry["dims"] = ["tp", None]
            if entry["op"] == "embedding":
                entry["output_partial"] = ["tp"]
            else:  # column-parallel: each rank's output columns are whole, never a pending sum
                entry.pop("output_partial", None)
    return doc
