"""Forward and backward seconds of each node of a graph at the micro-batch and shard it runs on.

Three kinds of kernels, each a roofline with the device's efficiency curves
(`cost_models.compute`):
- an op as the graph writes it: its FLOPs and the bytes it moves (chains of
  memory-bound ops fused and permutes folded into their readers' strides,
  `planner.costing.fusion`, when the stack fuses; weight GEMMs of one input run
  as one GEMM when the stack builds them so, `Execution.fuse_sibling_gemms`); backward, a contraction runs
  two GEMMs of its forward's size (input and weight gradients, Narayanan
  2021 section 5.1) and a memory-bound op about its forward's traffic;
- a rotary embedding whose tables are scaled (YaRN), on a stack that runs it
  eagerly (`Execution.scaled_rope_unfused`, `planner.costing.rotary`): its
  graph ops each a kernel at its own bytes, the slices views;
- an attention core as one flash kernel (`planner.costing.attention`) when
  the execution says so: its time is charged to the core's QK^T node and
  the other ops of the core cost nothing;
- in FP8 training, the layers' weight GEMMs at the fp8 peak (forward, and
  both backward GEMMs, as Transformer Engine's and torchao's recipes run
  them), plus the quantisation of their operands: each GEMM input forward
  and each output gradient backward read in 16 bits and written in 8
  (`Execution.fp8_cast_bytes` per element, an amax pass and a transposed
  copy included as the recipe needs them: `cast_bytes_per_element`), and the weight once per
  micro-batch unless the stack keeps FP8 weights (`Execution.fp8_params`:
  Transformer Engine's fp8_model_init casts them at the optimizer step) or
  caches their FP8 copies over a step's micro-batches
  (`Execution.fp8_weight_cache`: TE's is_first_microbatch, once per step).

In training each op also carries what issuing it costs the host of an
eager step (`Cluster.host_overhead_s`, fitted where a hardware has enough
runs), per kernel it launches: none for a sibling GEMM after its group's
first, nor, on a stack of hand-written fused kernels
(`Execution.fused_launches`), for an op that runs inside its readers'
fused kernel (`GraphFacts.absorbed`); one per local expert for a routed
GEMM the stack runs expert by expert (`NodeTimes._expert_loop`; the FP8
quantisation of each expert's rows, issued from the same C++ call, not
counted). ASSUMPTIONS: the charge is added to
the op's time, not hidden behind a long kernel (the per-op and per-pass
maxima were refitted and not landed: benchmarks/CALIBRATION.md); an absorbed op
keeps the law's per-kernel overhead; and the charge also stands in for
per-op costs the model does not yet name.
"""

from __future__ import annotations

from cost_models import Cluster, SpecError
from cost_models.compute import attention_time_s, op_time_s

from planner.costing.attention import AttentionRegion, kept_fraction, pass_window
from planner.costing.execution import Execution, attention_fp8_format, stays_gathered
from planner.costing.graph_facts import GraphFacts
from planner.costing.loss import loss_time_s
from planner.costing.node_work import FLOAT_DTYPES
from planner.costing.ring_merge import ring_pass
from planner.errors import InvalidInput
from planner.strategy import Strategy, Workload

DTYPE_WIDTH = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}
#: Training in a sub-16-bit GEMM precision keeps activations, attention and the rest in 16 bits.
LOW_PRECISION_GEMMS = frozenset({"fp8", "fp4"})


def activation_dtype(workload: Workload) -> str:
    """The precision of activations and non-GEMM ops: bf16 when training runs its GEMMs in FP8."""
    if workload.mode == "train" and workload.dtype in LOW_PRECISION_GEMMS:
        return "bf16"
    return workload.dtype


def adam_bytes_per_param(execution: Execution) -> float:
    """HBM bytes an Adam step reads and writes per parameter under the stack's state widths: the model weight
    read and written (`param_bytes` each way), the gradient read (`grad_bytes`), and the optimizer states read and
    written (`optimizer_bytes`: the two moments, with fp32 master weights where the stack keeps them apart from
    the model's 16-bit weights). Megatron-LM's defaults (2, 4, 12) move 32 bytes; its precision-aware optimizer
    with bf16 moments (8 bytes of state) 24."""
    return 2.0 * execution.param_bytes + execution.grad_bytes + 2.0 * execution.optimizer_bytes


