"""What a training launch configuration reads from a declaration, and how it says what it cannot write.

Launch configs (Megatron-LM arguments, a torchtitan job file, a DeepSpeed
JSON, a MindFormers YAML) carry a plan's degrees and policies, not its
per-tensor layouts: each framework lays tensors out its own way
(Megatron-LM's column- and row-parallel linears, a vocabulary-split
embedding). So a backend reads the strategy back as the declaration states
it (`Training`), refuses in one sentence what its format cannot say before
anything is written (`refuse`), and notes where the declared layouts are not
what the framework will run (`layout_notes`). Serving declarations go to the
vllm and sglang backends (`serving_launch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cost_models import load_cluster
from planner.costing.execution import Execution, attention_fp8_format, load_execution
from planner.errors import ExportRefused, InvalidInput
from planner.hypershard.declared import chunk_layers, strategy_of
from planner.hypershard.io import beside
from planner.hypershard.layouts import dim_axes
from planner.hypershard.programs import is_multi, is_serving
from planner.strategy import Strategy


@dataclass(frozen=True, slots=True)
class Written:
    """What a launch backend writes, as data (`config`, JSON-able), and what the user should know of it."""

    config: Any
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """One training program's plan as launch configs read it (`training` builds it from a declaration)."""

    model: str
    params: int
    cluster: str
    devices: int
    s: Strategy
    global_batch: int
    seq_len: int
    dtype: str  # the workload's compute dtype: bf16, fp16, fp8 (GEMMs in FP8 by the stack's recipe) or fp32
    micro_batches: int  # per pipeline per step
    chunks: tuple[int, ...]  # decoder layers per pipeline chunk, chunk order (chunk c runs on stage c mod pp)
    moe: bool  # routed experts are declared (an ep alias on the mesh)
    execution: Execution  # the stack the plan was scored with: overlaps, FP8 recipe, what selective recompute is
    embedding: str  # how the token embedding is split over tp: "vocab", "hidden" or "whole"
    split_scales: tuple[str, ...]  # the norm scales the declaration splits over tp (a framework keeps them whole)
    split_tables: tuple[str, ...]  # tables added elementwise (a learned position table) it splits over tp (likewise)
    split_routers: tuple[str, ...]  # the MoE routers' weights it splits over tp (likewise)
    step_s: float | None
    peak_gib: float | None
    mtp: int = 0  # of the layers, the last ones that are multi-token-prediction depths (the declaration's model)
    cluster_spec: str = ""  # the cluster's preset name or hardware file, as the declaration names it (resolved)

    @property
    def mode(self) -> str:
        """What the plan runs, as a workload says it (`attention_fp8_format` reads it): a launch config trains."""
        return "train"

    @property
    def scale_up(self) -> int:
        """Devices in one domain of the cluster's innermost interconnect level (NVLink: 8 on a DGX; all of them when
        it has one level), read from its hardware file when asked (a MoE plan's exchange)."""
        cluster = load_cluster(self.cluster_spec, devices=self.devices)
        return cluster.levels[0].group_size or cluster.n_devices

    @property
    def layers(self) -> int:
        return sum(self.chunks)

    @property
    def equal_chunks(self) -> bool:
        return len(set(self.chunks)) <= 1

    def offload(self, cls: str) -> float:
        return self.s.offload_fraction(cls)


def mpmd_what(names: list[str]) -> str:
    """What a launch config cannot express of a plan of several programs on their own device groups."""
    return f"{len(names)} programs on their own device groups (HyperMPMD: {', '.join(names)})"


