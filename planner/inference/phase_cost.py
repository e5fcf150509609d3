"""One forward step of a served model on a parallel layout: time by kind, what limits it, memory per device.

A step carries `batch` sequences per data-parallel replica, `q` new tokens
each (the prompt in prefill; one token, or 1 + draft tokens, in decode) over
a context of `context` tokens. Per layer, per device, three kernel groups
are costed, the projections and experts as rooflines with the cluster's
efficiency curves (`op_time`), attention by training's flash-attention law:

- projections: FLOPs per token x tokens / tp against the layer's weights /
  tp (decode streams every weight once per step: Pope et al. 2022,
  "Efficiently Scaling Transformer Inference", section 2, the memory-bound
  regime) plus the token's memory-bound bytes (fused into them);
- the attention core: training's flash-attention cost
  (`cost_models.compute.attention_time_s`, the same length law and plateaus), FLOPs per (query, key) pair
  x pairs / tp against the KV cache it reads (decode) or writes (prefill; causal, so q(q+1)/2 pairs as a
  flash kernel computes them, Dao et al. 2022) and the queries and outputs, in the kernel a serving
  engine runs (`serving_attention_kernel`);
- routed experts: the stage's tokens x k pairs spread over its devices,
  against the weights of the experts they touch (`expected_touched`).

Communication: the tensor-parallel all-reduce at each residual join, the
expert dispatch and combine (`cost_models.expert_dispatch`), the pipeline's
point-to-point sends, and the KV cache fetched from the pooled or host tier
layer by layer (`prefetch_timeline`: only what the layer's compute cannot
hide shows). Communication is charged in full, without overlap credit: the
two-micro-batch overlap that DeepSeek and SGLang run does not beat the
serial sum of these terms in their published figures (see
planner/inference/published_deployments.json), as splitting the batch halves every
kernel and the communication kernels take compute units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from cost_models import Cluster, place_group
from cost_models.collectives import all_reduce_s, send_recv_s
from cost_models.compute import attention_time_s, op_time
from cost_models.expert_dispatch import exchange_s, expected_touched
from cost_models.offload import offload_tier, prefetch_timeline

from planner.errors import InvalidInput
from planner.inference.kv_cache import AttentionFacts
from planner.inference.profile import Part, Profile
from planner.costing.stage_costs import DTYPE_WIDTH, even_split

Phase = Literal["prefill", "decode"]
#: Share of HBM a serving engine lets its weights, cache and activations use; the rest is left to the runtime
#: and the allocator (vLLM's default gpu_memory_utilization is 0.9; SGLang's mem_fraction_static is similar).
HBM_USABLE = 0.9
SERVING_DTYPES = ("bf16", "fp16", "fp8", "int8")
#: The flash-attention kernel a serving engine runs where a preset lists it: vLLM's FLASH_ATTN backend, first on
#: Hopper, takes FlashAttention-3 there (vllm/attention/utils/fa_utils.py, get_flash_attn_version). Elsewhere the
#: preset's first (default) kernel stands in: FlashAttention-2 on Ampere, which vLLM runs there too; on Blackwell,
#: where vLLM puts FlashInfer first (vllm/platforms/cuda.py, _get_backend_priorities), the measured cuDNN figures,
#: an assumption a serving plan's notes state (no preset has FlashInfer figures).
SERVING_ATTENTION_KERNEL = "flash3"
#: Kernels whose figures are the serving engine's own kernel on the hardware that lists them.
ENGINE_KERNELS = ("flash3", "flash2")


def serving_attention_kernel(cluster: Cluster) -> str:
    """The flash-attention kernel whose figures a serving step's attention core is costed with."""
    listed = [name for name, _, _ in cluster.attention_plateaus]
    if not listed:
        raise InvalidInput(f"{cluster.name} lists no flash-attention efficiency, which serving costs the attention "
                           "core with: add `attention = {flash2 = [forward, backward]}` under [efficiency] in its file")
    return SERVING_ATTENTION_KERNEL if SERVING_ATTENTION_KERNEL in listed else listed[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How one phase's device group runs the model: tensor x data x pipeline; experts over a stage's devices.

    Attention and dense weights are split `tp` ways and replicated `dp` ways; a stage's tp x dp devices
    hold its routed experts, `ep` experts groups each split (tp x dp) / ep ways.
    """

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def stage_devices(self) -> int:
        return self.tp * self.dp

    def short(self) -> str:
        """'tp4 dp2', 'dp144 ep144', 'tp8 pp2': degrees of 1 left out (dp always shown)."""
        parts = [f"tp{self.tp}" if self.tp > 1 else "", f"dp{self.dp}", f"pp{self.pp}" if self.pp > 1 else "",
                 f"ep{self.ep}" if self.ep > 1 else ""]
        return " ".join(p for p in parts if p)


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """Weights and matmuls at `dtype` (quantised weights are read and multiplied at 1 byte); KV cache and
    activations at `kv_bytes` / `act_bytes`; the attention core at the bf16 peak (`attention_time_s`)."""

    dtype: str = "bf16"
    kv_bytes: float = 2.0
    act_bytes: float = 2.0

    def __post_init__(self) -> None:
        if self.dtype not in SERVING_DTYPES:
            raise InvalidInput(f"--dtype {self.dtype}: serving runs weights in {', '.join(SERVING_DTYPES)}; pick one")

    @property
    def weight_bytes(self) -> float:
        return DTYPE_WIDTH[self.dtype]

    @property
    def dispatch_bytes(self) -> float:
        """Tokens travel to the experts at the matmul precision (DeepSeek: fp8 dispatch, bf16 combine)."""
        return min(self.weight_bytes, self.act_bytes)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of one micro-batch: `pass_s` through every stage, `cycle_s` between micro-batches."""

    pass_s: float
    cycle_s: float
    breakdown_s: Mapping[str, float]  # the slowest stage: compute, hbm, tp_comm, ep_comm, pp_comm, offload
    memory_bytes: Mapping[str, float]  # the fullest device: weights, kv_cache, workspace, offloaded_kv, total
    usable_bytes: float
    tier_bytes: float  # capacity per device of the tier the cache is offloaded to (0: none)

    @property
    def fits(self) -> bool:
        m = self.memory_bytes
        return m["total"] <= self.usable_bytes and m["offloaded_kv"] <= self.tier_bytes

    @property
    def limiter(self) -> str:
        b = self.breakdown_s
        comm = b["tp_comm"] + b["ep_comm"] + b["pp_comm"] + b["offload"]
        kinds = {"compute": b["compute"], "hbm_bandwidth": b["hbm"], "communication": comm}
        return max(sorted(kinds), key=lambda k: kinds[k])


def tokens_per_s_per_device(st: Step, layout: Layout, tokens: float) -> float:
    """Throughput per device of `tokens` per replica per step: the slowest stage paces a replica's tp x pp
    devices (each data-parallel replica carries its own batch)."""
    return tokens / (st.cycle_s * layout.tp * layout.pp)


_STAGES: dict[tuple[int, int], tuple[Profile, tuple]] = {}


def stages(profile: Profile, pp: int) -> tuple[tuple[tuple[Part, int], ...], ...]:
    """Parts per pipeline stage, tied layers counted once: layers split evenly, embedding first, head last."""
    hit = _STAGES.get((id(profile), pp))
    if hit is not None and hit[0] is profile:
        return hit[1]
    layers = profile.layers
    if pp > len(layers):
        raise InvalidInput(f"the model has {len(layers)} layers, too few for {pp} pipeline stages")
    sizes = even_split(len(layers), pp)
    out, i = [], 0
    for s, size in enumerate(sizes):
        mine = list(layers[i:i + size])
        i += size
        if s == 0:
            mine = [p for p in profile.parts if p.kind in ("pre", "encoder")] + mine
        if s == pp - 1:
            mine += [p for p in profile.parts if p.kind == "post"]
        counts: dict[str, list] = {}
        for p in mine:
            key = f"{p.kind}:{p.type_id}"
            counts.setdefault(key, [p, 0])[1] += 1
        out.append(tuple((p, n) for p, n in counts.values()))
    if len(_STAGES) > 256:
        _STAGES.clear()
    _STAGES[(id(profile), pp)] = (profile, tuple(out))
    return tuple(out)


class StepModel:
    """The costing of one (profile, cluster, layout, precision): device groups placed once, then any step."""

    __slots__ = ("profile", "cluster", "layout", "prec", "stages", "tp_spans", "ep_spans", "p2p_spans", "tier",
                 "attention_kernel")

    def __init__(self, profile: Profile, cluster: Cluster, layout: Layout, prec: Precision) -> None:
        self.profile, self.cluster, self.layout, self.prec = profile, cluster, layout, prec
        distinct: dict[tuple, list] = {}  # stages with the same parts cost the same: cost each once
        for parts in stages(profile, layout.pp):
            key = tuple((p.kind, p.type_id, n) for p, n in parts)
            distinct.setdefault(key, [parts, 0])[1] += 1
        self.stages = tuple((parts, k) for parts, k in distinct.values())
        self.tp_spans = place_group(cluster, layout.tp) if layout.tp > 1 else ()
        self.ep_spans = place_group(cluster, layout.stage_devices) if layout.stage_devices > 1 else ()
        self.p2p_spans = place_group(cluster, 2, stride=layout.stage_devices) if layout.pp > 1 else ()
        self.tier = offload_tier(cluster)
        # whose flash-attention figures the attention cores are costed with (none needed without attention)
        self.attention_kernel = serving_attention_kernel(cluster) if any(p.attention for p in profile.parts) else ""

    def memory(self, *, phase: Phase, batch: int, q: int, context: int, kv_offload: float = 0.0) -> dict[str, float]:
        """Bytes on the fullest device (weights, KV cache in HBM, offloaded KV, workspace, total)."""
        worst: dict[str, float] = {}
        for parts, _ in self.stages:
            mem = _memory(self, parts, phase, batch, q, context, kv_offload)
            if not worst or mem["total"] > worst["total"]:
                worst = mem
        return worst

    @property
    def usable_bytes(self) -> float:
        """HBM per device the serving engine lets the model use."""
        return self.cluster.device.hbm_bytes * HBM_USABLE

    @property
    def tier_bytes(self) -> float:
        """Capacity per device of the tier the KV cache is offloaded to (0: none)."""
        return self.tier.capacity_bytes if self.tier is not None else 0.0

    def fits(self, mem: Mapping[str, float]) -> bool:
        return mem["total"] <= self.usable_bytes and mem["offloaded_kv"] <= self.tier_bytes

    def step(self, *, phase: Phase, batch: int, q: int, context: int, kv_offload: float = 0.0) -> Step:
        """Cost one step; `kv_offload` is the fraction of the KV cache kept in the pooled or host tier (decode)."""
        if kv_offload > 0 and self.tier is None:
            raise InvalidInput(f"{self.cluster.name} has no memory tier beyond HBM to offload the KV cache to")
        total = slowest = 0.0
        worst_bd: dict[str, float] = {}
        for parts, k in self.stages:
            bd = _stage_time(self, parts, phase, batch, q, context, kv_offload)
            t = sum(bd.values())
            if not worst_bd or t > slowest:
                worst_bd, slowest = bd, t
            total += k * t
        p2p = 0.0
        if self.p2p_spans:
            p2p = send_recv_s(batch * q * self.profile.hidden * self.prec.act_bytes / self.layout.tp, self.p2p_spans)
        passes = total + (self.layout.pp - 1) * p2p
        worst_bd["pp_comm"] = p2p
        mem = self.memory(phase=phase, batch=batch, q=q, context=context, kv_offload=kv_offload)
        return Step(pass_s=passes, cycle_s=slowest + p2p, breakdown_s=worst_bd, memory_bytes=mem,
                    usable_bytes=self.usable_bytes, tier_bytes=self.tier_bytes)


def step(profile: Profile, cluster: Cluster, layout: Layout, prec: Precision, *, phase: Phase, batch: int,
         q: int, context: int, kv_offload: float = 0.0) -> Step:
    """Cost one step of `batch` sequences per replica (see `StepModel.step`)."""
    return StepModel(profile, cluster, layout, prec).step(phase=phase, batch=batch, q=q, context=context,
                                                         kv_offload=kv_offload)


def _cache_bytes(m: StepModel, a, batch: int, context: int) -> float:
    return batch * a.held(context) * a.cached_elements * m.prec.kv_bytes / min(m.layout.tp, a.kv_heads)


def _memory(m: StepModel, parts, phase: Phase, batch: int, q: int, context: int, kv_offload: float):
    lay, prec = m.layout, m.prec
    tp, wb = lay.tp, prec.weight_bytes
    act_scale = prec.act_bytes / m.profile.float_bytes
    weights = kv = work = biggest = 0.0
    for part, count in parts:
        weights += count * part.dense_params * wb / tp
        if part.experts is not None:
            e = part.experts
            weights += count * e.experts * e.params_per_expert * wb / lay.stage_devices
        if part.kind == "encoder" and phase == "decode":
            continue
        rows = batch if part.kind == "encoder" else batch * q  # an encoder's figures are per sample
        work = max(work, rows * part.act_bytes_per_token * act_scale / tp)
        for a in part.attention:
            c = _cache_bytes(m, a, batch, context)
            kv += count * c
            biggest = max(biggest, c)
    held = kv * (lay.pp if phase == "decode" else 1)  # decode keeps pp micro-batches in flight
    offloaded = held * kv_offload if phase == "decode" else 0.0
    buffer = 2 * kv_offload * biggest if offloaded else 0.0  # the layer being read and the next one arriving
    mem = {"weights": weights, "kv_cache": held - offloaded, "offloaded_kv": offloaded, "workspace": work + buffer}
    mem["total"] = mem["weights"] + mem["kv_cache"] + mem["workspace"]
    return mem


def attention_core_s(m: StepModel, a: AttentionFacts, phase: Phase, batch: int, q: int,
                     context: int) -> tuple[float, bool]:
    """(seconds, whether compute rather than HBM sets them) of one attention core on one device, by the
    flash-attention law training uses: each of the `batch` x `q` query rows covers the `context` cached keys
    (decode) or its causal share of the prompt after any cached prefix (prefill), the last `window` of them in a
    sliding-window layer, reading or writing the cache and the queries and outputs."""
    tp = m.layout.tp
    if phase == "decode":
        keys = a.held(context)
        flops = batch * q * keys * a.decode_pair_flops / tp
    else:
        pairs = a.prefill_pairs(max(0, context - q), q)
        flops, keys = batch * pairs * a.prefill_pair_flops / tp, pairs / q
    rows = batch * q * a.heads * (a.key_dim + a.value_dim) * m.prec.act_bytes / tp
    kernel, dim = m.attention_kernel, (a.key_dim + a.value_dim) / 2
    t = attention_time_s(m.cluster, flops, _cache_bytes(m, a, batch, context) + rows, "forward", kernel, keys, dim)
    return t, attention_time_s(m.cluster, flops, 0.0, "forward", kernel, keys, dim) >= t


def _stage_time(m: StepModel, parts, phase: Phase, batch: int, q: int, context: int, kv_offload: float):
    lay, prec, cluster, profile = m.layout, m.prec, m.cluster, m.profile
    tp, wb = lay.tp, prec.weight_bytes
    tokens = batch * q
    act_scale = prec.act_bytes / profile.float_bytes
    bd = dict.fromkeys(("compute", "hbm", "tp_comm", "ep_comm", "offload"), 0.0)
    fetch: list[float] = []
    compute_per_layer: list[float] = []

    def run(flops: float, nbytes: float, dtype: str, count: int) -> float:
        t = op_time(cluster, flops, nbytes, "matmul", dtype)
        bd["compute" if t.compute_s >= t.memory_s else "hbm"] += t.time_s * count
        return t.time_s

    for part, count in parts:
        if part.kind == "encoder":
            if phase == "prefill":
                run(batch * part.flops_per_token / tp, part.streamed_params * wb / tp, prec.dtype, count)
            continue
        per_seq = part.kind == "post" and phase == "prefill"  # only the last position's logits are needed
        rows = batch if per_seq else tokens
        layer_s = run(rows * part.flops_per_token / tp,
                      part.streamed_params * wb / tp + tokens * part.vector_bytes_per_token * act_scale / tp,
                      prec.dtype, count)
        for a in part.attention:
            t, compute_bound = attention_core_s(m, a, phase, batch, q, context)
            bd["compute" if compute_bound else "hbm"] += t * count
            layer_s += t
            if kv_offload > 0 and phase == "decode":
                fetch += [kv_offload * _cache_bytes(m, a, batch, context)] * count
        e = part.experts
        if e is not None:
            local = e.experts / lay.ep
            touched = local * expected_touched(tokens * lay.dp, e.top_k, e.experts) / e.experts
            split = lay.stage_devices / lay.ep
            pairs = tokens * e.top_k / tp  # the stage's tokens x k pairs spread over its tp x dp devices
            layer_s += run(pairs * e.flops_per_pair, touched * e.params_per_expert * wb / split
                           + 2 * pairs * profile.hidden * prec.act_bytes, prec.dtype, count)
            if m.ep_spans:
                sent, hier = tokens / tp, phase == "prefill"
                bd["ep_comm"] += count * (
                    exchange_s(sent, e.top_k, profile.hidden * prec.dispatch_bytes, m.ep_spans, hier)
                    + exchange_s(sent, e.top_k, profile.hidden * prec.act_bytes, m.ep_spans, hier))
        if m.tp_spans and part.syncs:
            bd["tp_comm"] += count * part.syncs * all_reduce_s(tokens * profile.hidden * prec.act_bytes, m.tp_spans)
        if part.kind == "layer":
            compute_per_layer += [layer_s] * count
    if fetch:
        tier = m.tier
        steps = [f / (tier.bandwidth_bytes_per_s * tier.efficiency(f)) + tier.latency_s for f in fetch]
        bd["offload"] = prefetch_timeline(steps, compute_per_layer[:len(steps)], depth=1).exposed_s
    return bd


