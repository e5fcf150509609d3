"""The execution: what the software stack does with a model on a machine, kept apart from both.

Calculon (Isaev et al. SC'23) prices a step from three inputs: the application, the system and the execution.
Here the model is the graph, the system is the hardware file, and this is the third: which attention kernel runs,
which communication is overlapped with compute, how FP8 training is done, what the optimizer keeps per parameter,
what selective recompute means, and how much of HBM the allocator and runtime keep for themselves.

Stacks are named presets (`stacks/*.toml`, one per stack people run, each
with its sources) or a TOML file a user writes; a file may start from a
preset with `base = "megatron-core"` and change what differs. Unknown keys
are refused, so a typo cannot fall back to a default.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from cost_models import SpecError
from cost_models.expert_load import load_imbalance
from cost_models.loader import GIB
from cost_models.toml_table import Table
from cost_models.memory import StateBytes

from planner.costing.loss import LOSS_KERNELS
from planner.costing.ring_merge import RING_KINDS
from planner.costing.stack_choices import (ATTENTION, CUDA_GRAPH_SCOPES, DISPATCHERS, FP8_ATTENTION_RECIPES,
                                          FULL_LAYERS_BESIDE, MAX_ALLOCATOR_RESERVE, RECIPE_CAST_BYTES,
                                          RECOMPUTE_MODULES, RECOMPUTE_POLICIES, ROUTINGS, SELECTIVE, Attention,
                                          Dispatcher, Routing, Selective)
from planner.errors import InvalidInput

STACK_DIR = Path(__file__).parent / "stacks"
DEFAULT_STACK = "megatron-core"


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """How a stack runs a training or serving step (see the module docstring); every field has a preset value."""

    name: str
    description: str = ""
    sources: tuple[str, ...] = ()
    origin: str = ""  # what named it: a preset's name or the path of its file (what a declaration records)
    # kernels
    attention: Attention = "flash"  # fused attention: no seq x seq scores in HBM or in saved activations
    attention_kernel: str = "flash"  # the kernel whose efficiency the hardware file gives ([efficiency.attention])
    fuse_elementwise: bool = True  # chains of memory-bound ops run as one kernel (fused kernels, torch.compile)
    fused_launches: bool = False  # a fused chain issues one kernel: its ops that feed only their chain launch
    # nothing of their own (hand-written fused kernels: Transformer Engine's RMSNorm, Megatron's bias-SwiGLU and
    # RoPE); False: each graph op keeps its launch (Inductor's kernel count is not what this rule predicts)
    fuse_sibling_gemms: bool = True  # projections of one input run as one GEMM (Megatron's linear_qkv, linear_fc1)
    kernel_efficiency: float = 1.0  # this stack's GEMM and attention kernels against the hardware file's fit
    cuda_graphs: tuple[str, ...] = ()  # what runs from CUDA graphs (CUDA_GRAPH_SCOPES; none by default): a
    # captured kernel is replayed by the device, so the host issues nothing for it (`NodeTimes`)
    loss_kernel: str = "megatron"  # the training loss's cross-entropy kernel (`planner.costing.loss`; fitted with it)
    expert_gemm_streams: int = 0  # routed experts' GEMMs: one grouped kernel (0), or one GEMM per local expert
    # issued round-robin over this many streams (Transformer Engine's GroupedLinear on cuBLAS: 4), so each
    # round of that many GEMMs pays the per-kernel overhead once and the host issues each GEMM (`NodeTimes`)
    expert_bias_bytes: float = 0.0  # HBM bytes per element of adding a routed expert's output bias beside the
    # grouped GEMM, forward (and `expert_bias_grad_bytes` backward), where the stack does not fuse it into the GEMM;
    # 0: the bias add is costed as any elementwise op of the graph (`NodeTimes`, `GraphFacts.expert_out_bias`)
    expert_bias_grad_bytes: float = 0.0
    glu_clamp_bytes: float = 0.0  # HBM bytes per element of each clamped half of a routed gated activation's input
    # (gpt-oss's gate and linear halves, clamped at 7), forward (and `glu_clamp_grad_bytes` backward), where the stack
    # clamps and concatenates them outside its fused activation; 0: the clamps run inside it (`NodeTimes`,
    # `GraphFacts.glu_clamp`)
    glu_clamp_grad_bytes: float = 0.0
    scaled_rope_unfused: bool = False  # a YaRN-scaled RoPE (gpt-oss) as eager ops, not fused (`costing.rotary`)
    cp_merge: str = "none"  # how context parallelism's ring steps merge beside the kernels (`costing.ring_merge`)
    tp_layout_copies: bool = False  # sequence-parallel collectives gather and scatter a dimension after the batch
    # ([batch, seq, hidden], torch DTensor's Shard(1)), so NCCL's dim-0 buffers are copied once more in HBM: each
    # reduce-scatter's input, and each all-gather's output when a micro-batch holds several sequences
    # (`stage_costs`); Megatron-Core's [seq, batch, hidden] gathers dim 0 and copies nothing; torch's async TP's fused
    # all-gather-matmul and matmul-reduce-scatter take the layout as views (_symmetric_memory: movedim around chunks)
    # overlaps: each hides behind the compute it runs beside; together they share that compute (see step_time)
    # parallelism
    sequence_parallel: bool = True  # tensor parallelism with sequence parallelism (Korthikanti 2022), which a plan
    # takes wherever tp > 1; false: the stack splits the linears only (DeepSpeed's AutoTP)
    overlap_grad_reduce: bool = True  # data-parallel gradient reduction during the backward pass
    overlap_param_gather: bool = True  # distributed-optimizer parameter all-gather during the next forward
    fsdp_prefetch: bool = True  # ZeRO-3 / FSDP: the next layer's parameters gathered during this layer's compute
    fsdp_gathered_with_pp: bool = False  # ZeRO-3 with a pipeline: weights stay gathered over the step (FSDP2 under
    # torchtitan's pipelining does not reshard after forward), gathered and reduce-scattered once per step
    overlap_tp_comm: bool = False  # tensor-parallel all-gather / reduce-scatter inside the GEMMs they feed
    overlap_cp_comm: bool = True  # ring attention's K/V exchange during the attention kernel
    overlap_ep_comm: bool = False  # expert all-to-all beside another micro-batch's layer (Megatron-Core's 1F1B
    # all-to-all overlap with delayed wgrad: `moe_pairing`)
    ep_comm_sm_share: float = 0.0  # in that pairing, the share of the SMs the exchange's kernels hold: beside them
    # the compute runs at the rest and the exchange at full rate; 0: the exchange at the fitted overlap efficiency
    overlap_pp_comm: bool = False  # pipeline sends and receives during compute
    overlap_pp_comm_1f1b: bool = True  # ... in the non-interleaved schedule too (Megatron-Core overlaps them
    # only between virtual stages: schedules.py refuses overlap_p2p_comm without interleaving)
    tp_overlap_share: float = 1.0  # at most this share of each TP all-gather / reduce-scatter its GEMM can hide
    # precision (FP8 applies when the workload's dtype is fp8: its GEMMs run at the fp8 peak)
    fp8_recipe: str = "delayed"
    # HBM bytes per element to quantise one GEMM operand on hardware whose FP8 GEMMs take only the TN layout
    # (Hopper, Ada), any amax pass and transposed copy included: the recipe's (RECIPE_CAST_BYTES; delayed
    # scaling's by default) unless the stack states its own
    fp8_cast_bytes: float = RECIPE_CAST_BYTES["delayed"][0]
    # of those, the transposed copy's: not written where FP8 GEMMs take any layout (Device.fp8_any_layout:
    # Blackwell); 0 when the stack writes none or its copy carries its own scales
    fp8_transpose_bytes: float = RECIPE_CAST_BYTES["delayed"][1]
    fp8_weight_bytes: float = 2.0  # FP8 weight copies kept per parameter (the weight and its transpose)
    fp8_saves_inputs: bool = True  # GEMM inputs saved for backward in FP8 (1 byte per element, not 2)
    fp8_params: bool = False  # FP8 weights instead of 16-bit ones (TE's fp8_model_init, NeMo's fp8_param_gather)
    fp8_weight_cache: bool = False  # without FP8 weights: each weight cast on a step's first micro-batch and its
    # FP8 copies (fp8_weight_bytes) reused by the rest (TE's is_first_microbatch); else cast in every forward
    fp8_all_gather: bool = False  # the data-parallel all-gathers of weights that feed FP8 GEMMs move FP8 (1 byte):
    # NeMo's fp8_param_gather, torchao's enable_fsdp_float8_all_gather under FSDP2
    fp8_tp_all_gather: bool = False  # sequence-parallel all-gathers of FP8 GEMM inputs move FP8: the stack
    # quantizes before it gathers (TE gather_along_first_dim with the input quantizer; torchao Float8 TP plans)
    fp8_attention: bool = False  # the flash kernel runs in FP8 too (Transformer Engine's fp8_dot_product_attention,
    # cuDNN's FP8 SDPA): per-tensor scales under the delayed and current recipes, MXFP8 blocks under mxfp8
    # (`attention_fp8_format`); the hardware's measured FP8 attention figures (`Cluster.attention_fp8_plateau`)
    # model states per parameter
    param_bytes: float = 2.0
    grad_bytes: float = 4.0
    optimizer_bytes: float = 12.0
    main_grad_accumulation: bool = False  # each micro-batch's weight gradients are added into a main gradient kept
    # over the step (grad_bytes wide, read and written by the weight-gradient GEMM: Megatron's main_grad buffers
    # with gradient_accumulation_fusion, TE's fuse_wgrad_accumulation); else each is written once, as wide as
    # the activations (`NodeTimes._wgrad_bytes`)
    # recompute
    selective: Selective = "modules"  # what selective recompute means (see planner.costing.recompute)
    recompute_modules: tuple[str, ...] = ("core_attn",)  # with "modules": which (Megatron's --recompute-modules)
    recompute_policies: tuple[str, ...] = RECOMPUTE_POLICIES  # the recompute settings the stack's framework runs
    full_layers_beside: str = "selective"  # what a chunk's other layers run beside full recompute of its first k
    # (`FULL_LAYERS_BESIDE`: "none", "selective", or "off" where the framework cannot recompute only some layers)
    # memory the stack keeps for itself
    allocator_reserve: float = 0.0  # share of the caching allocator's reserved memory that holds no tensor at
    # the peak (fragmentation, cached free blocks): tensors may fill HBM x (1 - it) (`reserved_bytes`)
    runtime_reserve_gib: float = 0.0  # runtime context, communicator buffers, kernel workspaces
    # mixture of experts
    moe_dispatcher: Dispatcher = "alltoall"
    moe_routing: Routing = "uniform"  # where a token's top-k experts are: drawn uniformly (load-balanced
    # routing, Megatron's forced balancing), k consecutive experts (NeMo Automodel's FakeBalancedGate), or
    # by a learned router that is only pulled towards balance (an auxiliary loss or bias): expert loads spread
    # and the busiest expert-parallel rank sets the pace (`cost_models.expert_load`)
    moe_expert_load_cv: float = 1.6  # with "learned": per-expert load coefficient of variation; fitted on the
    # Megatron MoE ModelZoo's forced-balance against dropless Qwen3-235B runs on 256 H100s, 16k and 64k tokens
    # (benchmarks/fit_expert_load.py); another model, router or training stage is an assumption
    moe_capacity_factor: float = 0.0  # tokens beyond this multiple of an expert's mean load dropped (0: dropless)
    moe_group_limit: int = 0  # routing picks at most this many groups per token (of moe_groups; 0: no limit)
    moe_groups: int = 0  # the groups of consecutive experts that limit counts (DeepSeek-V3's n_group = 8, each 32
    # experts wherever they are placed); 0: the expert-parallel group's nodes
    moe_probs_in_activation: bool = False  # routing weights scale the experts' activation (before their last
    # GEMM), so combining their outputs keeps nothing for backward; else the combine keeps those outputs

    def __post_init__(self) -> None:
        if self.fp8_attention and self.fp8_recipe not in FP8_ATTENTION_RECIPES:
            raise InvalidInput(f"stack {self.name}: fp8_attention runs under a per-tensor or MXFP8 recipe "
                               f"({', '.join(FP8_ATTENTION_RECIPES)}), not {self.fp8_recipe} (Transformer Engine has "
                               "no FP8 attention for it); set fp8_attention = false or change fp8_recipe")
        if self.full_layers_beside not in (*self.recompute_policies, "off"):
            raise InvalidInput(f"stack {self.name}: full_layers_beside is {self.full_layers_beside!r}, which is not "
                               f"among its recompute_policies ({', '.join(self.recompute_policies)}); add it there "
                               "or set full_layers_beside = \"off\"")
        if self.fp8_transpose_bytes > self.fp8_cast_bytes:
            raise InvalidInput(f"stack {self.name}: fp8_transpose_bytes {self.fp8_transpose_bytes:g} is more than "
                               f"fp8_cast_bytes {self.fp8_cast_bytes:g}, of which the transposed copy is a part; "
                               "lower it, or raise fp8_cast_bytes")

    @property
    def whole_step_graph(self) -> bool:
        """Whether the whole training step replays from one CUDA graph (scope "full_iteration"): no host issue."""
        return "full_iteration" in self.cuda_graphs

    @property
    def state(self) -> StateBytes:
        return StateBytes(param_bytes=self.param_bytes, grad_bytes=self.grad_bytes,
                          optimizer_bytes=self.optimizer_bytes)

    def usable_hbm_bytes(self, hbm_bytes: float) -> float:
        """What of a device's HBM the stack can hand to tensors: what the runtime leaves to the caching allocator,
        less the allocator's reserve (so the tensors fit exactly when `reserved_bytes` of them does)."""
        return (hbm_bytes - self.runtime_reserve_gib * GIB) * (1.0 - self.allocator_reserve)

    def reserved_bytes(self, tensor_bytes: float) -> float:
        """What the stack's caching allocator holds when its tensors peak at `tensor_bytes` (what PyTorch's
        `reserved_bytes.all.peak` reports, as torchtitan logs it): the tensors and the reserve's share beside them."""
        return tensor_bytes / (1.0 - self.allocator_reserve)

    def routed_load(self, ep: int, experts: int) -> float:
        """The busiest expert-parallel rank's routed work over the mean (1 unless the router is learned or tokens
        are dropped; `cost_models.expert_load`)."""
        cv = self.moe_expert_load_cv if self.moe_routing == "learned" else 0.0
        return load_imbalance(ep, experts, cv, self.moe_capacity_factor)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["sources"] = list(self.sources)
        return out