def training(doc: Mapping[str, Any], backend: str, base_dir: str | None = None) -> Training:
    """The plan of a one-program training declaration (InvalidInput, one sentence, for a serving or HyperMPMD
    one)."""
    if is_serving(doc):
        raise InvalidInput(f"the {backend} backend writes a training launch config, and this declaration is of a "
                           "serving plan; export it with --backend vllm or sglang")
    if is_multi(doc):
        what = mpmd_what([p["name"] for p in doc["programs"]])
        raise ExportRefused(f"the {backend} backend cannot express a plan of {what}; one launch config runs one "
                            "program, so plan with --no-mpmd, or export with --backend torch", what)
    s = strategy_of(doc)
    chunks = chunk_layers(doc)
    est = doc.get("estimate") or {}
    mesh = doc["meshes"][0]
    return Training(
        model=doc["model"]["name"], params=doc["model"]["params"], cluster=doc["cluster"]["name"],
        devices=doc["cluster"]["devices"], s=s, global_batch=doc["workload"]["global_batch"],
        seq_len=doc["workload"]["seq_len"], dtype=doc["workload"]["dtype"],
        micro_batches=s.micro_batches(_workload(doc)),
        chunks=tuple(len(chunks[c]) for c in sorted(chunks)),
        moe=any(a["name"] == "ep" for a in mesh.get("aliases", [])),
        execution=_stack(doc, base_dir), embedding=embedding_split(doc), split_scales=split_scales(doc),
        split_tables=split_params(doc, lambda e: e.get("op") == "scale" and len(e["dims"]) > 1),
        split_routers=split_params(doc, lambda e: bool(e.get("router"))),
        step_s=est.get("step_time_s"), peak_gib=(est.get("memory_gib") or {}).get("peak"),
        mtp=int(doc["model"].get("mtp_layers", 0)), cluster_spec=beside(doc["cluster"]["spec"], base_dir) or "",
    )


def _workload(doc: Mapping[str, Any]) -> Any:
    from planner.hypershard.declared import workload_of

    return workload_of(doc)


def _stack(doc: Mapping[str, Any], base_dir: str | None) -> Execution:
    """The declaration's stack: a preset by name, or its file (tried beside the declaration when relative)."""
    return load_execution(beside(doc["workload"].get("stack"), base_dir))


def embedding_split(doc: Mapping[str, Any]) -> str:
    """How the declaration splits its token embedding over tp: "vocab" (dim 0), "hidden" (dim 1) or "whole"."""
    for entry in doc["layouts"]["params"].values():
        if entry.get("op") == "embedding":
            dims = entry["dims"]
            for k, name in ((0, "vocab"), (1, "hidden")):
                if len(dims) > k and "tp" in dim_axes(dims[k]):
                    return name
            return "whole"
    return "whole"


def split_params(doc: Mapping[str, Any], which) -> tuple[str, ...]:
    """The parameters `which` picks (by entry) that the declaration splits over tp, by name."""
    return tuple(name for name, e in doc["layouts"]["params"].items()
                 if which(e) and any("tp" in dim_axes(d) for d in e["dims"]))


