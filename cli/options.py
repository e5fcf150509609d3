"""Options shared by every command that reads a model: MODEL, --batch, --seq-len, --dim (the architecture
overrides are `cli.arch_options`).

Defined once so `inspect`, `plan`, `estimate` spell and document them alike.
Parsing `--dim name=value` happens here (it is CLI syntax); the library
validates the values.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.errors import InvalidInput

Model = Annotated[str, typer.Argument(help="An ONNX file, a Hugging Face config.json (or the folder holding it), "
                                      "or a zoo model name (`hyperplan zoo list`).", show_default=False)]
Batch = Annotated[Optional[int], typer.Option("--batch", help="Batch size: binds batch-like symbolic dims.")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length: binds sequence-like dims.")]
Dim = Annotated[Optional[list[str]], typer.Option("--dim", metavar="NAME=VALUE",
                                                  help="Bind a symbolic dimension by name (repeatable).")]


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """`['batch=8', 'seq=4096']` -> {'batch': 8, 'seq': 4096}; one-sentence error for a malformed item."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise InvalidInput(f"--dim {item!r} is not NAME=VALUE; write it like --dim seq=4096")
        try:
            number = int(value)
        except ValueError:
            raise InvalidInput(f"--dim {name}={value!r}: the value must be an integer, like --dim {name}=4096") \
                from None
        if name in out and out[name] != number:
            raise InvalidInput(f"--dim {name} is given twice ({out[name]} and {number}); keep one")
        out[name] = number
    return out


# -- options of the commands that cost a model on a cluster (estimate, plan, whatif) ---------------
Cluster = Annotated[str, typer.Option("--cluster", help="A hardware preset (`hyperplan hardware list`) or a .toml file.",
                                      show_default=False)]
Devices = Annotated[Optional[int], typer.Option("--devices", help="Devices to use; scales the preset by nodes or "
                                                "supernodes (default: the preset's size, or what the degrees need).")]
GlobalBatch = Annotated[int, typer.Option("--global-batch", help="Sequences per training step.", show_default=False)]
RequiredSeqLen = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.", show_default=False)]
Dtype = Annotated[str, typer.Option("--dtype", help="Compute precision: bf16, fp16, fp8 or fp32 to train (fp8: the "
                                     "stack's FP8 recipe); bf16, fp16, fp8 or int8 weights to serve.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
Force = Annotated[bool, typer.Option("--force", help="Replace an output file that already exists (an input of the "
                                     "command is never replaced).")]
Stack = Annotated[Optional[str], typer.Option(
    "--stack", help="The software stack that runs the training step: megatron-core (today's Megatron-Core / NeMo, "
                    "the default), megatron-core-2024, megatron-2021, torchtitan, automodel, mindspeed, deepspeed, or "
                    "a stack .toml file (kernels, overlaps, FP8 recipe, optimizer states; see planner/costing/stacks).",
    show_default=False)]
StrictOps = Annotated[bool, typer.Option(
    "--strict-ops", help="Refuse a graph with ops that have no FLOP rule (custom-domain or unknown ops), instead of "
                         "costing them by the bytes they move (the default; the output says how much of the graph "
                         "that is).")]
