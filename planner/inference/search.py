"""The best layout and batch for one phase on a device group, under latency targets or at a given batch.

For each layout (tensor parallelism inside the scale-up level's groups,
pipeline stages, data parallelism over the rest; routed experts spread over
all devices of a stage: expert parallelism as wide as the stage) the batch
is the largest that fits in memory and meets the phase's target: TTFT for
prefill (a batch of prompts through every stage), TPOT for decode. Per
device throughput grows with the batch while the latency target allows,
so the largest feasible batch (found by bisection: step time grows with
the batch) is the best one of the layout. For decode the KV cache may be
offloaded in part to the pooled/host tier when memory, not latency, stops
the batch from growing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from cost_models import Cluster

from planner.errors import InvalidInput
from planner.inference.phase_cost import Layout, Phase, Precision, Step, StepModel, tokens_per_s_per_device
from planner.inference.profile import Profile
from planner.search.program_groups import group_cluster

#: Fractions of the KV cache the search may keep in the pooled/host tier.
OFFLOAD_FRACTIONS = (0.5, 0.75, 0.9)
MAX_BATCH = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Serving:
    """What is served: prompt and generation lengths, the latency targets or a fixed batch, the precision."""

    prompt_len: int
    gen_len: int
    precision: Precision
    batch: int | None = None  # sequences per data-parallel replica per step
    ttft_s: float | None = None
    tpot_s: float | None = None
    offload: bool = True
    #: a MoE stage's tp x dp devices (its ep) divide the routed experts, as every backend splits them; False
    #: lets ep be any stage width, experts held in uneven ranges (numpy.array_split), as vLLM or SGLang with
    #: redundant experts run them, which torch and ONNX exports write and the even-splitting backends refuse
    even_experts: bool = True

    def __post_init__(self) -> None:
        for flag, v in (("--prompt-len", self.prompt_len), ("--gen-len", self.gen_len)):
            if v < 1:
                raise InvalidInput(f"{flag} must be at least 1, got {v}")
        if self.batch is not None and self.batch < 1:
            raise InvalidInput(f"--batch must be at least 1, got {self.batch}")
        for flag, v in (("--ttft-ms", self.ttft_s), ("--tpot-ms", self.tpot_s)):
            if v is not None and not v > 0:
                raise InvalidInput(f"{flag} must be a positive number of milliseconds, got {v * 1e3:g}")

    @property
    def decode_context(self) -> int:
        """Mean context over a sequence's decode: the prompt plus half the generated tokens."""
        return self.prompt_len + self.gen_len // 2

    @property
    def max_context(self) -> int:
        return self.prompt_len + self.gen_len


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """One phase on `devices` devices: layout, batch, latency, throughput per device, its step."""

    phase: Phase
    devices: int
    layout: Layout
    batch: int
    kv_offload: float
    latency_s: float  # TTFT (prefill) or TPOT (decode)
    tokens_per_s_per_device: float
    step: Step  # at the cost context (decode: the mean context)
    memory_bytes: Mapping[str, float]  # on the fullest device at the longest context (what must fit)


def profile_expert_counts(profile: Profile) -> list[int]:
    """The distinct routed-expert counts of the model's MoE layers ([] for a dense model)."""
    return sorted({p.experts.experts for p in profile.parts if p.experts})