def split_scales(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The norm scales (one-dimensional weights of op "scale") the declaration splits over tp, by name: not a
    linear's bias (a module holding a weight of op "linear" beside it, as torch names them), which a column-parallel
    linear splits with its output."""
    params = doc["layouts"]["params"]
    linears = {name.rsplit(".", 1)[0] for name, e in params.items() if e.get("op") == "linear"}
    return tuple(name for name in split_params(doc, lambda e: e.get("op") == "scale" and len(e["dims"]) == 1)
                 if name.rsplit(".", 1)[0] not in linears)


#: A plan feature a format cannot express, and what to do about it.
Problem = tuple[str, str]


def refuse(backend: str, problems: list[Problem]) -> None:
    """Raise ExportRefused (an InvalidInput) naming, in one sentence, every plan feature the backend's format cannot
    express and what to do (each fix once)."""
    if not problems:
        return
    what = [p[0] for p in problems]
    fixes = list(dict.fromkeys(p[1] for p in problems))
    listed = what[0] if len(what) == 1 else ", ".join(what[:-1]) + " and " + what[-1]
    raise ExportRefused(f"the {backend} backend cannot express this plan's {listed}; {'; '.join(fixes)}", listed)


def offload_problems(t: Training, allowed: Mapping[str, str], hint: tuple[tuple[str, ...], str] = ((), "")
                     ) -> list[Problem]:
    """The offloaded memory classes a format cannot say: every class with a fraction above 0 whose entry in
    `allowed` is missing, or is "whole" while the fraction is below 1. The fix is --no-offload, and `hint`'s text
    too when a refused class is one of its classes (what the format can offload instead)."""
    refused = [(cls, frac) for cls, frac in t.s.offload
               if frac > 0 and (allowed.get(cls) is None or (allowed[cls] == "whole" and frac < 1.0))]
    fix = "plan with --no-offload"
    if hint[1] and any(cls in hint[0] for cls, _ in refused):
        fix += f", or {hint[1]}"
    return [(f"{cls} offload ({frac:.0%})", fix) for cls, frac in refused]


def common_problems(t: Training, schedules: str, mtp: bool = False, graphs: bool = False) -> list[Problem]:
    """What no training launch config here expresses: stages of different tensor widths; for a format whose
    pipeline runs only `schedules`, a GPipe schedule; multi-token-prediction layers unless it builds them (`mtp`);
    and CUDA graphs the estimate costs (`Execution.cuda_graphs`) unless it captures them (`graphs`): launched
    eagerly, the step would pay the host issue the estimate left out."""
    out = []
    if t.execution.cuda_graphs and not graphs:
        out.append((f"CUDA graphs of {', '.join(t.execution.cuda_graphs)} (its launch config captures none)",
                    "plan with a stack whose cuda_graphs is empty, or export with --backend megatron"))
    if t.mtp and not mtp:
        out.append((f"{t.mtp} multi-token-prediction layer{'s' if t.mtp > 1 else ''} (its model code builds none)",
                    "plan without mtp_layers, or export with --backend megatron"))
    if t.s.stage_tp:
        out.append((f"pipeline stages of different tensor widths (TP {'+'.join(map(str, t.s.stage_tp))})",
                    "plan with --tp N (one width for every stage)"))
    if t.s.pp > 1 and t.s.schedule == "gpipe" and "gpipe" not in schedules.lower():
        out.append((f"GPipe schedule (it runs {schedules})", "set programs[0].schedule to 1f1b"))
    return out


def ends_in_place(doc: Mapping[str, Any]) -> bool:
    """The token embedding is on the first pipeline chunk and the output layer on the last, where Megatron-LM,
    torchtitan and MindFormers put them."""
    where: dict[str, int] = {}
    for st in doc["programs"][0]["stages"]:
        for ch in st["chunks"]:
            for name in ch.get("blocks", []):
                where[name] = ch["chunk"]
    last = max(where.values(), default=0)
    params = doc["layouts"]["params"]
    embed = [n.rsplit(".", 1)[0] for n, e in params.items() if e.get("op") == "embedding"]
    head = [n.rsplit(".", 1)[0] for n, e in params.items() if e.get("model_output")]
    return all(where.get(b, 0) == 0 for b in embed) and all(where.get(b, last) == last for b in head)


def ends_problem(t: Training, doc: Mapping[str, Any]) -> list[Problem]:
    if t.s.pp > 1 and not ends_in_place(doc):
        return [("embedding or output layer on another pipeline chunk than the first or last",
                 "move them to programs[0].stages' first and last chunks")]
    return []


def layout_notes(t: Training, framework: str) -> list[str]:
    """Where `framework`'s launch runs otherwise than the estimate scored: declared tensor layouts its tensor
    parallelism does not run (its own layouts, Megatron-LM's: a vocabulary-split embedding; norm weights and a MoE
    router whole on every tensor rank: TopKRouter's weight is a plain Parameter, torchtitan gives the router
    NoParallel, DeepSpeed's AutoTP skips the MoE gate and replaces linears only), and attention in FP8,
    which no generated launch sets (Megatron-LM leaves fp8_dot_product_attention off its command line:
    megatron/training/arguments.py at d7288711 lists it among the config fields without an argument)."""
    out = []
    if t.s.tp > 1 and t.embedding == "hidden":
        out.append(f"the declaration splits the token embedding over tp on its hidden dim; {framework} splits it by "
                   "vocabulary (its own layout), so that one all-gather becomes an all-reduce: the estimate scored "
                   "the declared layout")
    if t.s.tp > 1 and t.split_scales:
        many = len(t.split_scales) > 1
        out.append(f"the declaration splits {len(t.split_scales)} norm scale{'s' if many else ''} over tp "
                   f"({', '.join(t.split_scales[:2])}{', ...' if len(t.split_scales) > 2 else ''}); {framework} keeps "
                   f"norm weights whole on every tensor rank (its own layout): the estimate scored the declared layout")
    if t.s.tp > 1 and t.split_tables:
        out.append(f"the declaration splits {', '.join(t.split_tables)}, added elementwise (a learned position "
                   f"table), over tp; {framework} keeps it whole on every tensor rank (its own layout): the estimate "
                   "scored the declared layout")
    if t.s.tp > 1 and t.split_routers:
        out.append(f"the declaration splits the MoE router's weight over tp ({t.split_routers[0]}); {framework} "
                   f"keeps the router whole on every tensor rank (its own layout): the estimate scored the declared "
                   "layout")
    if attention_fp8_format(t):
        out.append(f"the stack runs attention in FP8 (fp8_attention), which this {framework} launch does not set: "
                   "it runs attention in 16 bits, so its attention differs from what the estimate scored (set "
                   "fp8_dot_product_attention in the model's config to run it)")
    return out


def flex_exchange(t: Training) -> bool:
    """Whether the plan exchanges MoE tokens between expert-parallel ranks through the stack's flex dispatcher
    (`Execution.moe_dispatcher` "deepep": a token sent once to each node and rank its experts are on)."""
    return bool(t.moe) and t.s.ep > 1 and t.execution.moe_dispatcher == "deepep"


def deepep_refused(t: Training) -> str:
    """Why DeepEP's kernels (the flex dispatcher a torchtitan or DeepSpeed launch names) do not run on the plan's
    cluster, or "": one NVLink domain over several nodes (GB200/GB300 NVL72), where Megatron-Bridge v0.6.0 refuses
    DeepEP (training/flex_dispatcher_backend.py, validate_flex_dispatcher_backend) and megatron-core runs HybridEP
    alone (TransformerConfig.moe_flex_dispatcher_backend: "only hybridep supports the MNNVL case")."""
    if (n := t.scale_up) > 8:
        return (f"on an NVLink domain of {n} devices over several nodes DeepEP does not run, and HybridEP, "
                "which does, is not among its backends")
    return ""


def alltoall_note(framework: str, why: str) -> str:
    """The note of a launch that exchanges by an all-to-all of every copy a plan costed with the flex dispatcher."""
    return (f"the stack sends a MoE layer's tokens through the flex dispatcher (DeepEP: a token once to each node and "
            f"rank its experts are on), which this {framework} launch does not run ({why}): its all-to-all sends every "
            "copy, so the expert exchange takes longer than the estimate scored")


def header(t: Training, what: str) -> list[str]:
    """The lines opening a generated launch config (without comment marks): what, for which plan, and figures."""
    lines = [f"{what} for {t.model} ({t.params:,} parameters) on {t.devices} devices of {t.cluster}.",
             f"Strategy: {t.s.short()}; global batch {t.global_batch} x {t.seq_len} tokens, {t.dtype}; planned for "
             f"the {t.execution.name} stack."]
    if t.step_s is not None and t.peak_gib is not None:
        lines.append(f"Estimated step {t.step_s:.4g} s, peak {t.peak_gib:.2f} GiB per device (hyperplan's "
                     "analytic estimate as the declaration records it; `hyperplan validate` re-scores it).")
    lines.append("Generated by `hyperplan export` from a HyperShard declaration; regenerate rather than edit.")
    return lines


def node_size(doc: Mapping[str, Any], base_dir: str | None = None) -> int | None:
    """Devices per node of the declaration's cluster (its first interconnect level), or None when the cluster
    cannot be loaded here."""
    from cost_models import SpecError, load_cluster

    try:
        hw = load_cluster(beside(doc["cluster"]["spec"], base_dir), devices=doc["cluster"]["devices"])
    except (SpecError, InvalidInput, OSError):
        return None
    size = hw.levels[0].group_size if hw.levels else None
    return min(size, hw.n_devices) if size else None
