"""Serving declarations read back: each phase's layout, batch and KV offload, scored and checked as written.

What is read: each program's mesh axis sizes (tp, dp, pp; the ep alias),
`batch_per_replica` and `kv_cache.offload.fraction`, the serving mode and
the workload. They are scored by `planner.inference.rescore` — the calls
`plan_inference` makes for the phases it chooses — so an unedited file
scores to the numbers `plan` printed and a hand edit is scored as it is.
Everything else a serving declaration states (rank ranges, stages,
parameter layouts, the KV cache's and the experts' layout) follows from
those choices and the model; `validate` checks it against them, since a
backend applies what is declared. The serving estimate costs tp as Megatron
splits a layer; per-parameter layouts other than the derived ones are
checked (known axes, even splits) and noted, not costed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from cost_models.errors import SpecError

from planner.errors import InvalidInput
from planner.hypershard.document import Request
from planner.hypershard.patterns import expand
from planner.hypershard.programs import mesh_of, rank_problems, ranks_of
from planner.hypershard.serving_doc import (ESTIMATE_KEYS, PHASES, WORKLOAD_KEYS, build_serving_document,
                                           serving_graph, tier_name)
from planner.hypershard.serving_layouts import routed_experts
from planner.hypershard.validate import (Report, accuracy_changed, entry_problems, first_difference, model_problems,
                                         model_request)
from planner.graph.walk import index_graph
from planner.inference.phase_cost import Layout
from planner.inference.rescore import PhaseChoice, score_serving
from planner.units import nbytes, seconds

GIB = 2.0**30
_AXES = ("tp", "dp", "pp", "ep")


def phase_index(doc: Mapping[str, Any]) -> dict[str, int]:
    """Phase -> index of its program; InvalidInput unless there is one program per phase."""
    found: dict[str, int] = {}
    for k, prog in enumerate(doc["programs"]):
        if prog["phase"] in found:
            raise InvalidInput(f"programs[{found[prog['phase']]}] and programs[{k}] both run {prog['phase']}; a "
                               "serving declaration has one prefill and one decode program")
        found[prog["phase"]] = k
    missing = [p for p in PHASES if p not in found]
    if missing:
        raise InvalidInput(f"the declaration has no {missing[0]} program; a serving declaration has one prefill and "
                           "one decode program")
    return found


def layout_in(doc: Mapping[str, Any], k: int) -> Layout:
    """Program k's layout from its mesh: tp, dp, pp axis sizes and the ep alias (1 when absent)."""
    mesh = mesh_of(doc, k)
    sizes = {a["name"]: a["size"] for a in mesh["axes"]}
    unknown = sorted(set(sizes) - {"tp", "dp", "pp"})
    if unknown:
        raise InvalidInput(f"mesh {mesh['name']!r} has axis {unknown[0]!r}; a serving mesh has tp, dp and pp (and the "
                           "ep alias)")
    aliases = {a["name"]: a["size"] for a in mesh.get("aliases", [])}
    odd = sorted(set(aliases) - {"ep"})
    if odd:
        raise InvalidInput(f"mesh {mesh['name']!r} has alias {odd[0]!r}; the only alias is ep (experts over tp x dp)")
    return Layout(tp=sizes.get("tp", 1), dp=sizes.get("dp", 1), pp=sizes.get("pp", 1), ep=aliases.get("ep", 1))


def choices_of(doc: Mapping[str, Any]) -> dict[str, PhaseChoice]:
    """Each phase's layout, batch and KV offload as the declaration states them."""
    out = {}
    for phase, k in phase_index(doc).items():
        prog = doc["programs"][k]
        out[phase] = PhaseChoice(layout=layout_in(doc, k), batch=prog["batch_per_replica"],
                                 kv_offload=float(prog["kv_cache"]["offload"]["fraction"]))
    return out


def serving_of(doc: Mapping[str, Any]):
    """The workload as the cost model's Serving (the same checks as the command line's options)."""
    from planner.inference.serve import serving_options

    w = doc["workload"]
    return serving_options(prompt_len=w["prompt_len"], gen_len=w["gen_len"], batch=w.get("batch"),
                           ttft_ms=w.get("ttft_ms"), tpot_ms=w.get("tpot_ms"), dtype=w["dtype"],
                           kv_dtype=w["kv_dtype"], offload=bool((doc.get("search") or {}).get("kv_offload", True)))