def optimizer_step_s(cluster: Cluster, workload: Workload, params: float) -> float:
    """Seconds of one Adam step over `params` parameters on one device (some 10 FLOPs per parameter)."""
    nbytes = adam_bytes_per_param(workload.execution) * params
    return op_time_s(cluster, 10.0 * params, nbytes, "elementwise", activation_dtype(workload))


def weight_cast_shares(strategy: Strategy, workload: Workload, execution: Execution) -> tuple[float, float]:
    """(dense, routed expert): the share of its tensor- or expert-parallel weight shard a rank quantises to FP8 per
    micro-batch, when the stack keeps 16-bit weights (`Execution.fp8_params` keeps FP8 ones: no cast).

    Cast in every forward, the whole shard; cached over a step's micro-batches (`Execution.fp8_weight_cache`, TE's
    is_first_microbatch), 1/m of it. Gathered by ZeRO-3/FSDP in FP8 (`Execution.fp8_all_gather`), each rank casts
    only its data-parallel slice before the all-gather and the GEMMs read the gathered FP8 weight (torchao
    fsdp_utils.py: WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather quantises the local shard), so 1/(dp x cp)
    of a dense shard and 1/edp of an expert one, at each gather: every micro-batch, or once a step where the
    weights stay gathered over it (`stays_gathered`)."""
    m = strategy.micro_batches(workload)
    if strategy.zero >= 3 and execution.fp8_all_gather:
        per_mb = 1.0 / m if stays_gathered(strategy, execution) else 1.0
        return per_mb / (strategy.dp * strategy.cp), per_mb / strategy.edp
    share = 1.0 / m if execution.fp8_weight_cache else 1.0
    return share, share


