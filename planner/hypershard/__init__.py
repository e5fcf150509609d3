"""HyperShard declarations: the plan as a file (YAML/JSON, with a JSON Schema), its validation, and exporters.

    document   build the declaration from a plan and its graph
    programs   one program of a declaration as a declaration of its own (HyperMPMD: a mesh per program)
    declared   read the strategies back from a declaration, and re-estimate it as planned
    pins       declared parameter layouts as pins of the intra-op problem: edits are scored
    stages     pipeline stages of different widths: each stage's tp, ranks and own mesh
    serving_*  serving plans (workload mode infer): prefill and decode programs, their layouts, read back and checked
    io         read/write by extension, schema check with one-sentence errors
    validate   schema, model tensors, cluster size, memory fit, re-estimate
    backends/  one exporter per execution framework (hyper-parallel, mindspore, torch, jax, onnx) and per launch
               config (megatron, torchtitan, deepspeed, mindformers; vllm, sglang for serving)

Vocabulary: "axis" is a device-mesh axis (tp, cp, dp, pp, ep); "dim" is a tensor dimension.
"""

from __future__ import annotations

from planner.hypershard.declare import declare, declare_plan, declare_programs
from planner.hypershard.declared import score_document, strategy_of
from planner.hypershard.document import FORMAT_VERSION, Request, build_document
from planner.hypershard.io import read_document, write_document
from planner.hypershard.serving_doc import declare_serving, declare_serving_phases

__all__ = ["FORMAT_VERSION", "Request", "build_document", "declare", "declare_plan", "declare_programs",
           "declare_serving", "declare_serving_phases", "read_document", "score_document", "strategy_of", "write_document"]
