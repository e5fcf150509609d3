"""HyperShard declarations: the plan as a file (YAML/JSON, with a JSON Schema), its validation, and exporters.

    document   build the declaration from a plan and its graph
    declared   read the strategy back from a declaration, and re-estimate it
    io         read/write by extension, schema check with one-sentence errors
    validate   schema, model tensors, cluster size, memory fit, re-estimate
    backends/  one exporter per execution framework (hyper-parallel, mindspore, torch, jax, onnx)

Vocabulary: "axis" is a device-mesh axis (tp, cp, dp, pp, ep); "dim" is a tensor dimension.
"""

from __future__ import annotations

from planner.hypershard.declared import declare, declare_plan, score_document, strategy_of
from planner.hypershard.document import FORMAT_VERSION, Request, build_document
from planner.hypershard.io import read_document, write_document

__all__ = ["FORMAT_VERSION", "Request", "build_document", "declare", "declare_plan", "read_document",
           "score_document", "strategy_of", "write_document"]
