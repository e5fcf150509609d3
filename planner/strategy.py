"""What is being run (the workload) and how it is parallelised (the strategy): pure data.

Kept apart from the model (the graph) and the system (the cluster), as in
Calculon: the estimate is a function of the three. Checks here are about
the strategy alone (degrees multiply to the device count, the batch splits
into whole micro-batches); whether it fits in memory is the estimate's job.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from planner.costing.execution import Execution, load_execution
from planner.errors import InvalidInput

Mode = Literal["train", "infer"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved"]
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
OFFLOAD_CLASSES: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "kv_cache")
#: Precisions a training step runs its GEMMs in (fp8: the stack's FP8 recipe, beside 16-bit attention and norms);
#: int8 and the like are serving's (`planner.inference`)
TRAIN_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp32")


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One training step (or inference batch): how many sequences of how many tokens, in which dtype, run by
    which software stack (`execution`: kernels, overlaps, FP8 recipe, optimizer states; the default stack
    unless given). In training, dtype fp8 means the layers' GEMMs run in FP8 by the stack's recipe."""

    mode: Mode = "train"
    global_batch: int
    seq_len: int
    dtype: str = "bf16"
    execution: Execution = field(default_factory=lambda: load_execution(None))

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise InvalidInput(f"--global-batch must be at least 1, got {self.global_batch}")
        if self.seq_len < 1:
            raise InvalidInput(f"--seq-len must be at least 1, got {self.seq_len}")
        if self.mode == "train" and self.dtype not in TRAIN_DTYPES:
            raise InvalidInput(f"--dtype {self.dtype}: training runs in {', '.join(TRAIN_DTYPES[:-1])} or "
                               f"{TRAIN_DTYPES[-1]}; give one of those")

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """The parallel degrees and memory policies of one plan.

    Mesh axes, fastest first: tp (tensor), cp (context), dp (data), pp
    (pipeline). Routed experts fold onto the same tp x cp x dp ranks of a
    stage as etp (expert tensor) x ep (expert) x edp (expert data), fastest
    first (Megatron-Core's MoE parallel folding): etp defaults to tp, so ep
    then spans data x context ranks; etp 1 lets ep span the tensor ranks too.
    `offload` maps a memory class to the fraction of it kept in the host or
    pooled tier instead of HBM.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    micro_batch: int = 1
    recompute: Recompute = "none"
    sp: bool = False
    zero: int = 0
    schedule: Schedule = "1f1b"
    offload: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    stage_layers: tuple[int, ...] = ()  # layers per pipeline chunk (pp x vpp of them); () = as even as possible;
    # 0 for the first or last: the embedding or the loss alone (Megatron's accounted split)
    full_recompute_layers: int = 0  # per chunk, the first k layers recompute fully, the rest use `recompute`
    layouts: str = "megatron"  # tensor-axis layout space: "megatron" (Megatron-LM's) or "searched" (free ILP)
    stage_tp: tuple[int, ...] = ()  # tensor degree of each pipeline stage when they differ; () = `tp` everywhere
    etp: int = 0  # expert tensor-parallel degree; 0 = tp (Megatron-Core's default)
    flushes: int = 1  # pipeline schedules per step, each over an equal share of its micro-batches and ending in a
    # flush (torchtitan's and NeMo Automodel's gradient-accumulation steps under a pipeline); 1 = one schedule

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "flushes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInput(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if isinstance(self.etp, bool) or not isinstance(self.etp, int) or self.etp < 0:
            raise InvalidInput(f"--etp must be a positive integer, got {self.etp!r}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise InvalidInput(f"--recompute must be one of {', '.join(RECOMPUTE_POLICIES)}, got {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise InvalidInput(f"--schedule must be 1f1b or gpipe (interleaved with --vpp > 1), got {self.schedule!r}")
        if self.zero not in (0, 1, 2, 3):
            raise InvalidInput(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        ranks = self.tp * self.cp * self.dp
        if ranks % (self.ep * self.expert_tp):
            raise InvalidInput(
                f"--ep {self.ep} x --etp {self.expert_tp} = {self.ep * self.expert_tp} must divide the "
                f"tp x cp x dp = {ranks} ranks of a pipeline stage, over which the experts are folded"
            )
        if self.sp and self.tp == 1:
            raise InvalidInput("--sp (sequence parallelism) needs --tp greater than 1")
        if self.vpp > 1 and self.pp == 1:
            raise InvalidInput("--vpp (interleaved stages) needs --pp greater than 1")
        if self.flushes > 1 and self.pp == 1:
            raise InvalidInput("--flushes (pipeline schedules per step) needs --pp greater than 1; without a "
                               "pipeline the micro-batches already accumulate")
        if self.stage_layers and len(self.stage_layers) != self.pp * self.vpp:
            raise InvalidInput(f"stage_layers gives {len(self.stage_layers)} layer counts, one a pipeline chunk, but "
                               f"pp x vpp = {self.pp * self.vpp}; give --pp (and --vpp) whose product is "
                               f"{len(self.stage_layers)}, or as many counts as chunks")
        if self.stage_layers and (min(self.stage_layers) < 0
                                  or min(self.stage_layers[1:-1], default=1) < 1 or max(self.stage_layers) < 1):
            raise InvalidInput(
                f"stage_layers {run_lengths(self.stage_layers)}: layer counts must be positive but for the first and "
                "the last chunk, which may hold only the embedding or the loss (0)"
            )
        if self.full_recompute_layers < 0:
            raise InvalidInput(f"--full-recompute-layers must be >= 0, got {self.full_recompute_layers}")
        if self.layouts not in ("megatron", "searched"):
            raise InvalidInput(f"layouts must be 'megatron' or 'searched', got {self.layouts!r}")
        if self.stage_tp:
            if len(self.stage_tp) != self.pp or self.pp < 2 or min(self.stage_tp) < 1:
                raise InvalidInput(f"stage_tp {list(self.stage_tp)} must give one positive tensor degree for each "
                                   f"of the pp = {self.pp} pipeline stages (and pp must be at least 2)")
            if self.vpp > 1:
                raise InvalidInput("stages with different device counts (stage_tp) need --vpp 1")
            if self.tp != max(self.stage_tp):
                raise InvalidInput(f"with stage_tp {list(self.stage_tp)}, tp must be the widest stage's degree, "
                                   f"{max(self.stage_tp)}, not {self.tp}")
        for cls, frac in self.offload:
            if cls not in OFFLOAD_CLASSES:
                raise InvalidInput(f"unknown offload class {cls!r}; use one of {', '.join(OFFLOAD_CLASSES)}")
            if not 0.0 <= frac <= 1.0:
                raise InvalidInput(f"offload fraction of {cls} must be within 0..1, got {frac}")

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel degree (etp, or tp when not given)."""
        return self.etp or self.tp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the ranks of a stage over ep x etp (they reduce expert gradients)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def devices(self) -> int:
        if self.stage_tp:
            return sum(self.stage_tp) * self.dp * self.cp
        return self.tp * self.pp * self.dp * self.cp

    def tp_of_stage(self, stage: int) -> int:
        """The tensor-parallel degree of one pipeline stage."""
        return self.stage_tp[stage] if self.stage_tp else self.tp

    def offload_fraction(self, cls: str) -> float:
        return dict(self.offload).get(cls, 0.0)

    def layer_policy(self, position_in_chunk: int) -> Recompute:
        """The recompute policy of the layer at this position of its pipeline chunk."""
        return "full" if position_in_chunk < self.full_recompute_layers else self.recompute

    def micro_batches(self, workload: Workload) -> int:
        """Micro-batches per pipeline per step; InvalidInput unless the batch splits evenly."""
        per_replica, rem = divmod(workload.global_batch, self.dp)
        if rem or per_replica % self.micro_batch:
            raise InvalidInput(
                f"global batch {workload.global_batch} does not split into dp={self.dp} replicas of whole "
                f"micro-batches of {self.micro_batch}; use a batch that is a multiple of {self.dp * self.micro_batch}"
            )
        m = per_replica // self.micro_batch
        if m % self.flushes:
            raise InvalidInput(
                f"the {m} micro-batches per step do not split evenly over --flushes {self.flushes} pipeline "
                "schedules; change --global-batch, --micro-batch or --flushes"
            )
        if self.vpp > 1 and (m // self.flushes) % self.pp:
            raise InvalidInput(
                f"interleaved 1F1B needs the {m // self.flushes} micro-batches per schedule to be a multiple of "
                f"--pp {self.pp}; change --global-batch, --micro-batch, --flushes or --vpp"
            )
        return m

    def schedule_micro_batches(self, workload: Workload) -> int:
        """Micro-batches of one pipeline schedule: the step's, over its `flushes` schedules."""
        return self.micro_batches(workload) // self.flushes

    def short(self) -> str:
        """E.g. 'TP8·PP12·DP4, ZeRO-1, selective recompute'; stages of different widths read 'TP4+8·PP2·DP4',
        and a run of equal stages is counted: 'TP1×2+2+1×28·PP31' (two stages at 1, one at 2, 28 at 1)."""
        tp = run_lengths(self.stage_tp) if self.stage_tp else self.tp
        axes = [f"{n}{v}" for n, v in (("TP", tp), ("CP", self.cp), ("PP", self.pp), ("DP", self.dp), ("EP", self.ep))
                if v != 1]
        if self.etp and self.etp != self.tp:
            axes.append(f"ETP{self.etp}")
        parts = ["·".join(axes) or "single device"]
        if self.vpp > 1:
            parts[0] += f" (vpp {self.vpp})"
        if self.sp:
            parts.append("SP")
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        if self.full_recompute_layers and self.recompute != "full":
            parts.append(f"full recompute of {self.full_recompute_layers} layers/chunk, {self.recompute} for the rest")
        elif self.recompute != "none":
            parts.append(f"{self.recompute} recompute")
        parts.append(f"mb {self.micro_batch}")
        if self.flushes > 1:
            parts.append(f"{self.flushes} pipeline flushes/step")
        if self.stage_layers and len(set(self.stage_layers)) > 1:
            parts.append("layers/stage " + run_lengths(self.stage_layers))

        for cls, frac in self.offload:
            if frac > 0:
                parts.append(f"{cls} offloaded {frac:.0%}")
        return ", ".join(parts)


def run_lengths(values: tuple[int, ...]) -> str:
    """Per-stage values joined by '+', a run of equal ones counted: (1, 1, 2, 1, 1, 1) -> '1×2+2+1×3'."""
    out: list[str] = []
    for v, run in itertools.groupby(values):
        n = len(list(run))
        out.append(f"{v}×{n}" if n > 1 else str(v))
    return "+".join(out)
