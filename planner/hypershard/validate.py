"""`hyperplan validate`: does a declaration fit its model, its cluster and its memory, and is its estimate true?

Checks, in order, each a line of the report: the schema (on reading); the
model (file hash, parameter count); the strategy the sections describe; the
cluster (mesh size, rank placement, stage rank groups); the pipeline (every
layer once, in order, in chunks of at least one); the layouts (every
parameter has exactly one, of its rank, over known axes, dividing its
dims); the memory fit; and the re-estimate, which must equal the recorded
one exactly (the same inputs give the same figures, byte for byte).
The estimate scores the declared parameter layouts (`pins`); layouts it
cannot score fail the layouts check. A declaration of several programs
(HyperMPMD) is checked program by program (each on its own ranks, mesh
and subgraph) and re-estimated as a whole. Rules that differ from what
the strategy implies are warnings: backends apply what is declared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cost_models.errors import SpecError

from planner.errors import InvalidInput
from planner.graph.blocks import Structure
from planner.graph.ir import Graph
from planner.graph.moe import expert_params
from planner.graph.mtp import mtp_depths
from planner.hypershard.declared import (Scored, chunk_layers, cluster_problems, declared_layers, program_parts,
                                         program_workloads, request_of, score_as, view_strategy, workload_of)
from planner.hypershard.document import Request, build_document, file_sha256, recorded_figures
from planner.hypershard.io import check_schema
from planner.hypershard.layouts import dim_axes, partial_problems
from planner.hypershard.patterns import expand
from planner.hypershard.pins import AXES, check_activations, declared_pins, layout_text
from planner.hypershard.programs import is_serving, rank_label, rank_problems, ranks_of, views
from planner.hypershard.roles import param_roles
from planner.hypershard.stages import device_problem, param_widths, placed_ranges
from planner.strategy import Strategy, Workload



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


def validate_document(doc: Mapping[str, Any], name: str = "declaration", base_dir: str | None = None,
                      through: str = "estimate") -> Report:
    """Run every check (`through` "layouts": not the re-estimate); InvalidInput only for an unreadable file."""
    check_schema(doc, name)
    if is_serving(doc):  # a serving plan: prefill and decode programs
        from planner.hypershard.serving_check import validate_serving

        return validate_serving(doc, name, base_dir)
    rep = Report()
    request = model_request(doc, base_dir, rep)
    if request is None:
        return rep
    m = doc["model"]
    try:
        vs = views(doc)
        strategies = [view_strategy(v) for v in vs]
        workload = workload_of(doc)
        wls = program_workloads(doc, workload)
        m_batches = [s.micro_batches(wl) for s, wl in zip(strategies, wls)]
    except InvalidInput as exc:
        rep.add("strategy", [str(exc)], "")
        return rep
    multi = len(vs) > 1
    label = [f"{rank_label(doc, k)}: " if multi else "" for k in range(len(vs))]
    uneven = [f"{lab}sequence parallelism splits each sequence over tp {s.tp}, and {workload.seq_len} tokens do not "
              f"split into {s.tp}" for lab, s in zip(label, strategies) if s.sp and workload.seq_len % s.tp]
    if not rep.add("strategy", uneven, "; ".join(lab + s.short() for lab, s in zip(label, strategies))):
        return rep
    cluster = cluster_problems(doc) + (rank_problems(doc) if multi else [])
    for k, (v, s) in enumerate(zip(vs, strategies)):
        first, _ = ranks_of(doc["programs"][k], doc["cluster"]["devices"])
        cluster += [label[k] + p for p in _cluster_problems(v, s, k, first, multi)]
    meshes = "; ".join(lab + _mesh_text(s) for lab, s in zip(label, strategies))
    if not rep.add("cluster", cluster, f"{doc['cluster']['devices']} devices of {doc['cluster']['name']}, mesh "
                   f"{meshes}"):
        return rep
    try:
        graph, _, parts = program_parts(doc, request, workload)
    except (InvalidInput, SpecError) as exc:
        rep.add("model", [str(exc)], "")
        return rep
    rep.add("model", model_problems(doc, graph, None if multi else parts[0][1]),
            f"{m['name']}: {graph.param_count:,} parameters in {len(graph.params)} tensors"
            + (f", {len(parts)} programs" if multi else ""))
    pipeline, layouts = [], []
    for k, (v, s, (g, st)) in enumerate(zip(vs, strategies, parts)):
        pipeline += [label[k] + p for p in _pipeline_problems(v, st, s, wls[k], m_batches[k], k)]
        layouts += [label[k] + p for p in _layout_problems(v, g, st, s)]
        try:
            check_activations(v, g, st, s, workload.seq_len)
            declared_pins(v, g, st, s)
        except InvalidInput as exc:
            layouts.append(label[k] + str(exc))
    rep.add("pipeline", pipeline, "; ".join(
        f"{lab}{s.pp} stage(s) x {s.vpp} chunk(s), {mb} micro-batches of {s.micro_batch}"
        for lab, s, mb in zip(label, strategies, m_batches)))
    entries = sum(len(v["layouts"]["params"]) for v in vs)
    layouts_ok = rep.add("layouts", list(dict.fromkeys(layouts)), f"{len(graph.params)} parameters, {entries} entries")
    if not layouts_ok or through == "layouts":  # an estimate of other layouts than the declared ones is not the file's
        return rep
    try:
        scored = score_as(doc, request, workload, doc["cluster"]["devices"])
    except (InvalidInput, SpecError) as exc:
        rep.add("estimate", [str(exc)], "")
        return rep
    _compare_derived(doc, vs, [(g, expert_params(g, st)) for g, st in parts], scored, rep)
    est = scored.plan["estimate"]
    rep.estimate = scored.estimate_view()
    rep.warnings += accuracy_changed(doc, rep.estimate)
    need, have = est["memory_gib"]["peak"], est["hbm_gib"]
    rep.add("memory", [] if est["fits"] else [f"needs {need:.1f} GiB per device and a device has {have:.1f} GiB"],
            f"peak {need:.2f} GiB of {have:.0f} GiB")
    problems = _estimate_problems(doc.get("estimate"), est)
    if multi and not problems:  # each program's own figures on its group
        rescored = scored.plan.get("programs") or []
        for k, prog in enumerate(doc["programs"]):
            again = rescored[k].get("estimate") if k < len(rescored) else None
            if prog.get("estimate") and again is not None:
                found = first_difference(prog["estimate"], recorded_figures(again),
                                         f"programs[{k}].estimate")
                if found:
                    problems = [found + " (the declaration was edited, or the cost model changed)"]
                    break
    rep.add("estimate", problems,
            f"step {est['step_time_s']:.6g} s, peak {need:.6g} GiB: equal to the recorded estimate"
            if doc.get("estimate") else "no recorded estimate to compare; re-estimated")
    return rep


def accuracy_changed(doc: Mapping[str, Any], now: Mapping[str, Any] | None) -> list[str]:
    """A note when what the declaration says of its figures' accuracy is not what its re-estimate says now (its
    hardware was refitted, or runs were added since it was written)."""
    said, says = (doc.get("accuracy") or {}).get("sentence"), ((now or {}).get("accuracy") or {}).get("sentence")
    return ([f"how far off its estimate may be changed since it was planned (a refit, or runs added): then {said}; "
             f"now {says}"] if said and says and said != says else [])


def _hashed(model: str) -> str:
    """The file a declaration's sha256 is of: the ONNX file, or a config.json (of a folder, its config.json)."""
    from planner.model_source import content_file

    return content_file(model) or model