def attention_fp8_format(workload) -> str:
    """The FP8 format a workload's flash kernels run in ("fp8": per-tensor scales, "mxfp8"), where its stack runs
    attention in FP8 (`Execution.fp8_attention`) in a training step whose GEMMs run in FP8: Transformer Engine's
    fp8_dot_product_attention takes effect inside its fp8_autocast; "" otherwise (16 bits)."""
    ex = workload.execution
    if not ex.fp8_attention or workload.mode != "train" or workload.dtype != "fp8":
        return ""
    return FP8_ATTENTION_RECIPES[ex.fp8_recipe]


def stays_gathered(strategy, execution: Execution) -> bool:
    """ZeRO-3 weights gathered once per step and kept over its micro-batches (`Execution.fsdp_gathered_with_pp`)."""
    return strategy.zero >= 3 and strategy.pp > 1 and execution.fsdp_gathered_with_pp


def stack_names() -> list[str]:
    """The bundled stack presets, sorted."""
    return sorted(p.stem for p in STACK_DIR.glob("*.toml"))


def load_execution(name_or_path: str | None) -> Execution:
    """A stack preset by name, or a TOML file by path (None: the default stack)."""
    name_or_path = name_or_path or DEFAULT_STACK
    if name_or_path in stack_names():
        return replace(_preset(name_or_path), origin=name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise InvalidInput(f"unknown stack {name_or_path!r}: no preset has that name and no file is there; use one "
                           f"of {', '.join(stack_names())} or the path of a stack .toml file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read stack file {str(path)!r} ({exc}); give a UTF-8 TOML file") from None
    return replace(parse_execution(text, source=path.name, default_name=path.stem), origin=str(name_or_path))


@functools.lru_cache(maxsize=None)
def _preset(name: str) -> Execution:
    return parse_execution((STACK_DIR / f"{name}.toml").read_text(encoding="utf-8"), source=f"{name}.toml",
                           default_name=name)


def stack_cache_clear() -> None:
    """Forget the stack presets read so far (a fit that rewrites one reads it again)."""
    _preset.cache_clear()


def parse_execution(text: str, *, source: str, default_name: str) -> Execution:
    """Check and read one stack file; InvalidInput names the field that is wrong."""
    try:
        data = tomllib.loads(text)
        return _parse(Table(data, "", source), default_name)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{source}: not valid TOML ({exc}); fix the syntax") from None
    except SpecError as exc:
        raise InvalidInput(str(exc).rstrip(".")) from None


_BOOLS = ("fuse_elementwise", "fused_launches", "fuse_sibling_gemms", "tp_layout_copies", "overlap_grad_reduce",
          "overlap_param_gather", "fsdp_prefetch", "fsdp_gathered_with_pp", "overlap_tp_comm", "overlap_cp_comm",
          "overlap_ep_comm", "overlap_pp_comm", "overlap_pp_comm_1f1b", "fp8_saves_inputs", "fp8_params",
          "fp8_weight_cache", "fp8_all_gather", "fp8_tp_all_gather", "fp8_attention", "moe_probs_in_activation",
          "main_grad_accumulation", "scaled_rope_unfused", "sequence_parallel")
_NUMBERS = ("fp8_cast_bytes", "fp8_transpose_bytes", "fp8_weight_bytes", "param_bytes", "grad_bytes",
            "optimizer_bytes", "runtime_reserve_gib", "kernel_efficiency", "tp_overlap_share",
            "moe_expert_load_cv", "moe_capacity_factor", "expert_bias_bytes", "expert_bias_grad_bytes",
            "glu_clamp_bytes", "glu_clamp_grad_bytes", "ep_comm_sm_share")
_CHOICES = {"attention": ATTENTION, "selective": SELECTIVE, "full_layers_beside": FULL_LAYERS_BESIDE,
            "moe_dispatcher": DISPATCHERS, "moe_routing": ROUTINGS, "loss_kernel": LOSS_KERNELS, "cp_merge": RING_KINDS}


_SECTIONS = {
    "kernels": ("attention", "attention_kernel", "fuse_elementwise", "fused_launches", "fuse_sibling_gemms",
                "tp_layout_copies", "kernel_efficiency", "expert_gemm_streams", "expert_bias_bytes",
                "expert_bias_grad_bytes", "glu_clamp_bytes", "glu_clamp_grad_bytes", "scaled_rope_unfused",
                "loss_kernel", "cp_merge", "cuda_graphs"),
    "overlap": tuple(b for b in _BOOLS if b.startswith(("overlap_", "fsdp_"))) + ("tp_overlap_share",
                                                                                  "ep_comm_sm_share"),
    "precision": ("fp8_recipe", "fp8_cast_bytes", "fp8_transpose_bytes", "fp8_weight_bytes", "fp8_saves_inputs",
                  "fp8_params", "fp8_weight_cache", "fp8_all_gather", "fp8_tp_all_gather", "fp8_attention"),
    "states": ("param_bytes", "grad_bytes", "optimizer_bytes", "main_grad_accumulation"),
    "recompute": ("selective", "recompute_modules", "recompute_policies", "full_layers_beside"),
    "parallel": ("sequence_parallel",),
    "memory": ("allocator_reserve", "runtime_reserve_gib"),
    "moe": ("moe_dispatcher", "moe_routing", "moe_group_limit", "moe_groups", "moe_probs_in_activation",
            "moe_expert_load_cv", "moe_capacity_factor"),
}
FIELDS: tuple[str, ...] = tuple(k for keys in _SECTIONS.values() for k in keys)


def with_changes(execution: Execution, changes: dict[str, Any], where: str) -> Execution:
    """`execution` with some of its fields changed (as a stack file writes them, without the sections),
    each checked as a stack file's would be."""
    t = Table(changes, "execution", where)
    try:
        t.only(*FIELDS)
        return replace(execution, **_with_recipe_casts({key: _value(t, key) for key in sorted(changes)}))
    except SpecError as exc:
        raise InvalidInput(str(exc).rstrip(".")) from None


def _with_recipe_casts(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` with the cast bytes of the FP8 recipe they name (`RECIPE_CAST_BYTES`), unless they state them."""
    recipe = changes.get("fp8_recipe")
    if recipe not in RECIPE_CAST_BYTES or "fp8_cast_bytes" in changes or "fp8_transpose_bytes" in changes:
        return changes
    cast, transpose = RECIPE_CAST_BYTES[recipe]
    return changes | {"fp8_cast_bytes": cast, "fp8_transpose_bytes": transpose}


def _value(t: Table, key: str) -> Any:
    """One checked field of a stack file's section."""
    if key in _BOOLS:
        return t.boolean(key)
    if key == "ep_comm_sm_share":
        value = t.number(key, allow_zero=True)
        if value >= 1.0:
            raise t.error(key, f"expected a share of the SMs below 1, got {value:g}")
        return value
    if key in ("kernel_efficiency", "tp_overlap_share"):
        value = t.number(key)
        most = 1.5 if key == "kernel_efficiency" else 1.0
        if value > most:
            raise t.error(key, f"expected a positive fraction (at most {most:g}), got {value:g}")
        return value
    if key in _NUMBERS:
        return t.number(key, allow_zero=key in ("fp8_transpose_bytes", "fp8_weight_bytes", "runtime_reserve_gib",
                                                "grad_bytes", "moe_expert_load_cv", "moe_capacity_factor",
                                                "expert_bias_bytes", "expert_bias_grad_bytes", "glu_clamp_bytes",
                                                "glu_clamp_grad_bytes"))
    if key in _CHOICES:
        return t.choice(key, _CHOICES[key])
    if key in ("moe_group_limit", "moe_groups", "expert_gemm_streams"):
        return t.integer(key, minimum=0)
    if key == "recompute_modules":
        mods = t.texts(key)
        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if bad or not mods:
            raise t.error(key, f"expected a list of {', '.join(RECOMPUTE_MODULES)}, got {mods!r}")
        return tuple(mods)
    if key == "recompute_policies":
        policies = t.texts(key)
        if not policies or any(p not in RECOMPUTE_POLICIES for p in policies):
            raise t.error(key, f"expected a list of {', '.join(RECOMPUTE_POLICIES)}, got {policies!r}")
        return tuple(p for p in RECOMPUTE_POLICIES if p in policies)
    if key == "cuda_graphs":
        return _graph_scopes(t, key)
    if key == "allocator_reserve":
        value = t.number(key, allow_zero=True)
        if value >= MAX_ALLOCATOR_RESERVE:
            raise t.error(key, f"expected a fraction of the reserved memory below {MAX_ALLOCATOR_RESERVE:g}, "
                               f"got {value:g}")
        return value
    return t.text(key)


def _graph_scopes(t: Table, key: str) -> tuple[str, ...]:
    """CUDA-graph scopes as Megatron-Core takes them (TransformerConfig.__post_init__ at core_v0.16.1): the full
    iteration alone; not "moe" beside "moe_router" (both capture the router); "moe_preprocess" only with
    "moe_router"."""
    scopes = t.texts(key)
    bad = [m for m in scopes if m not in CUDA_GRAPH_SCOPES]
    if bad or ("full_iteration" in scopes and len(scopes) > 1):
        raise t.error(key, f"expected [\"full_iteration\"] or a list of {', '.join(CUDA_GRAPH_SCOPES[1:])} "
                           f"(Megatron-Core's cuda_graph_modules), got {scopes!r}")
    if "moe" in scopes and "moe_router" in scopes:
        raise t.error(key, "\"moe\" already captures the router: give \"moe\" or \"moe_router\", not both")
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        raise t.error(key, "\"moe_preprocess\" is captured only together with \"moe_router\"; add it")
    return tuple(dict.fromkeys(scopes))


def _parse(root: Table, default_name: str) -> Execution:
    root.only("stack", "kernels", "overlap", "precision", "states", "recompute", "parallel", "memory", "moe")
    meta = root.table("stack")
    meta.only("name", "description", "sources", "base")
    base = meta.text("base", default="")
    if base and base not in stack_names():
        raise meta.error("base", f"unknown stack {base!r}; use one of {', '.join(stack_names())}")
    start = _preset(base) if base else Execution(name=default_name)
    changes: dict[str, Any] = {"name": meta.text("name", default=default_name)}
    if "description" in meta.data or not base:
        changes["description"] = meta.text("description", default="")
    if "sources" in meta.data:
        changes["sources"] = tuple(meta.texts("sources"))
    for section, keys in _SECTIONS.items():
        t = root.table(section, required=False)
        t.only(*keys)
        for key in keys:
            if key in t.data:
                changes[key] = _value(t, key)
    return replace(start, **_with_recipe_casts(changes))


__all__ = ["DEFAULT_STACK", "FIELDS", "Execution", "attention_fp8_format",
           "load_execution", "parse_execution", "stack_cache_clear", "stack_names", "stays_gathered",
           "with_changes"]