def layouts(profile: Profile, cluster: Cluster, n: int, even_experts: bool = True) -> list[Layout]:
    """Candidate layouts of `n` devices: tp a power of two within one innermost group, pp up to 8; with
    `even_experts`, for a MoE model only stages whose tp x dp devices divide the routed experts (ep is the
    whole stage; see `Serving.even_experts`)."""
    inner = cluster.group_size(0)
    experts = profile_expert_counts(profile) if even_experts else []
    out = []
    tp = 1
    while tp <= min(n, inner):
        if n % tp == 0:
            for pp in (1, 2, 4, 8):
                if (n // tp) % pp == 0 and pp <= len(profile.layers):
                    dp = n // (tp * pp)
                    if any(e % (tp * dp) for e in experts):
                        continue
                    out.append(Layout(tp=tp, dp=dp, pp=pp, ep=tp * dp if profile.is_moe else 1))
        tp *= 2
    return out


def best_phase(profile: Profile, cluster: Cluster, serving: Serving, phase: Phase, n: int,
               only: Layout | None = None, within: Callable[[PhasePlan], bool] | None = None,
               beside: Callable[[PhasePlan], bool] | None = None) -> PhasePlan | None:
    """The layout and batch of highest throughput per device on `n` devices (None if nothing fits); `within`,
    when given, is the latency test a plan must pass in place of the phase's target (true up to some batch), and
    `beside` a memory test it must pass too, at a fixed --batch as well (what runs beside it leaves it room)."""
    hw = group_cluster(cluster, n)
    best: PhasePlan | None = None
    offloads = (0.0,) + (OFFLOAD_FRACTIONS if phase == "decode" and serving.offload and hw.memory_tiers else ())
    for lay in [only] if only else layouts(profile, hw, n, serving.even_experts):
        model = StepModel(profile, hw, lay, serving.precision)
        for f in offloads:
            plan, memory_bound = _best_batch(model, serving, phase, f, within, beside)
            if plan is not None and (best is None or plan.tokens_per_s_per_device
                                     > best.tokens_per_s_per_device * (1 + 1e-9)):
                best = plan
            if not memory_bound:
                break  # latency, not memory, stops the batch: offloading the cache cannot help this layout
    return best


def _best_batch(model: StepModel, serving: Serving, phase: Phase, f: float,
                within: Callable[[PhasePlan], bool] | None = None,
                beside: Callable[[PhasePlan], bool] | None = None) -> tuple[PhasePlan | None, bool]:
    """(the plan at the largest feasible batch, whether memory rather than latency bounds that batch); `within`
    and `beside` as `best_phase` takes them."""
    target = serving.ttft_s if phase == "prefill" else serving.tpot_s

    def room(b: int) -> PhasePlan | None:  # the plan at batch b if it fits in memory
        if not _fits(model, serving, phase, b, f):
            return None
        plan = phase_plan(model, serving, phase, b, f)
        return plan if beside is None or beside(plan) else None

    if serving.batch is not None:
        plan = room(serving.batch)
        return plan, plan is None

    def ok(b: int) -> bool:
        plan = room(b)
        if plan is None:
            return False
        if within is not None:
            return within(plan)
        return target is None or plan.latency_s <= target

    b = _largest(ok)
    if not b:
        return None, room(1) is None
    return phase_plan(model, serving, phase, b, f), room(b + 1) is None


def _fits(model: StepModel, serving: Serving, phase: Phase, batch: int, f: float) -> bool:
    q, ctx = (serving.prompt_len, serving.prompt_len) if phase == "prefill" else (1, serving.max_context)
    return model.fits(model.memory(phase=phase, batch=batch, q=q, context=ctx, kv_offload=f))


def _largest(ok: Callable[[int], bool], limit: int = MAX_BATCH) -> int:
    """Largest b in [1, limit] with ok(b), for ok true up to some b and false after (0 if none): doubling,
    then bisection."""
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def phase_plan(model: StepModel, serving: Serving, phase: Phase, batch: int, kv_offload: float = 0.0) -> PhasePlan:
    """Cost `batch` sequences per replica: latency, throughput per device, memory at the longest context."""
    lay = model.layout
    if phase == "prefill":
        p = serving.prompt_len
        st = model.step(phase="prefill", batch=batch, q=p, context=p)
        mem = st.memory_bytes
        latency = st.pass_s
        rate = tokens_per_s_per_device(st, lay, batch * p)
    else:
        st = model.step(phase="decode", batch=batch, q=1, context=serving.decode_context, kv_offload=kv_offload)
        mem = model.memory(phase="decode", batch=batch, q=1, context=serving.max_context, kv_offload=kv_offload)
        latency = max(st.pass_s, lay.pp * st.cycle_s)  # each replica's micro-batches take turns in the stages
        rate = tokens_per_s_per_device(st, lay, batch)
    return PhasePlan(phase=phase, devices=lay.devices, layout=lay, batch=batch, kv_offload=kv_offload,
                     latency_s=latency, tokens_per_s_per_device=rate, step=st, memory_bytes=mem)


def max_context(profile: Profile, cluster: Cluster, serving: Serving, lay: Layout, batch: int,
                kv_offload: float = 0.0) -> int:
    """Longest context (prompt + generated) whose decode fits in memory at `batch` sequences per replica."""
    model = StepModel(profile, group_cluster(cluster, lay.devices), lay, serving.precision)

    def fits(ctx: int) -> bool:
        return model.fits(model.memory(phase="decode", batch=batch, q=1, context=ctx, kv_offload=kv_offload))

    return _largest(fits, limit=(1 << 40) - 1)
