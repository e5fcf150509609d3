"""What every exporter of a serving declaration needs: per phase program its ranks, mesh, layouts, experts, cache.

A serving declaration has two programs, prefill and decode. A generated
Python module holds both as entries of a `PROGRAMS` table (the same
`use_program` selection a training declaration of several programs
uses: bind by rank when the phases are disaggregated, by name when they
share the ranks), and a few helpers of its own: where a rank's routed
experts are (`expert_range`, numpy.array_split's rule, which allows a
count ep does not divide), which KV heads it keeps (`kv_head_group`) and
which pipeline stage it runs (`stage_of`). Nothing of hyperplan is needed
to run the generated code.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from planner.errors import InvalidInput
from planner.hypershard.backends.common import RESOLVER_SRC, SELECT_SRC, literal, mesh_sizes
from planner.hypershard.programs import mesh_of

#: Source of the serving helpers embedded in every generated module (after the plan constants).
HELPERS_SRC = '''
def _local(rank):
    return rank - PROGRAM["first_rank"]


def stage_of(rank):
    """The pipeline stage (an entry of STAGES) a global rank of the bound program runs."""
    return next(s for s in STAGES if s["first_rank"] <= rank < s["first_rank"] + s["ranks"])


def ep_coordinate(rank):
    """A rank's place among its stage's tp x dp ranks (tp fastest): its coordinate on the ep alias."""
    sizes = dict(MESH)
    return _local(rank) % (sizes["tp"] * sizes["dp"])


def expert_range(coordinate):
    """(first, end) of the routed experts ep coordinate `coordinate` holds in every MoE layer: contiguous ranges,
    the first (count mod ep) coordinates one expert more (numpy.array_split's rule)."""
    if not EXPERTS:
        return 0, 0
    ep = dict(MESH)["tp"] * dict(MESH)["dp"]
    base, extra = divmod(EXPERTS["count"], ep)
    first = coordinate * base + min(coordinate, extra)
    return first, first + base + (1 if coordinate < extra else 0)


def kv_head_group(rank):
    """(index, ways): which slice of each layer's KV heads a rank keeps (ways 1: the whole cache, as for MLA's
    latent); its sequences are those of its data-parallel replica."""
    ways = KV_CACHE["head_ways"]
    tp = dict(MESH)["tp"]
    return (_local(rank) % tp) // (tp // ways), ways
'''.strip("\n")


def phase_programs(doc: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(program, its mesh) of each phase, in the declaration's order."""
    return [(prog, mesh_of(doc, k)) for k, prog in enumerate(doc["programs"])]


def stages_of(prog: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"stage": st["stage"], "first_rank": st["ranks"]["first"], "ranks": st["ranks"]["count"],
             "layers": list(st["layers"]), "blocks": list(st.get("blocks", []))} for st in prog["stages"]]


def base_data(prog: Mapping[str, Any], mesh: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    """The constants every backend's module has for a phase (its own layouts and mesh come on top)."""
    return [
        ("PHASE", prog["phase"], "prefill or decode"),
        ("BATCH_PER_REPLICA", prog["batch_per_replica"], "sequences per data-parallel replica per step"),
        ("STAGES", stages_of(prog), "pipeline stages: global first rank, rank count, layers and other blocks"),
        ("EXPERTS", dict(prog.get("experts") or {}), "routed experts per MoE layer, over ep (empty: a dense model)"),
        ("KV_CACHE", dict(prog["kv_cache"]), "the KV cache: sequences over dp, heads split head_ways ways over tp"),
    ]


def uneven_experts(doc: Mapping[str, Any], backend: str) -> None:
    """InvalidInput when a phase spreads experts over ep unevenly, for a backend whose layouts split evenly."""
    for prog, mesh in phase_programs(doc):
        ex = prog.get("experts")
        ep = mesh_sizes(mesh).get("ep", 1)
        if ex and ep > 1 and ex["count"] % ep:
            raise InvalidInput(f"the {backend} backend splits arrays evenly, and {prog['phase']} spreads "
                               f"{ex['count']} experts over ep {ep} (ranges of {ex['count'] // ep} and "
                               f"{ex['count'] // ep + 1}); export with --backend torch, which places uneven "
                               "ranges, or give that phase a tp x dp (its ep) that divides them")


def header(doc: Mapping[str, Any], what: str) -> str:
    """The docstring opening a generated file: what it applies, for which model, with which figures."""
    m, c, w = doc["model"], doc["cluster"], doc["workload"]
    est = doc.get("estimate") or {}
    lines = [f"{what} for serving {m['name']} ({m['params']:,} parameters) on {c['devices']} devices of "
             f"{c['name']}: prompts of {w['prompt_len']} tokens, {w['gen_len']} generated, {w['dtype']} weights, "
             f"{w['kv_dtype']} KV cache.", "",
             f"Prefill and decode {'share every rank (co-located)' if doc['serving']['mode'] == 'co-located' else 'run on their own ranks (disaggregated)'}:"]
    for prog, mesh in phase_programs(doc):
        r = prog["ranks"]
        axes = " x ".join(f"{a}={n}" for a, n in mesh_sizes(mesh).items() if n > 1) or "one device"
        lines.append(f"  {prog['phase']} (ranks {r['first']}-{r['first'] + r['count'] - 1}): {axes}, batch "
                     f"{prog['batch_per_replica']} per replica.")
    if est:
        lines.append(f"Estimated TTFT {est['ttft_ms']:.4g} ms, TPOT {est['tpot_ms']:.4g} ms, "
                     f"{est['requests_per_s']:.4g} requests/s (hyperplan's analytic estimate).")
    lines += ["", "Generated by `hyperplan export` from a HyperShard declaration; regenerate rather than edit."]
    return "\n".join(lines)


def assemble(head: list[str], doc: Mapping[str, Any],
             data_of: Callable[[Mapping[str, Any], Mapping[str, Any]], list[tuple[str, Any, str | None]]],
             body: str) -> str:
    """A generated module: its head, the PROGRAMS table and its selection, the resolver, the helpers, the body."""
    table = []
    notes: list[str] = []
    for prog, mesh in phase_programs(doc):
        data = data_of(prog, mesh)
        notes = notes or [f"{name}: {note}" for name, _, note in data if note]
        table.append({"name": prog["name"], "phase": prog["phase"], "first_rank": prog["ranks"]["first"],
                      "ranks": prog["ranks"]["count"], "plan": {name: value for name, value, _ in data}})
    lines = list(head) + [f"# each phase program's ranks and plan constants ({'; '.join(notes)})",
                          f"PROGRAMS = {literal(table)}",
                          f"CO_LOCATED = {doc['serving']['mode'] == 'co-located'}", "", "", SELECT_SRC, "", "",
                          RESOLVER_SRC, "", "", HELPERS_SRC, "", "", body.strip("\n"), ""]
    return "\n".join(lines)