@dataclass(frozen=True, slots=True)
class Rescored:
    """A serving declaration scored: the plan, `plan --json`'s dict of it, and what it was scored on."""

    plan: Any  # planner.inference.plan.ServingPlan
    report: dict[str, Any]
    profile: Any
    cluster: Any
    request: Request


def rescore(doc: Mapping[str, Any], request: Request, devices: int | None = None) -> Rescored:
    """Score the declaration's phases on `request`'s model and cluster (`devices`: the declared count)."""
    from planner.inference.serve import load_profile, serving_cluster, serving_report

    w = doc["workload"]
    serving = serving_of(doc)
    hw = serving_cluster(request.cluster, devices or doc["cluster"]["devices"], request.memory_gib, w["dtype"])
    profile = load_profile(request.model, dict(request.dims) or None, dict(request.overrides) or None)
    choice = choices_of(doc)
    plan = score_serving(profile, hw, serving, doc["serving"]["mode"], choice["prefill"], choice["decode"])
    workload = {k: w.get(k) for k in WORKLOAD_KEYS}
    return Rescored(plan, serving_report(plan, [], serving, profile, request.model, hw, workload), profile, hw,
                    request)


def validate_serving(doc: Mapping[str, Any], name: str = "declaration", base_dir: str | None = None) -> Report:
    """Every check of a serving declaration, in order; the re-estimate is `plan --mode infer --json`'s dict."""
    rep = Report()
    request = model_request(doc, base_dir, rep)
    if request is None:
        return rep
    m = doc["model"]
    try:
        index = phase_index(doc)
        choice = choices_of(doc)
        serving_of(doc)
    except InvalidInput as exc:
        rep.add("strategy", [str(exc)], "")
        return rep
    mode = doc["serving"]["mode"]
    rep.add("strategy", [], f"{mode}; " + "; ".join(
        f"{ph} {c.layout.short()}, batch {c.batch} per replica" + (f", {c.kv_offload:.0%} of the KV cache offloaded"
                                                                  if c.kv_offload else "")
        for ph, c in choice.items()))
    if not rep.add("cluster", _cluster_problems(doc, index, choice, mode),
                   f"{doc['cluster']['devices']} devices of {doc['cluster']['name']}: " + "; ".join(
                       f"{ph} ranks {_range(doc['programs'][k])}" for ph, k in index.items())):
        return rep
    try:
        scored = rescore(doc, request)
        graph, structure = serving_graph(request)
    except (InvalidInput, SpecError) as exc:
        rep.add("estimate", [str(exc)], "")
        return rep
    rep.add("model", model_problems(doc, graph), f"{m['name']}: {graph.param_count:,} parameters in "
            f"{len(graph.params)} tensors")
    canon = build_serving_document(scored.report, graph, structure, scored.profile, request, scored.cluster,
                                   tier_name(scored.cluster))
    pipeline, layouts, kv = [], [], []
    experts = set(routed_experts(graph, structure, index_graph(graph)))
    for ph, k in index.items():
        mine, want = doc["programs"][k], canon["programs"][PHASES.index(ph)]
        if mine["stages"] != want["stages"]:
            pipeline.append(_stage_problem(ph, mine["stages"], want["stages"]))
        layouts += [f"{ph}: {p}" for p in _layout_problems(mine["layouts"]["params"], graph, choice[ph].layout,
                                                             experts)]
        ex, ep = mine.get("experts"), choice[ph].layout.ep
        if ex and ex["count"] < ep:
            rep.warnings.append(f"{ph} spreads {ex['count']} experts over ep {ep}, so {ep - ex['count']} ep ranks "
                                "hold none; the estimate counts an even share of the expert weights per device")
        if not layouts and _differs(mine["layouts"]["params"], want["layouts"]["params"], graph):
            rep.warnings.append(f"the {ph} parameter layouts differ from the derived ones; backends apply the declared "
                                "ones, and the serving estimate costs every dense weight split over tp as Megatron "
                                "splits a layer")
        for section in ("kv_cache", "experts"):
            a, b = _facts(mine.get(section)), _facts(want.get(section))
            if a != b:
                kv.append(f"{ph}: " + (first_difference(a, b, section) or section)
                          .replace("as recorded", "as declared").replace("re-scored", "for this layout")
                          + "; it follows from the model and the layout")
    rep.add("pipeline", pipeline, "; ".join(f"{ph} {choice[ph].layout.pp} stage(s)" for ph in index))
    rep.add("layouts", layouts, "; ".join(f"{ph} {len(doc['programs'][k]['layouts']['params'])} entries"
                                          for ph, k in index.items()) + f" for {len(graph.params)} parameters")
    rep.add("kv_cache", kv, "; ".join(f"{ph}: {doc['programs'][k]['kv_cache'].get('layout', 'no layout declared')}"
                                      for ph, k in index.items()))
    rep.estimate = scored.report
    rep.add("memory", _memory_problems(scored.plan), "; ".join(
        f"{ph} {scored.report[ph]['memory_gib']['total']:.2f} of {scored.report[ph]['usable_hbm_gib']:.1f} GiB"
        for ph in PHASES))
    rep.warnings += _target_notes(doc["workload"], scored.report) + accuracy_changed(doc, scored.report)
    rep.add("estimate", _estimate_problems(doc, index, scored.report),
            f"TTFT {scored.report['ttft_ms']:.6g} ms, TPOT {scored.report['tpot_ms']:.6g} ms, "
            f"{scored.report['requests_per_s']:.6g} requests/s: equal to the recorded estimate"
            if _recorded(doc) else "no recorded estimate to compare; re-estimated")
    return rep