def model_request(doc: Mapping[str, Any], base_dir: str | None, rep: Report) -> Request | None:
    """The model and cluster to rebuild, or None with a failed model check (a missing or changed model file)."""
    try:
        request = request_of(doc, base_dir)
    except InvalidInput as exc:
        rep.add("model", [str(exc)], "")
        return None
    m = doc["model"]
    changed = m.get("sha256") and file_sha256(_hashed(request.model)) != m["sha256"]
    if m["source"] in ("file", "hf_config") and changed:
        rep.add("model", [f"'{m['path']}' changed since the plan was made (its sha256 differs); re-plan, or set "
                          "model.sha256 if the change is intended"], "")
        return None
    return request


def _sizes(s: Strategy) -> list[tuple[str, int]]:
    return [("tp", s.tp), ("cp", s.cp), ("dp", s.dp), ("pp", s.pp), ("ep", s.ep)]


def _mesh_text(s: Strategy) -> str:
    """'tp=8 x dp=2 x pp=2', or with stages of different widths 'tp=4+8 x dp=2 x pp=2'."""
    tp = "+".join(map(str, s.stage_tp)) if s.stage_tp else None
    return " x ".join(f"{a}={tp if a == 'tp' and tp else n}" for a, n in _sizes(s) if n > 1) or "1"