class NodeTimes:
    """Per-node seconds of one strategy's micro-batch: `forward(i, k)` and `backward(i, k)` on a 1/k shard."""

    def __init__(self, facts: GraphFacts, cluster: Cluster, workload: Workload, strategy: Strategy,
                 execution: Execution) -> None:
        self.facts, self.cluster, self.execution = facts, cluster, execution
        work = facts.work
        self.training = workload.mode == "train"
        self.dtype = activation_dtype(workload)
        self.width = DTYPE_WIDTH.get(self.dtype, 2.0)
        self.fscale = self.width / work.float_bytes
        self.bs = strategy.micro_batch / work.batch
        self.cp = strategy.cp
        self.ep, self.etp = strategy.ep, strategy.expert_tp
        # fused chains of memory-bound ops skip HBM between them (planner.fusion); eager execution does not
        self.flash = execution.attention == "flash"
        # a scaled rotary embedding the stack runs as eager ops: kernels of their own, its slices views
        eager = execution.fuse_elementwise and execution.scaled_rope_unfused
        self.act = (facts.act_bytes(self.training, self.width, self.flash, True, eager) if execution.fuse_elementwise
                    else facts.work.act_bytes)
        self.absorbed = facts.absorbed(eager) if execution.fuse_elementwise and execution.fused_launches else None
        self.eager_view = facts.scaled_rope_view if eager else None
        self.captured = facts.captured(execution.cuda_graphs) if execution.cuda_graphs else None
        self.fp8 = self.training and workload.dtype in LOW_PRECISION_GEMMS
        self.attention_fp8 = attention_fp8_format(workload)
        if self.attention_fp8 and self.flash:  # say so before any op is costed
            try:
                cluster.attention_fp8_plateau(self.attention_fp8)
            except SpecError as exc:
                raise InvalidInput(str(exc)) from None
        self.gemm_dtype = workload.dtype if self.fp8 else self.dtype
        self.weight_casts = weight_cast_shares(strategy, workload, execution) if self.fp8 else (1.0, 1.0)
        self._fwd: dict[tuple[int, int], float] = {}
        self._bwd: dict[tuple[int, int], float] = {}

    def fused(self, i: int) -> bool:
        """Whether node i is part of a flash kernel (its time, if any, is the kernel's)."""
        return self.flash and i in self.facts.region_of

    def forward(self, i: int, k: int) -> float:
        key = (i, k)
        if key not in self._fwd:
            self._fwd[key] = self._issued(self._time(i, k, backward=False), self._launches(i) + self._ring(i, False))
        return self._fwd[key]

    def backward(self, i: int, k: int) -> float:
        """Node i's backward: none for an op no gradient flows back through (integer indices, masks, shapes)."""
        key = (i, k)
        if key not in self._bwd:
            ops = 2.0 * self._launches(i) + self._ring(i, True)
            self._bwd[key] = self._issued(self._time(i, k, backward=True), ops) \
                if self.training and self.facts.carries_grad[i] else 0.0
        return self._bwd[key]

    def _launches(self, i: int) -> float:
        """Kernels the host issues for node i per pass: none for a sibling GEMM after its group's first (one GEMM
        for all), for a memory-bound op that runs inside its readers' fused kernel (`GraphFacts.absorbed`), or for
        an op the stack replays from a CUDA graph (`GraphFacts.captured`); one a local expert for a routed GEMM the
        stack runs expert by expert (`_expert_loop`). An op the stack runs beside its fused kernels (`_beside_bytes`:
        the experts' output bias loop, a gated activation's clamps, one launch each, the clamps' concatenation's not
        counted), or that it runs eagerly (a scaled rotary embedding: `GraphFacts.scaled_rope`; its slices, views,
        take no time and so no issue: `_issued`), is no fused chain's."""
        if self.captured is not None and self.captured[i]:
            return 0.0
        if self.absorbed is not None and self.absorbed[i] and self._beside_bytes(i) is None:
            return 0.0
        if self._group(i)[0] != i:
            return 0.0
        return float(self._local_experts(i)) if self._expert_loop(i) else 1.0

    def _expert_loop(self, i: int) -> bool:
        """Whether node i is a routed expert GEMM the stack runs as one GEMM per local expert
        (`Execution.expert_gemm_streams`): Transformer Engine's GroupedLinear on cuBLAS
        (common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm, v2.5-v2.18) calls cublasLt once an expert, each call
        building its descriptors and asking cublasLtMatmulAlgoGetHeuristic again, so the host issues each expert's
        GEMM as it issues an op (`_launches`). Checked, not fitted: TE's grouped-linear benchmark on SM100 (PR #3134)
        times that path at 0.267 ms for 8 experts' 128-token NVFP4 GEMMs and a single-launch grouped kernel at
        0.069 ms, 25 us more an expert, against DGX H100's fitted 22 us an op."""
        facts = self.facts
        return self.execution.expert_gemm_streams > 0 and bool(facts.in_routed[i]) and bool(facts.work.matrix[i])

    def _local_experts(self, i: int) -> int:
        """Routed experts of node i's layer on one expert-parallel rank (at least one: `estimate` refuses more
        expert-parallel ranks than experts)."""
        return max(1, int(self.facts.routed_experts[i]) // max(1, self.ep))

    def _issued(self, t: float, ops: float) -> float:
        """An op's time plus what issuing it costs the host of an eager training step (`Cluster.host_overhead_s`,
        fitted; added in full, see the module docstring): `ops` kernels per op, two for a backward (its input and
        its weight gradient)."""
        return t + ops * self.cluster.host_overhead_s if t > 0.0 and self.training else t

    def _time(self, i: int, k: int, backward: bool) -> float:
        facts, work, cluster = self.facts, self.facts.work, self.cluster
        share = self.bs / (k * self.cp)
        if self.fused(i):
            r = facts.region_of[i]
            if i != r.anchor:
                return 0.0
            window = pass_window(r.window, backward, self.attention_fp8)
            kept = r.kept if window == r.window else kept_fraction(r.q_len, r.kv_len, r.causal, window)
            flops = r.flops * kept * (r.backward_ratio if backward else 1.0) * share
            nbytes = r.io_bytes * self.fscale * share * (2.0 if backward else 1.0)  # backward reads dO, writes dQKV
            # key positions a query row's kept tiles cover in one kernel: a CP rank's chunk holds 1/cp of a causal
            # row's keys, a sliding window all of its own unless the chunk is shorter
            keys = min(kept * r.kv_len, r.kv_len / self.cp) if window else kept * r.kv_len / self.cp
            phase = "backward" if backward else "forward"
            t = attention_time_s(cluster, flops, nbytes, phase, self.execution.attention_kernel, keys,
                                 r.head_dim, self.attention_fp8) / self.execution.kernel_efficiency
            t += self._ring_time(r, share, backward)
            return t + (self._attention_casts(r, share, backward) if self.attention_fp8 else 0.0)
        if facts.weight_view[i] or work.host[i] or (self.execution.fuse_elementwise and facts.folded_permute[i]) \
                or (self.flash and facts.mask_built[i]) or (self.eager_view is not None and self.eager_view[i]):
            return 0.0
        if (beside := self._beside_bytes(i)) is not None:
            return self._routed_bytes(i, share, beside[1] if backward else beside[0])
        group = self._group(i)
        flops = work.flops[i] * share
        # a routed expert reads only its rank's experts: 1/(ep x etp) of the layer's expert weights
        weight_share = (1.0 / (self.ep * self.etp)) if facts.in_routed[i] else 1.0 / k
        matrix = bool(work.matrix[i])
        gemm = self.fp8 and bool(facts.fp8_gemm[i])
        dtype = self.gemm_dtype if gemm else self.dtype
        if len(group) > 1:  # one GEMM with its siblings (their input read once): its FLOPs' share of that GEMM
            act = sum(self.act[j] for j in group) - (len(group) - 1) * self._input_bytes(group[0])
            weights = sum(work.param_bytes[j] for j in group) * weight_share
            total = sum(work.flops[j] for j in group) * share
            part = flops / total if total else 1.0 / len(group)
        else:
            act, weights, total, part = self.act[i], work.param_bytes[i] * weight_share, flops, 1.0
        act *= self.bs / (self.cp * k)
        t = op_time_s(cluster, total, (act + weights) * self.fscale, "matmul" if matrix else "elementwise", dtype)
        if backward and matrix and weights > 0:  # the input gradient as the forward, the weight's at its bytes
            t += op_time_s(cluster, total, self._wgrad_bytes(act, weights), "matmul", dtype)
        elif backward and matrix:  # a product of two activations: a gradient for each, each as the forward
            t *= 2.0
        t *= part
        if group[0] == i and self._expert_loop(i):
            t += self._expert_rounds(i) * cluster.kernel_overhead_s * (2.0 if backward else 1.0)
        if matrix:
            t /= self.execution.kernel_efficiency
        if gemm:
            t += self._casts(i, k, share, backward, inputs=group[0] == i)
        if self.training and facts.loss_numel[i] > 0:
            t += loss_time_s(self.cluster, self.execution.loss_kernel, facts.loss_numel[i] * share, backward,
                             self.dtype)
        return t * facts.routed_load(i, self.execution, self.ep)  # the busiest expert-parallel rank sets the pace

    def _ring(self, i: int, backward: bool) -> float:
        """Kernels the host issues beside an attention kernel for context parallelism's ring steps
        (`costing.ring_merge`): at a ringed region's anchor, unless the stack replays it from a CUDA graph."""
        if not self.fused(i) or self.facts.region_of[i].anchor != i or self._launches(i) == 0.0:
            return 0.0
        ring = self._ring_pass(self.facts.region_of[i], backward)
        return ring.launches if ring is not None else 0.0

    def _ring_pass(self, r: AttentionRegion, backward: bool):
        """The stack's ring beside region r's kernels (`ring_merge.ring_pass`); None without one, and for a sliding
        window, which Transformer Engine's p2p ring refuses."""
        return None if r.window else ring_pass(self.execution.cp_merge, self.cp, backward)

    def _ring_time(self, r: AttentionRegion, share: float, backward: bool) -> float:
        """Seconds of the ring steps' copies, merges and accumulations beside one rank's attention kernels
        (`costing.ring_merge`): memory-bound kernels, each paying the per-kernel overhead."""
        if (ring := self._ring_pass(r, backward)) is None:
            return 0.0
        q, kv = self._attention_elements(r, share)
        nbytes = (q * ring.bytes_q + kv * ring.bytes_kv) * self.width / 2.0  # the counts are of 16-bit tensors
        t = op_time_s(self.cluster, 0.0, nbytes, "elementwise", self.dtype)
        return t + (ring.kernels - 1.0) * self.cluster.kernel_overhead_s

    def _attention_elements(self, r: AttentionRegion, share: float) -> tuple[float, float]:
        """Region r's output elements (as many as its queries') and its keys' and values' together, on one rank's
        share of the micro-batch."""
        width = self.facts.work.float_bytes
        o = self.facts.graph.tensors[r.out].nbytes / width * share
        return o, r.io_bytes / width * share - 2.0 * o

    def _attention_casts(self, r: AttentionRegion, share: float, backward: bool) -> float:
        """What Transformer Engine's FP8 attention moves beside its kernel (FusedAttnFunc in
        pytorch/attention/dot_product_attention/backends.py, v2.17): forward it quantizes Q, K and V, backward the
        output gradient, each at the stack's cast bytes less a transposed copy (`Execution.fp8_cast_bytes`, the
        recipe's by default: its attention quantizers ask no columnwise copy under per-tensor scales, utils.py
        get_attention_quantizers; MXFP8's rowwise and columnwise copies are its 4 bytes). Under per-tensor scales
        combine_and_quantize first concatenates Q, K and V in 16 bits (a 2-byte read and write; ASSUMPTION: the
        separate sbhd layout Megatron-Core hands it after RoPE, not a packed one that needs no copy). Under delayed
        scaling the kernel also gives O and dQ, dK, dV in FP8, dequantized to 16 bits (a byte read, two written; dQ,
        dK, dV concatenated first, a byte each way); under current scaling (NVTE_DPA_FP8CS_O_in_F16 on by default)
        and MXFP8 they come out in 16 bits. ASSUMPTIONS: the casts' own kernel launches are not charged (the shipped
        FP8-attention rows replay whole iterations from CUDA graphs), and context parallelism's per-step casts
        (context_parallel.py) are costed as this path's."""
        ex = self.execution
        o, kv = self._attention_elements(r, share)
        qkv = o + kv
        quantize = ex.fp8_cast_bytes - ex.fp8_transpose_bytes
        concat = 2.0 * self.width if self.attention_fp8 == "fp8" else 0.0  # Q, K, V gathered before quantizing
        delayed = ex.fp8_recipe == "delayed"  # the kernel's O and dQ, dK, dV in FP8
        dequantize = 1.0 + self.width  # a byte read, 16 bits written
        if backward:  # dO quantized; under delayed scaling dQ, dK, dV concatenated in FP8 (a byte each way) first
            nbytes = o * quantize + (qkv * (2.0 + dequantize) if delayed else 0.0)
        else:
            nbytes = qkv * (concat + quantize) + (o * dequantize if delayed else 0.0)
        return op_time_s(self.cluster, 0.0, nbytes, "elementwise", self.dtype)

    def _beside_bytes(self, i: int) -> tuple[float, float] | None:
        """HBM bytes per element of node i's output, (forward, backward), where the stack runs the op on routed rows
        outside its fused kernels; None where it does not (either figure 0 and the other too: a fused op).

        - The experts' output bias (`Execution.expert_bias_bytes`): Megatron-Core's TEGroupedMLP._apply_bias
          (megatron/core/transformer/moe/experts.py at core_v0.16.1) takes each local expert's rows and adds its bias
          times the token's routing probability through fp32, then concatenates and casts back. ASSUMPTION: the
          loop's launches (two an expert forward) queue behind the GEMMs before it, so only the op's own issue is
          charged.
        - A clamp of one half of the experts' gated activation input (`Execution.glu_clamp_bytes`): Megatron-Core's
          weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py, core_v0.15.0 to main of 2026-08)
          chunks the input, clamps each half and concatenates them before the fused kernel, so each half is read
          and written by its clamp and again by the concatenation; backward the clamp's gradient reads the gradient
          and the input and writes the gradient, and the chunk's concatenates the halves' gradients."""
        ex, facts = self.execution, self.facts
        if facts.expert_out_bias[i]:
            per = (ex.expert_bias_bytes, ex.expert_bias_grad_bytes)
        elif facts.glu_clamp[i]:
            per = (ex.glu_clamp_bytes, ex.glu_clamp_grad_bytes)
        else:
            return None
        return per if any(b > 0 for b in per) else None

    def _routed_bytes(self, i: int, share: float, per_element: float) -> float:
        """A memory-bound pass of `per_element` HBM bytes per element of node i's output on the busiest
        expert-parallel rank (what a stack spends beside its fused kernels on routed rows)."""
        graph = self.facts.graph
        elements = sum(graph.tensors[o].numel for o in graph.nodes[i].outputs if o in graph.tensors) * share
        t = op_time_s(self.cluster, 0.0, per_element * elements, "elementwise", self.dtype)
        return t * self.facts.routed_load(i, self.execution, self.ep)

    def _wgrad_bytes(self, act: float, weights: float) -> float:
        """HBM bytes of a weight-gradient GEMM whose forward read `act` activation and `weights` weight bytes (at
        the graph's width): the input and the output gradient, as the forward's activations, and the weight
        gradient: added into the step's main gradient, read and written at its width, where the stack accumulates
        there every micro-batch (`Execution.main_grad_accumulation`), else written once at the activations'."""
        per_element = 2.0 * self.execution.grad_bytes if self.execution.main_grad_accumulation else self.width
        return act * self.fscale + weights / self.facts.work.float_bytes * per_element

    def _expert_rounds(self, i: int) -> int:
        """Kernel launches beyond the first of a routed GEMM whose stack runs one GEMM per local expert over
        `Execution.expert_gemm_streams` streams: one per further round of that many GEMMs (the overhead law's t0
        is a kernel's fixed cost; the streams overlap theirs)."""
        return max(0, -(-self._local_experts(i) // self.execution.expert_gemm_streams) - 1)

    def _group(self, i: int) -> tuple[int, ...]:
        """Node i with the sibling GEMMs the stack runs as one with it (`GraphFacts.siblings`), or alone."""
        return self.facts.siblings.get(i, (i,)) if self.execution.fuse_sibling_gemms else (i,)

    def _input_bytes(self, i: int) -> float:
        """Bytes of node i's activation inputs at the graph's batch (what siblings share)."""
        graph, index = self.facts.graph, self.facts.index
        return float(sum(graph.tensors[x].nbytes for x in graph.nodes[i].inputs
                         if x and x in graph.tensors and not index.is_weight(x)))

    def _casts(self, i: int, k: int, share: float, backward: bool, inputs: bool = True) -> float:
        """Quantising an FP8 GEMM's operands: its activation inputs forward (unless `inputs` is False: a sibling
        GEMM's, quantised once by its group's first) and its weight, once per micro-batch, or its share of one
        cast per step when the stack caches FP8 copies; its output gradient backward."""
        graph, facts = self.facts.graph, self.facts
        node = graph.nodes[i]
        if backward:
            elements = sum(graph.tensors[o].numel for o in node.outputs if o in graph.tensors) * share
        else:
            elements = 0.0
            for x in node.inputs:
                t = graph.tensors.get(x) if x else None
                if t is None or t.dtype not in FLOAT_DTYPES:
                    continue
                if facts.index.is_weight(x):  # this rank's shard of the weight (its experts, for routed ones),
                    if not self.execution.fp8_params:  # unless the stack keeps FP8 weights (cast at the update)
                        routed = bool(facts.in_routed[i])
                        elements += t.numel / (self.ep * self.etp if routed else k) * self.weight_casts[routed]
                elif inputs:
                    elements += t.numel * share
        nbytes = cast_bytes_per_element(self.execution, self.cluster.device) * elements
        return op_time_s(self.cluster, 0.0, nbytes, "elementwise", self.dtype) if nbytes > 0 else 0.0


def cast_bytes_per_element(execution, device) -> float:
    """HBM bytes the stack moves to quantise one element of an FP8 GEMM operand on `device`: its stated bytes, less
    the transposed copy's where the device's FP8 GEMMs take any layout (`Device.fp8_any_layout`)."""
    return execution.fp8_cast_bytes - (execution.fp8_transpose_bytes if device.fp8_any_layout else 0.0)


__all__ = ["DTYPE_WIDTH", "NodeTimes", "activation_dtype", "adam_bytes_per_param", "cast_bytes_per_element",
           "optimizer_step_s"]