def _facts(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A kv_cache or experts section without its prose (`layout`, `placement`): the facts backends read."""
    return None if section is None else {k: v for k, v in section.items() if k not in ("layout", "placement")}


def _range(prog: Mapping[str, Any]) -> str:
    r = prog["ranks"]
    return f"{r['first']}-{r['first'] + r['count'] - 1}"


def _cluster_problems(doc: Mapping[str, Any], index: Mapping[str, int], choice: Mapping[str, PhaseChoice],
                      mode: str) -> list[str]:
    n = doc["cluster"]["devices"]
    out: list[str] = []
    if mode == "disaggregated":
        out += rank_problems(doc)
    else:
        for ph, k in index.items():
            first, count = ranks_of(doc["programs"][k], n)
            if (first, count) != (0, n):
                out.append(f"co-located {ph} runs on ranks {first}..{first + count - 1}, but co-located phases share "
                           f"all ranks 0..{n - 1}; set programs[{k}].ranks to first 0, count {n}")
        meshes = {doc["programs"][k]["mesh"] for k in index.values()}
        if len(meshes) > 1:
            out.append(f"co-located prefill and decode run on meshes {' and '.join(sorted(meshes))}, but they share "
                       "one layout; name one mesh in both programs")
    for ph, k in index.items():
        prog, lay = doc["programs"][k], choice[ph].layout
        mesh = mesh_of(doc, k)
        _, count = ranks_of(prog, n)
        if lay.devices != count:
            out.append(f"{ph} mesh {mesh['name']!r} is tp {lay.tp} x dp {lay.dp} x pp {lay.pp} = {lay.devices} "
                       f"devices, but programs[{k}].ranks.count is {count}")
        if mesh.get("devices", lay.devices) != lay.devices:
            out.append(f"mesh {mesh['name']!r} says {mesh['devices']} devices, but its axes make {lay.devices}")
        stride = 1
        for a in mesh["axes"]:
            if a.get("stride", stride) != stride:
                out.append(f"mesh {mesh['name']!r} axis {a['name']} has stride {a['stride']}, but placed fastest-first "
                           f"it is {stride}")
            stride *= a["size"]
    return out


def _stage_problem(phase: str, mine: list[Mapping[str, Any]], want: list[Mapping[str, Any]]) -> str:
    if len(mine) != len(want):
        return f"{phase} lists {len(mine)} stages, but its pp axis has size {len(want)}"
    for k, (a, b) in enumerate(zip(mine, want)):
        for key in ("stage", "ranks", "layers", "blocks"):
            if a.get(key) != b.get(key):
                return (f"{phase} stage {k} {key} {_short(a.get(key))} differ from the even split the serving cost "
                        f"model runs, {_short(b.get(key))}; set them so")
    return f"{phase} stages differ from the even split the serving cost model runs"


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _layout_problems(entries: Mapping[str, Any], graph: Any, lay: Layout, experts: set[str]) -> list[str]:
    """Every parameter has one entry of its rank, over tp, dp, pp or ep, tp splits even; ep only on a routed expert
    weight's expert dim (where it may split unevenly: numpy.array_split)."""
    size = {"tp": lay.tp, "dp": lay.dp, "pp": lay.pp, "ep": lay.ep}

    def problem(p: str, d: int, axes: tuple[str, ...], n: int) -> str | None:
        if "ep" in axes:
            if p not in experts or d != 0:
                return (f"{p} dim {d} names mesh axis 'ep', which holds the routed experts only (on their expert "
                        "dim); use tp or null")
            return None
        k = math.prod(size[a] for a in axes)
        return f"{p} dim {d} ({n}) does not split evenly over {'x'.join(axes)} = {k}" if n % k else None

    return entry_problems(entries, graph, _AXES, problem)


def _differs(mine: Mapping[str, Any], want: Mapping[str, Any], graph: Any) -> bool:
    a, _, _ = expand(mine, graph.params)
    b, _, _ = expand(want, graph.params)
    return any(a[p]["dims"] != b[p]["dims"] for p in b if p in a)


def _memory_problems(plan: Any) -> list[str]:
    out = []
    for phase, p in (("prefill", plan.prefill), ("decode", plan.decode)):
        mem, st = p.memory_bytes, p.step
        if mem["total"] > st.usable_bytes:
            out.append(f"{phase} needs {nbytes(mem['total'])} per device at batch {p.batch} and "
                       f"{nbytes(st.usable_bytes)} are usable; lower its batch_per_replica or widen its mesh")
        elif mem["offloaded_kv"] > st.tier_bytes:
            out.append(f"{phase} offloads {nbytes(mem['offloaded_kv'])} of KV cache per device and the tier "
                       f"holds {nbytes(st.tier_bytes)}; lower kv_cache.offload.fraction")
    return out


def _target_notes(w: Mapping[str, Any], report: Mapping[str, Any]) -> list[str]:
    out = []
    for key, flag in (("ttft_ms", "--ttft-ms"), ("tpot_ms", "--tpot-ms")):
        if w.get(key) is not None and report[key] > w[key] * (1 + 1e-6):
            out.append(f"{key.split('_')[0].upper()} {seconds(report[key] / 1e3)} is over the {flag} {w[key]:g} ms target")
    return out


def _recorded(doc: Mapping[str, Any]) -> bool:
    return "estimate" in doc or any("estimate" in p for p in doc["programs"])


def _estimate_problems(doc: Mapping[str, Any], index: Mapping[str, int], report: Mapping[str, Any]) -> list[str]:
    found = []
    for ph, k in index.items():
        rec = doc["programs"][k].get("estimate")
        if rec is not None:
            found.append(first_difference(rec, report[ph], f"programs[{k}].estimate"))
    if doc.get("estimate") is not None:
        top = {key: v for key, v in doc["estimate"].items() if key != "notes"}
        found.append(first_difference(top, {key: report[key] for key in ESTIMATE_KEYS}, "estimate"))
    problems = [f for f in found if f]
    if problems:
        return [problems[0] + " (the declaration was edited, or the cost model changed): `hyperplan estimate MODEL "
                "--plan FILE` scores it as it is"]
    return []


def estimate_serving(doc: Mapping[str, Any], request: Request, *, dtype: str | None = None) -> dict[str, Any]:
    """`hyperplan estimate MODEL --plan FILE` of a serving declaration: its phases' layouts and batches on
    `request`'s model and cluster (`declared.request_on`), in `dtype` when given."""
    if dtype is not None:
        doc = dict(doc, workload=dict(doc["workload"], dtype=dtype))
    return rescore(doc, request).report