def _cluster_problems(v: Mapping[str, Any], s: Strategy, k: int, first: int, multi: bool) -> list[str]:
    """One program's view: its mesh against its rank count, and its stages against the pp placement."""
    out: list[str] = []
    n = v["cluster"]["devices"]
    mesh = v["meshes"][0]
    count = f"programs[{k}].ranks.count" if multi else "cluster.devices"
    problem = device_problem(v, s, n, count)
    if problem:
        out.append(problem)
    if mesh.get("devices", n) != n:
        out.append(f"mesh {mesh['name']!r} has {mesh['devices']} devices, but {count} is {n}")
    stride = 1
    for a in mesh["axes"]:
        if s.stage_tp and a["name"] == "pp":
            if a.get("stride") is not None:
                out.append(f"mesh axis pp has stride {a['stride']}, but stages of different widths have no one "
                           "stride; set it to null (each stage's ranks say where it runs)")
        elif a.get("stride", stride) != stride:
            out.append(f"mesh axis {a['name']} has stride {a['stride']}, but placed fastest-first it is {stride}")
        stride *= a["size"]
    for a in mesh.get("aliases", []):
        if a["name"] != "ep":
            out.append(f"mesh alias {a['name']!r} is unknown; only ep (experts over dp x cp ranks) is")
        elif [x for x in ("tp", "cp", "dp") if x in a.get("within", ())] != list(a.get("within", ())):
            out.append(f"mesh alias ep is within {a['within']}; experts fold over the stage's axes fastest first: "
                       "[cp, dp] (their weights split over tp too) or [tp, cp, dp] (whole on each rank)")
    prog = v["programs"][0]
    r = prog.get("ranks", {"first": 0, "count": n})
    if (r["first"], r["count"]) != (0, n):
        out.append(f"programs[{k}].ranks is {r['first']}..{r['first'] + r['count'] - 1}, but one program runs on "
                   f"all ranks 0..{n - 1}")
    placed = placed_ranges(s) if len(prog["stages"]) == s.pp else []
    how = "the placement of stages of different widths (widest first)" if s.stage_tp else "the pp placement"
    for i, st in enumerate(prog["stages"]):
        if st["stage"] != i:
            out.append(f"programs[{k}].stages[{i}] is stage {st['stage']}; list stages 0..{s.pp - 1} in order")
        elif "ranks" in st and placed and (st["ranks"]["first"], st["ranks"]["count"]) != placed[i]:
            a, c = placed[i]
            lo = st["ranks"]["first"] + first
            out.append(f"stage {i} ranks {lo}..{lo + st['ranks']['count'] - 1} differ from {how} {a + first}.."
                       f"{a + c + first - 1}; set stages[{i}].ranks to first {a + first}, count {c}")
    if len(prog["stages"]) != s.pp:
        out.append(f"programs[{k}] lists {len(prog['stages'])} stages, but the pp axis has size {s.pp}")
    return out


