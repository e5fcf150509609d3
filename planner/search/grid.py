"""The outer strategy space: which degrees, micro-batches and interleavings a plan may take.

What the space holds (the README's search section and `plan --help` list the same):

- tp: every divisor of the devices within the scale-up domain (every interconnect level but the
  scale-out one) that divides each attention core's query heads (KV heads are replicated when tp
  exceeds them) and the sequence (sequence parallelism splits it);
- cp: every degree that divides the devices left by tp and the sequence into 2 x cp equal chunks (ring
  attention's load-balanced halves), for models with attention;
- pp: every stage count up to the number of layers that divides the devices left (stages need not hold
  equal layer counts); dp is what remains, and must divide the global batch;
- ep: every divisor of the routed expert count that divides the ranks MoE folding puts experts on
  (tp x cp x dp of a stage, over etp); etp: tp, or 1 (experts then span the tensor ranks too);
- micro-batch: every divisor of the sequences per data-parallel replica;
- vpp: every count of interleaved chunks that divides the layers per stage (the micro-batches per step
  must then be a multiple of pp, as Megatron-LM's interleaved schedule asks);
- per strategy: ZeRO 0-3 (0 alone without data or context parallelism), recompute none / selective /
  full or the first k layers of each chunk full, offload fractions per memory class in 5 % steps,
  the balanced pipeline cut, and stages of different tensor widths around the best pipelines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models import Cluster

from planner.costing.attention import heads_problem
from planner.costing.pipeline_cut import NO_LAYERS, accounted_split
from planner.errors import HyperplanError, InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import ep_problem, routed_experts
from planner.search.constraints import Constraints
from planner.strategy import Strategy, Workload


def divisors(n: int) -> list[int]:
    """Every positive divisor of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def tensor_axis_limit(cluster: Cluster) -> int:
    """Largest tensor-parallel degree: the scale-up domain (every level but the scale-out one)."""
    inner = [lvl.group_size for lvl in cluster.levels[:-1] if lvl.group_size] or [
        cluster.levels[0].group_size or cluster.n_devices]
    return max(1, min(max(inner), cluster.n_devices))


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What of the model bounds the degrees: layers, query heads per attention core, routed experts."""

    layers: int
    heads: tuple[int, ...]
    experts: int
    inout: bool = False  # a linear weight is stored [in, out] (GPT-2's Conv1D), `in_out_linears`


def model_shape(graph: Graph, structure: Structure, facts=None) -> ModelShape:
    from planner.costing.attention import attention_regions

    regions = facts.regions if facts is not None else attention_regions(graph)
    return ModelShape(len(structure.layers()), tuple(sorted({r.heads for r in regions if r.heads > 0})),
                      routed_experts(graph, structure), in_out_linears(graph))


def in_out_linears(graph: Graph) -> bool:
    """Whether some linear weight is read as stored, [in, out] (GPT-2's Conv1D), where nn.Linear's [out, in]
    reaches its MatMul through a transpose: a MatMul (or a Gemm without transB) of a 2-D parameter itself."""
    params = set(graph.params)
    for n in graph.nodes:
        w = n.inputs[1] if len(n.inputs) > 1 else None
        if w in params and len(graph.tensors[w].shape or ()) == 2 and (
                n.op_type == "MatMul" or (n.op_type == "Gemm" and not n.attrs.get("transB", 0))):
            return True
    return False


def tp_degrees(shape: ModelShape, cluster: Cluster, workload: Workload, c: Constraints) -> list[int]:
    n = cluster.n_devices
    if c.tp is not None:
        return [c.tp] if n % c.tp == 0 or c.stage_tp else []
    limit = tensor_axis_limit(cluster)
    return [t for t in divisors(n) if t <= limit and all(h % t == 0 for h in shape.heads)
            and (t == 1 or workload.seq_len % t == 0)]


def cp_degrees(shape: ModelShape, rest: int, workload: Workload, c: Constraints) -> list[int]:
    if c.cp is not None:
        return [c.cp] if rest % c.cp == 0 else []
    if not shape.heads:
        return [1]
    return [d for d in divisors(rest) if d == 1 or workload.seq_len % (2 * d) == 0]


def meshes(shape: ModelShape, cluster: Cluster, workload: Workload, c: Constraints) -> list[tuple[int, ...]]:
    """Every (tp, cp, pp, dp, ep, etp) the devices, scale-up domain, heads, layers and batch allow, and the
    constraints keep (with --stage-tp, tp is the widest stage and the stages' widths add up per replica)."""
    n = cluster.n_devices
    out = []
    for tp in tp_degrees(shape, cluster, workload, c):
        width = sum(c.stage_tp) if c.stage_tp else tp  # tensor ranks of one pipeline replica's first cut
        for cp in cp_degrees(shape, n // tp if not c.stage_tp else n, workload, c):
            if c.stage_tp:
                if n % (width * cp):
                    continue
                pps = [len(c.stage_tp)]
                rest = n // (width * cp)
            else:
                if (n // tp) % cp:
                    continue
                rest = n // (tp * cp)
                pps = [p for p in divisors(rest) if p <= max(1, shape.layers)]
            for pp in pps:
                dp = rest if c.stage_tp else rest // pp
                if workload.global_batch % dp:
                    continue
                ranks = tp * cp * dp
                etps = sorted({tp, 1}) if shape.experts and tp > 1 else [tp]
                for etp in etps:
                    eps = [e for e in divisors(shape.experts) if ranks % (e * etp) == 0] if shape.experts else [1]
                    for ep in eps:
                        if c.allows_mesh(tp, cp, pp, dp, ep, etp, experts=bool(shape.experts), inout=shape.inout):
                            out.append((tp, cp, pp, dp, ep, etp))
    return out


def micro_batches(per_replica: int, c: Constraints) -> list[int]:
    if c.micro_batch is not None:
        return [c.micro_batch] if per_replica % c.micro_batch == 0 else []
    return divisors(per_replica)


def vpp_degrees(layers: int, pp: int, m: int, c: Constraints) -> list[int]:
    """Interleaved chunks per stage: 1, and every v > 1 when the micro-batches divide into whole rounds of pp and
    the layers into pp x v equal chunks; with pp fixed by the constraints (a recipe's degree), also the layers with
    the embedding and the loss counted as one each (Megatron-Core's accounted split, `chunk_cut`; unless the
    constraints keep a layer in every chunk). Over every pp those multiplied the search's nodes 3-5x on some models
    (benchmarks/CALIBRATION.md: pipeline splits as run), so they are searched around a given pp only."""
    if pp == 1 or c.stage_tp or m % pp:
        return [v for v in [1] if c.vpp is None or v == c.vpp]
    even = {v for v in divisors(layers // pp) if v > 1} if layers % pp == 0 else set()
    ends = {v for v in divisors((layers + 2) // pp) if v > 1} if c.pp and (layers + 2) % pp == 0 else set()
    if c.ends_alone is False:
        ends = {v for v in ends if (layers + 2) // (pp * v) > 1}
    return [v for v in [1, *sorted(even | ends)] if c.vpp is None or v == c.vpp]


def chunk_cut(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The layers per chunk the search gives an interleaved pipeline (`Strategy.stage_layers`): () for the even cut,
    or Megatron-Core's accounted split where the layers alone do not divide into pp x vpp chunks."""
    if vpp == 1 or layers % (pp * vpp) == 0:
        return ()
    return accounted_split(layers, pp * vpp) or ()


def schedule_strategy(key: tuple, layers: int, sp: bool, layouts: str, **knobs) -> Strategy:
    """The strategy of a schedule key (cp, tp, mb, ep, etp, pp, dp, vpp), cut as the search cuts it (`chunk_cut`),
    with sequence parallelism where tp > 1 and `sp`, and the other `knobs` (recompute, ZeRO, offload...)."""
    cp, tp, mb, ep, etp, pp, dp, vpp = key
    return Strategy(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=0 if etp == tp else etp, vpp=vpp, micro_batch=mb,
                    sp=tp > 1 and sp, layouts=layouts, stage_layers=chunk_cut(layers, pp, vpp), **knobs)


def check_buildable(workload: Workload, c: Constraints, shape: ModelShape) -> None:
    """InvalidInput, one sentence, where fixed knobs build no strategy of this model and batch whatever the mesh."""
    if why := _unbuildable(workload, c, shape):
        raise InvalidInput(why)


def _unbuildable(workload: Workload, c: Constraints, shape: ModelShape) -> str:
    if not shape.layers:
        return NO_LAYERS
    for knob in ("ep", "etp"):
        if not shape.experts and (getattr(c, knob) or 1) > 1:
            return f"--{knob} {getattr(c, knob)}: the model has no routed experts (no MoE layer); drop --{knob}"
    chunks = (c.pp or 1) * (c.vpp or 1)
    ends = 2 if c.ends_alone is not False else 0  # a first and a last chunk of the embedding or the loss alone
    if chunks > shape.layers + ends and not c.stage_tp:
        given = " ".join(f"--{k} {v}" for k, v in (("pp", c.pp), ("vpp", c.vpp)) if v)
        lower = "--vpp or --pp" if c.vpp and c.pp else given.split()[0]
        return (f"{given} makes {chunks} pipeline chunks, more than the model's {shape.layers} layers"
                f"{' and its two ends' if ends else ''}; lower {lower}")
    tp = c.tp or 1
    if not c.stage_tp and (why := heads_problem(tp, shape.heads)):
        return why
    if c.ep and shape.experts and (why := ep_problem(c.ep, (shape.experts,))):
        return why
    if tp > 1 and workload.seq_len % tp and c.sequence_parallel_runs(workload.execution):
        return (f"--tp {tp}: sequence parallelism splits each sequence over the tensor ranks, and {workload.seq_len} "
                f"tokens do not split into {tp} (the launch would refuse it); give a --seq-len divisible by {tp}, or "
                "another --tp")
    mb, batch = c.micro_batch, workload.global_batch
    if mb and (mb > batch or batch % mb):
        what = "is more than" if mb > batch else "does not divide"
        return f"--micro-batch {mb} {what} the global batch of {batch} sequences; give a divisor of {batch}"
    return ""


def no_mesh(cluster: Cluster, workload: Workload, c: Constraints, shape: ModelShape) -> HyperplanError:
    """The error when no mesh is left: the constraints it cannot keep, or a batch no data degree divides."""
    fixed = [(k, v) for k, v in (("tp", c.tp), ("cp", c.cp), ("pp", c.pp), ("dp", c.dp)) if v]
    product = math.prod(v for _, v in fixed)
    if fixed and not c.stage_tp and cluster.n_devices % product:
        given = " x ".join(f"--{k} {v}" for k, v in fixed)
        return InvalidInput(f"{given}{f' = {product}' if len(fixed) > 1 else ''} does not divide the "
                            f"{cluster.n_devices} devices; give degrees whose product divides {cluster.n_devices}, "
                            "or change --devices")
    keeps = c.unmet(experts=bool(shape.experts), inout=shape.inout)
    if keeps:
        return InvalidInput(f"no mesh of {cluster.n_devices} devices keeps {keeps} with a global batch of "
                            f"{workload.global_batch}; relax a constraint or change --devices")
    return HyperplanError(
        f"no parallel layout of {cluster.n_devices} devices divides the global batch {workload.global_batch}; "
        "use a batch that is a multiple of the data-parallel degree")
