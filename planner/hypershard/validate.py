"""`hyperplan validate`: does a declaration fit its model, its cluster and its memory, and is its estimate true?

Checks, in order, each a line of the report: the schema (on reading); the
model (file hash, parameter count); the strategy the sections describe; the
cluster (mesh size, rank placement, stage rank groups); the pipeline (every
layer once, in order, in chunks of at least one); the layouts (every
parameter has exactly one, of its rank, over known axes, dividing its
dims); the memory fit; and the re-estimate, which must equal the recorded
one exactly (the same inputs give the same figures, byte for byte).
Differences between the declared layouts or rules and what the strategy
implies are warnings: backends apply what is declared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from cost_models.errors import SpecError

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.hypershard.declared import Scored, chunk_layers, request_of, score, strategy_of, workload_of
from planner.hypershard.document import build_document, file_sha256
from planner.hypershard.io import check_schema
from planner.hypershard.layouts import dim_axes
from planner.hypershard.patterns import expand
from planner.strategy import Strategy

GIB = 2.0**30
_AXES = ("tp", "cp", "dp", "pp", "ep")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class Report:
    """The checks in order, warnings, and the re-estimate (`estimate --json` shape) when one could be made."""

    checks: list[Check] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    estimate: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, problems: list[str], fine: str) -> bool:
        self.checks.append(Check(name, not problems, "; ".join(problems[:3]) + (
            f" (+{len(problems) - 3} more)" if len(problems) > 3 else "") if problems else fine))
        return not problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
                "warnings": list(self.warnings), "estimate": self.estimate}


def validate_document(doc: Mapping[str, Any], name: str = "declaration", base_dir: str | None = None) -> Report:
    """Run every check; InvalidInput only when the file cannot be read as a declaration at all."""
    check_schema(doc, name)
    rep = Report()
    try:
        request = request_of(doc, base_dir)
    except InvalidInput as exc:
        rep.add("model", [str(exc)], "")
        return rep
    m = doc["model"]
    if m["source"] == "file" and m.get("sha256") and file_sha256(request.model) != m["sha256"]:
        rep.add("model", [f"'{m['path']}' changed since the plan was made (its sha256 differs); re-plan, or set "
                          "model.sha256 if the change is intended"], "")
        return rep
    try:
        strategy = strategy_of(doc)
        workload = workload_of(doc)
        m_batches = strategy.micro_batches(workload)
    except InvalidInput as exc:
        rep.add("strategy", [str(exc)], "")
        return rep
    rep.add("strategy", [], strategy.short())
    if not rep.add("cluster", _cluster_problems(doc, strategy), f"{doc['cluster']['devices']} devices of "
                   f"{doc['cluster']['name']}, mesh {' x '.join(f'{a}={n}' for a, n in _sizes(strategy) if n > 1) or '1'}"):
        return rep
    try:
        scored = score(request, workload, strategy, doc["cluster"]["devices"])
    except (InvalidInput, SpecError) as exc:
        rep.add("model", [str(exc)], "")
        return rep
    graph, structure = scored.graph, scored.structure
    rep.add("model", _model_problems(doc, graph), f"{m['name']}: {graph.param_count:,} parameters in "
            f"{len(graph.params)} tensors")
    rep.add("pipeline", _pipeline_problems(doc, structure, strategy, m_batches),
            f"{strategy.pp} stage(s) x {strategy.vpp} chunk(s), {m_batches} micro-batches of {strategy.micro_batch}")
    layouts_ok = rep.add("layouts", _layout_problems(doc, graph, strategy), f"{len(graph.params)} parameters, "
                         f"{len(doc['layouts']['params'])} entries")
    _compare_derived(doc, scored, rep, layouts_ok)
    est = scored.plan["estimate"]
    rep.estimate = scored.estimate_view()
    need, have = est["memory_gib"]["peak"], est["hbm_gib"]
    rep.add("memory", [] if est["fits"] else [f"needs {need:.1f} GiB per device and a device has {have:.1f} GiB"],
            f"peak {need:.2f} GiB of {have:.0f} GiB")
    rep.add("estimate", _estimate_problems(doc.get("estimate"), est),
            f"step {est['step_time_s']:.6g} s, peak {need:.6g} GiB: equal to the recorded estimate"
            if doc.get("estimate") else "no recorded estimate to compare; re-estimated")
    return rep


def _sizes(s: Strategy) -> list[tuple[str, int]]:
    return [("tp", s.tp), ("cp", s.cp), ("dp", s.dp), ("pp", s.pp), ("ep", s.ep)]


def _cluster_problems(doc: Mapping[str, Any], s: Strategy) -> list[str]:
    out: list[str] = []
    n = doc["cluster"]["devices"]
    mesh = doc["meshes"][0]
    if s.devices != n:
        out.append(f"mesh axes tp x cp x dp x pp = {s.devices} devices, but cluster.devices is {n}")
    if mesh.get("devices", n) != n:
        out.append(f"meshes[0].devices is {mesh['devices']}, but cluster.devices is {n}")
    stride = 1
    for a in mesh["axes"]:
        if "stride" in a and a["stride"] != stride:
            out.append(f"mesh axis {a['name']} has stride {a['stride']}, but placed fastest-first it is {stride}")
        stride *= a["size"]
    for a in mesh.get("aliases", []):
        if a["name"] != "ep":
            out.append(f"mesh alias {a['name']!r} is unknown; only ep (experts over dp x cp ranks) is")
    prog = doc["programs"][0]
    r = prog.get("ranks", {"first": 0, "count": n})
    if (r["first"], r["count"]) != (0, n):
        out.append(f"programs[0].ranks is {r['first']}..{r['first'] + r['count'] - 1}, but one program runs on "
                   f"all ranks 0..{n - 1}")
    per = n // s.pp if s.pp else n
    for k, st in enumerate(prog["stages"]):
        if st["stage"] != k:
            out.append(f"programs[0].stages[{k}] is stage {st['stage']}; list stages 0..{s.pp - 1} in order")
        elif "ranks" in st and (st["ranks"]["first"], st["ranks"]["count"]) != (k * per, per):
            out.append(f"stage {k} ranks {st['ranks']['first']}..{st['ranks']['first'] + st['ranks']['count'] - 1}"
                       f" differ from the pp placement {k * per}..{(k + 1) * per - 1}")
    if len(prog["stages"]) != s.pp:
        out.append(f"programs[0] lists {len(prog['stages'])} stages, but the pp axis has size {s.pp}")
    return out


def _model_problems(doc: Mapping[str, Any], graph: Graph) -> list[str]:
    m = doc["model"]
    out = []
    if m["params"] != graph.param_count:
        out.append(f"model.params is {m['params']:,}, but the model has {graph.param_count:,} parameters")
    if m["tensors"] != len(graph.params):
        out.append(f"model.tensors is {m['tensors']}, but the model has {len(graph.params)} parameter tensors")
    return out


def _pipeline_problems(doc: Mapping[str, Any], structure: Structure, s: Strategy, m_batches: int) -> list[str]:
    out: list[str] = []
    prog = doc["programs"][0]
    chunks = chunk_layers(doc)
    want = list(range(s.pp * s.vpp))
    if sorted(chunks) != want:
        return [f"chunks {sorted(chunks)} should be 0..{len(want) - 1} (pp x virtual_stages = {len(want)})"]
    for st in prog["stages"]:
        for ch in st["chunks"]:
            if ch["chunk"] % s.pp != st["stage"]:
                out.append(f"chunk {ch['chunk']} is on stage {st['stage']}, but chunk c runs on stage c mod pp "
                           f"= {ch['chunk'] % s.pp}")
            if not ch["layers"]:
                out.append(f"chunk {ch['chunk']} has no layers; every chunk needs at least one")
    listed = [name for c in want for name in chunks[c]]
    layers = [b.name for b in structure.layers()]
    if listed != layers:
        extra = [x for x in listed if x not in set(layers)]
        missing = [x for x in layers if x not in set(listed)]
        why = (f"{extra[0]!r} is not a layer of the model" if extra else f"{missing[0]!r} is missing" if missing
               else "they are out of order or repeated")
        out.append(f"the chunks list {len(listed)} layers and the model has {len(layers)}: {why}")
    if prog.get("micro_batches", m_batches) != m_batches:
        out.append(f"programs[0].micro_batches is {prog['micro_batches']}, but global batch "
                   f"{doc['workload']['global_batch']} / (dp {s.dp} x micro-batch {s.micro_batch}) = {m_batches}")
    return out


def _layout_problems(doc: Mapping[str, Any], graph: Graph, s: Strategy) -> list[str]:
    entries = doc["layouts"]["params"]
    try:
        resolved, missing, unused = expand(entries, graph.params)
    except InvalidInput as exc:
        return [str(exc)]
    out = [f"parameter {p!r} has no layout entry (no exact name or glob matches it)" for p in missing[:3]]
    out += [f"layout entry {k!r} matches no parameter of the model" for k in unused[:3]]
    size = dict(_sizes(s))
    for p, e in resolved.items():
        shape = graph.tensors[p].shape or ()
        if len(e["dims"]) != len(shape):
            out.append(f"{p} has {len(shape)} dims {list(shape)}, its layout gives {len(e['dims'])}")
            continue
        used: list[str] = []
        for d, spec in enumerate(e["dims"]):
            axes = dim_axes(spec)
            bad = [a for a in axes if a not in size]
            if bad:
                out.append(f"{p} dim {d} names mesh axis {bad[0]!r}; use tp, cp, dp, pp or ep")
                continue
            used += axes
            k = math.prod(size[a] for a in axes)
            if shape[d] % k:
                out.append(f"{p} dim {d} ({shape[d]}) does not split evenly over {'x'.join(axes)} = {k}")
        if len(used) != len(set(used)):
            out.append(f"{p} uses a mesh axis on two dims ({used}); an axis splits one dim of a tensor")
    return out


def _estimate_problems(recorded: Mapping[str, Any] | None, est: Mapping[str, Any]) -> list[str]:
    if not recorded:
        return []
    out = []
    if recorded.get("step_time_s") != est["step_time_s"]:
        out.append(f"the recorded step time {recorded.get('step_time_s')} s differs from the re-estimate "
                   f"{est['step_time_s']} s (the declaration was edited, or the cost model changed): "
                   "`hyperplan estimate MODEL --plan FILE` scores it as it is")
    if recorded.get("memory_gib") != est["memory_gib"]:
        out.append(f"the recorded memory {recorded.get('memory_gib')} differs from the re-estimate {est['memory_gib']}")
    return out


def _compare_derived(doc: Mapping[str, Any], scored: Scored, rep: Report, layouts_ok: bool) -> None:
    """Warn where declared layouts or rules differ from those the strategy implies (backends apply the declared)."""
    canon = build_document(scored.plan, scored.graph, scored.structure, scored.request)
    theirs, _, _ = expand(canon["layouts"]["params"], scored.graph.params)
    mine = expand(doc["layouts"]["params"], scored.graph.params)[0] if layouts_ok else {}
    diff = [p for p in scored.graph.params if p in mine and mine[p].get("dims") != theirs[p]["dims"]]
    if diff:
        p = diff[0]
        rep.warnings.append(f"{len(diff)} parameter(s) are declared with other layouts than the estimator chose for "
                            f"this strategy (e.g. {p}: declared {mine[p]['dims']}, estimator {theirs[p]['dims']}); "
                            "backends apply the declared ones, the estimate scores the estimator's")
    for key in ("zero", "recompute", "offload"):
        if doc[key] != canon[key]:
            rep.warnings.append(f"section {key} differs from what the strategy implies ({canon[key]}); "
                                "backends apply the declared one")