def model_problems(doc: Mapping[str, Any], graph: Graph, structure: Structure | None = None) -> list[str]:
    m = doc["model"]
    out = []
    if m["params"] != graph.param_count:
        out.append(f"model.params is {m['params']:,}, but the model has {graph.param_count:,} parameters")
    if m["tensors"] != len(graph.params):
        out.append(f"model.tensors is {m['tensors']}, but the model has {len(graph.params)} parameter tensors")
    if structure is not None and m.get("mtp_layers", 0) != (have := mtp_depths(graph, structure)):
        out.append(f"model.mtp_layers is {m.get('mtp_layers', 0)}, but {have} of the model's last layers are "
                   "multi-token-prediction depths (layers that embed the token ids again)")
    return out


def _pipeline_problems(doc: Mapping[str, Any], structure: Structure, s: Strategy, wl: Workload, m_batches: int,
                       k: int) -> list[str]:
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
            end = ch["chunk"] in (0, len(want) - 1) and ch.get("blocks")  # the embedding or the loss alone
            if not ch["layers"] and not end:
                out.append(f"chunk {ch['chunk']} has no layers; every chunk needs at least one, but the first and "
                           "the last, which may hold only blocks (the embedding, the final norm and head)")
    listed = declared_layers(doc)  # chunks are 0..pp x vpp - 1 here
    layers = [b.name for b in structure.layers()]
    if listed != layers:
        extra = [x for x in listed if x not in set(layers)]
        missing = [x for x in layers if x not in set(listed)]
        why = (f"{extra[0]!r} is not a layer of the model" if extra else f"{missing[0]!r} is missing" if missing
               else "they are out of order or repeated")
        out.append(f"the chunks list {len(listed)} layers and the model has {len(layers)}: {why}")
    if prog.get("micro_batches", m_batches) != m_batches:
        out.append(f"programs[{k}].micro_batches is {prog['micro_batches']}, but global batch "
                   f"{wl.global_batch} / (dp {s.dp} x micro-batch {s.micro_batch}) = {m_batches}")
    return out


def _layout_problems(doc: Mapping[str, Any], graph: Graph, structure: Structure, s: Strategy) -> list[str]:
    """Every parameter has one layout of its rank, over known axes, splitting its dims evenly (over the tensor
    degree of each stage that holds it, when stages differ in width)."""
    widths = param_widths(doc, structure, s)
    size = dict(_sizes(s))

    def uneven(p: str, d: int, axes: tuple[str, ...], n: int) -> str | None:
        for tp in widths.get(p, (size["tp"],)):
            k = math.prod(tp if a == "tp" else size[a] for a in axes)
            if n % k:
                return f"{p} dim {d} ({n}) does not split evenly over {'x'.join(axes)} = {k}"
        return None

    out = entry_problems(doc["layouts"]["params"], graph, AXES, uneven)
    if out or max((size["tp"], *s.stage_tp)) == 1:  # with one tensor rank, no split is a pending sum
        return out
    resolved, _, _ = expand(doc["layouts"]["params"], graph.params)
    return partial_problems(resolved, param_roles(graph, structure))


def entry_problems(entries: Mapping[str, Any], graph: Graph, known: tuple[str, ...],
                   dim_problem: Callable[[str, int, tuple[str, ...], int], str | None]) -> list[str]:
    """Layout entries against the model: every parameter has one, of its rank, over the `known` axes, no axis on two
    dims, and no `dim_problem(parameter, dim, axes, size)` (how a kind of declaration splits a dim)."""
    try:
        resolved, missing, unused = expand(entries, graph.params)
    except InvalidInput as exc:
        return [str(exc)]
    out = [f"parameter {p!r} has no layout entry (no exact name or glob matches it)" for p in missing[:3]]
    out += [f"layout entry {k!r} matches no parameter of the model" for k in unused[:3]]
    for p, e in resolved.items():
        shape = graph.tensors[p].shape or ()
        if len(e["dims"]) != len(shape):
            out.append(f"{p} has {len(shape)} dims {list(shape)}, its layout gives {len(e['dims'])}")
            continue
        used: list[str] = []
        for d, spec in enumerate(e["dims"]):
            axes = dim_axes(spec)
            bad = [a for a in axes if a not in known]
            if bad:
                out.append(f"{p} dim {d} names mesh axis {bad[0]!r}; use {', '.join(known[:-1])} or {known[-1]}")
                continue
            used += axes
            problem = dim_problem(p, d, axes, shape[d])
            if problem:
                out.append(problem)
        if len(used) != len(set(used)):
            out.append(f"{p} uses a mesh axis on two dims ({used}); an axis splits one dim of a tensor")
    return out


