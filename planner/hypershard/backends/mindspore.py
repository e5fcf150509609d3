"""Exporter to MindSpore static graph: a `Layout` per parameter and input, `shard`, and the pipeline config.

MindSpore's `Layout(device_matrix, alias_name)` is the declaration's
notation (axes slowest first, "None" for a whole dim, a tuple for a dim
split over several axes). The device matrix of one pipeline stage excludes
pp; stages are `pipeline_stage` marks on cells and `AutoParallel.pipeline`.
The Cell method `net.shard(in_strategy, parameter_plan=...)` takes the
input layouts and the parameter plan and keeps the Cell (the function
`mindspore.parallel.shard` would return a function in its place), and
sharding propagation fills in the other ops. ZeRO maps to
`AutoParallel.hsdp` (optimizer_level 1-3), recompute to `Cell.recompute`.
Expert parallelism is an extra alias: the data axis is factored into
("dp", "ep") as in the JAX exporter. Several programs (HyperMPMD) are
nets of their own, each launched on its ranks: `use_program(rank)` binds
the plan of the rank's program. So are pipeline stages of different
widths, since `AutoParallel.pipeline` splits one device matrix into equal
stages: each stage (`main/stage0`, ...) is a net of its own with its own
device matrix and layouts, and `stage_peers` pairs the ranks that hand
activations across.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.hypershard.backends import common
from planner.hypershard.backends.jax import _mesh

SUFFIX = ".py"

_BODY = common.ALIAS_SRC + r'''

def layout(dims):
    """The Layout of one tensor from its declared per-dim axes."""
    return LAYOUT(*(_alias(spec) for spec in dims))


def parameter_plan(net):
    """{parameter name: Layout} for every parameter of `net` (names as the declaration's)."""
    return {p.name: layout(layout_of(p.name)["dims"]) for p in net.get_parameters()}


def _cells(net, pattern):
    return [(name, cell) for name, cell in net.cells_and_names()
            if name.count(".") == pattern.count(".") and fnmatch.fnmatchcase(name, pattern)]


def mark_stages(net):
    """Set `pipeline_stage` on every layer and block the declaration assigns to a chunk (chunk c: stage c mod pp)."""
    if STAGE is not None:  # a stage of its own width is a net of its own: no pipeline marks inside it
        return
    pp = dict(DEVICE_MATRIX).get("pp", 1)
    for chunk, spec in enumerate(CHUNKS):
        for name in spec["layers"] + spec["blocks"]:
            for _, cell in _cells(net, name):
                cell.pipeline_stage = chunk % pp


def apply_recompute(net):
    """Cell.recompute() on each layer whose rule recomputes it (fully or its attention core)."""
    for name, cell in net.cells_and_names():
        rule = next((r for r in RECOMPUTE if r["match"] == name), None) or next(
            (r for r in RECOMPUTE if any(c in r["match"] for c in "*?[") and name.count(".") == r["match"].count(".")
             and fnmatch.fnmatchcase(name, r["match"])), None)
        if rule and (rule["default"] == "recompute" or rule.get("ops", {}).get("core_attention") == "recompute"):
            cell.recompute()


def parallelize(net, net_with_loss=None):
    """Shard `net` as declared; returns the AutoParallel cell to train (pipeline and ZeRO configured)."""
    stage_matrix = tuple(n for a, n in DEVICE_MATRIX if a != "pp")
    global LAYOUT
    LAYOUT = Layout(stage_matrix, tuple(a for a, _ in DEVICE_MATRIX if a != "pp"))
    net.shard(in_strategy=tuple(layout(INPUTS[k]["dims"]) for k in INPUTS), parameter_plan=parameter_plan(net))
    mark_stages(net)
    apply_recompute(net)
    top = net_with_loss if net_with_loss is not None else net
    if dict(DEVICE_MATRIX).get("pp", 1) > 1:
        top = Pipeline(top, micro_size=MICRO_BATCHES)
    parallel = AutoParallel(top, parallel_mode="sharding_propagation")
    if dict(DEVICE_MATRIX).get("pp", 1) > 1:
        parallel.pipeline(stages=dict(DEVICE_MATRIX)["pp"], interleave=VIRTUAL_STAGES > 1,
                          scheduler="gpipe" if SCHEDULE == "gpipe" else "1f1b")
    if ZERO["stage"] > 0:
        parallel.hsdp(optimizer_level=f"level{ZERO['stage']}")
    return parallel
'''


def _data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    axes, rename = _mesh(doc, "mindspore")
    prog = doc["programs"][0]
    chunks = sorted((ch for st in prog["stages"] for ch in st["chunks"]), key=lambda c: c["chunk"])
    acts = doc["layouts"].get("activations", {})
    return [
        ("DEVICE_MATRIX", axes, "(alias, size), slowest first; one stage's Layout leaves out pp"),
        ("_RENAME", rename, "declared axis -> aliases (dp is factored when experts use its ranks)"),
        ("LAYOUTS", {k: {"dims": e["dims"]} for k, e in common.layouts(doc).items()},
         "parameter name or glob -> per-dim aliases (None: whole)"),
        ("INPUTS", {k: v for k, v in acts.items() if "*" not in k}, "model inputs, in call order"),
        ("CHUNKS", [{"layers": c["layers"], "blocks": c.get("blocks", [])} for c in chunks], None),
        ("SCHEDULE", prog["schedule"], None),
        ("VIRTUAL_STAGES", prog["virtual_stages"], None),
        ("MICRO_BATCHES", prog.get("micro_batches", 1), None),
        ("ZERO", doc["zero"], None),
        ("RECOMPUTE", doc["recompute"].get("layers", []), None),
        ("OFFLOAD", doc["offload"], "fraction of each memory class in host memory"),
    ] + common.stage_data(doc)


def render(doc: Mapping[str, Any], *, base_dir: str | None = None) -> str:
    use = ("    use_program(get_rank())   # several programs: each a net of its own, launched on its ranks\n"
           if common.grouped(doc) else "")
    lines = ['"""' + common.header(doc, "MindSpore static-graph plan (Layout, Cell.shard, pipeline)") +
             f"\n\nUse (graph mode, launched with msrun):\n\n{use}    net = parallelize(net, net_with_loss)\n\"\"\"", "",
             "from __future__ import annotations", "", "import fnmatch", "",
             "from mindspore.parallel import Layout", "from mindspore.parallel.auto_parallel import AutoParallel",
             "from mindspore.parallel.nn import Pipeline", ""]
    return common.assemble(lines, doc, _data, _BODY,
                           extra=("LAYOUT = None  # set by parallelize(): the Layout over one stage's device matrix",))
