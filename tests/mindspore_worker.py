"""One msrun worker of tests/test_mindspore_export.py: apply an exported MindSpore plan to a real `nn.Cell` on CPU.

Run as `msrun ... python mindspore_worker.py JOBS.json`: it joins the CPU collective group (mccl) once, then for
each job of JOBS.json (a list of {"plan": PLAN.py, "shapes": SHAPES.json, "out": OUT_DIR, "phase": PHASE or null})
loads the generated plan module, builds a fresh Cell whose parameters carry the declaration's names and the shapes
in SHAPES.json, calls the plan's `parallelize`, and writes what MindSpore recorded (each parameter's layout, the
cell's input layouts, the pipeline marks, the AutoParallel configuration) to OUT_DIR/rank_N.json. Then it tries
one step (the loss) and records how MindSpore answered. With PHASE, the plan is a serving one: it binds that phase
(`use_program`) and `parallelize(net)` shards the net for forward only. One launch serves every job: forming the
two-process cluster and taking it down cost some 15 s a launch.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.communication import get_group_size, get_rank, init


class Node(nn.Cell):
    """A cell of the declaration's module tree: named parameters and child cells."""


class Net(nn.Cell):
    """A model whose parameters carry the declaration's names; its forward applies each square matrix in turn."""

    def __init__(self, children: dict[str, nn.Cell]):
        super().__init__()
        for name, child in children.items():
            setattr(self, name, child)
        self.square = ms.ParameterTuple([p for p in self.get_parameters() if len(p.shape) == 2
                                         and p.shape[0] == p.shape[1]])

    def construct(self, x):
        for weight in self.square:
            x = ops.relu(ops.matmul(x, ops.transpose(weight, (1, 0))))
        return x


def build(shapes: dict[str, list[int]]) -> Net:
    """A Net whose parameter names are the keys of `shapes` (dots are child cells), built leaves first so that
    attaching each child prefixes its parameters' names (Cell's auto prefix)."""
    tree: dict = {}
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = shape

    def make(spec: dict) -> Node:
        cell = Node()
        for key, value in spec.items():
            if isinstance(value, dict):
                setattr(cell, key, make(value))
            else:
                data = np.arange(np.prod(value), dtype=np.float32).reshape(value) / np.prod(value)
                setattr(cell, key, Parameter(Tensor(data), name=key))
        return cell

    return Net({key: make(value) for key, value in tree.items()})


def recorded(net: nn.Cell, parallel: nn.Cell) -> dict:
    """What MindSpore holds after `parallelize`: per-parameter layouts, input layouts, stages, AutoParallel."""
    params = {p.name: {"device_matrix": list(p.param_info.device_matrix), "tensor_map": list(p.param_info.tensor_map),
                       "alias_name": list(p.param_info.alias_name)} for p in net.get_parameters()}
    stages = {name: getattr(cell, "pipeline_stage") for name, cell in net.cells_and_names()
              if name and hasattr(cell, "pipeline_stage")}  # unset until a plan marks the cell
    inputs = [{k: list(v) if isinstance(v, tuple) else v for k, v in s.items()} for s in net._in_strategy]
    out = {"rank": get_rank(), "group_size": get_group_size(), "params": params, "inputs": inputs, "stages": stages}
    if hasattr(parallel, "_parallel_mode"):  # training: the AutoParallel cell
        out |= {"parallel_mode": parallel._parallel_mode, "pipeline_stages": parallel._pipeline_stages,
                "pipeline_scheduler": parallel._pipeline_scheduler,
                "optimizer_level": parallel._optimizer_level if parallel._enable_parallel_optimizer else None}
    return out


def one_step(parallel: nn.Cell, hidden: int) -> dict:
    """The loss of one step of the cell `parallelize` returned, or the first line of the error MindSpore raised."""
    x = Tensor(np.linspace(-1, 1, 4 * hidden, dtype=np.float32).reshape(4, hidden))
    try:
        return {"loss": float(parallel(x, ops.zeros_like(x)).asnumpy())}
    except RuntimeError as err:
        return {"error": str(err).strip().splitlines()[0]}


def apply(plan_path: str, shapes_path: str, out_dir: str, phase: str | None) -> None:
    """One job: the plan applied to a fresh Cell, and what MindSpore recorded written to out_dir/rank_N.json."""
    spec = importlib.util.spec_from_file_location("plan", plan_path)
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    shapes = json.loads(open(shapes_path).read())
    net = build(shapes)
    if phase is None:
        parallel = plan.parallelize(net, nn.WithLossCell(net, nn.MSELoss()))
        out = recorded(net, parallel)
        out["step"] = one_step(parallel, next(s[0] for s in shapes.values() if len(s) == 2 and s[0] == s[1]))
    else:
        plan.use_program(phase)
        out = recorded(net, plan.parallelize(net))
    with open(f"{out_dir}/rank_{get_rank()}.json", "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


def main(jobs_path: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    for job in json.loads(open(jobs_path).read()):
        apply(job["plan"], job["shapes"], job["out"], job.get("phase"))
        print("written", job["out"], get_rank(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