def first_difference(recorded: Any, now: Any, where: str) -> str | None:
    """The first figure (in sorted key order) that differs, as 'where.key is A as recorded, B re-scored'; a
    boolean is not a number (`fits: 1` is not `fits: true`, `mfu: true` is not 1.0), a list is compared item
    by item."""
    if isinstance(recorded, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(recorded) | set(now), key=str):
            if key not in recorded or key not in now:
                return f"{where}.{key} is {'missing from the file' if key not in recorded else 'not a figure of it'}"
            found = first_difference(recorded[key], now[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(now, list) and len(recorded) == len(now):
        for i, (a, b) in enumerate(zip(recorded, now)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    same = isinstance(recorded, bool) == isinstance(now, bool) and recorded == now
    return None if same else f"{where} is {recorded!r} as recorded, {now!r} re-scored"


def _estimate_problems(recorded: Mapping[str, Any] | None, est: Mapping[str, Any]) -> list[str]:
    """Every recorded figure against the re-estimate (the same inputs give the same figures exactly)."""
    if not recorded:
        return []
    found = first_difference(recorded, recorded_figures(est), "estimate")
    return [found + " (the declaration was edited, or the cost model changed): `hyperplan estimate MODEL --plan "
            "FILE` scores it as it is"] if found else []


def _compare_derived(doc: Mapping[str, Any], vs: list[dict[str, Any]], graphs: list[tuple[Graph, frozenset[str]]],
                     scored: Scored, rep: Report) -> None:
    """Notes: parameters declared with other layouts than the estimator would choose (scored as declared), axes
    the estimate does not score, and rules that differ from what the strategy implies (backends apply them);
    `vs` and `graphs` are the programs' views and (graph, routed experts' weights)."""
    if scored.edited:
        p, (mine, chosen) = next(iter(scored.edited.items()))
        rep.warnings.append(f"{len(scored.edited)} parameter(s) are declared with other tensor-axis layouts than the "
                            f"estimator would choose (e.g. {p}: {layout_text(mine)} over tp, the estimator's "
                            f"{layout_text(chosen)}); the estimate scores the declared ones")
    canon = views(build_document(scored.plan, scored.graph, scored.structure, scored.request))
    for k, (v, c, g) in enumerate(zip(vs, canon, graphs)):
        where = f" of {rank_label(doc, k)}" if len(canon) > 1 else ""
        g, experts = g
        resolved, _, _ = expand(v["layouts"]["params"], g.params)
        odd = [(p, d, a) for p, e in resolved.items() for d, spec in enumerate(e["dims"]) for a in dim_axes(spec)
               if a not in ("tp", "ep") or (a == "ep" and (d != 0 or p not in experts))]
        if odd:
            p, d, a = odd[0]
            rep.warnings.append(f"{len(odd)} parameter dim(s){where} are split over axes the estimate does not score "
                                f"(e.g. {p} dim {d} over {a}): it scores tp splits, experts over ep, and ZeRO from "
                                "the zero section")
        for key in ("zero", "recompute", "offload"):
            if v[key] != c[key]:
                rep.warnings.append(f"section {key}{where} differs from what the strategy implies ({c[key]}); "
                                    "backends apply the declared one")
