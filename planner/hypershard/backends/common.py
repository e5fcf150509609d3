"""What every exporter needs from a declaration: mesh order, rank coordinates, layouts, stages, a file header.

Generated Python files carry the declaration's layouts as data (patterns
and all) plus a small resolver with the declaration's rule (exact name
first, else the one matching glob), so they apply to the framework's
model by its own parameter names and need nothing of hyperplan at run time.

A declaration of several programs (HyperMPMD) gives one file whose
`PROGRAMS` table holds each program's ranks and plan constants (the same
names a one-program file defines at the top level); `use_program(rank)`
binds them for the program that rank runs, so the rest of the file is
the one-program code. Pipeline stages of different widths are groups of
the same kind: each stage is an entry of its own (`main/stage0`), with
its own mesh over its own ranks, its `STAGE` index and every stage's
ranks (`STAGE_RANKS`), from which `stage_peers` pairs the ranks that
hand activations across.
"""

from __future__ import annotations

import math
import pprint
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from planner.hypershard.declared import strategy_of, view_strategy
from planner.hypershard.layouts import dim_axes
from planner.hypershard.programs import is_multi, rank_label, ranks_of, views
from planner.hypershard.stages import stage_mesh, stage_ranges

#: Source of the resolver embedded in generated files (the declaration's matching rule).
RESOLVER_SRC = '''
def layout_of(name):
    """The declared layout of parameter `name`: an exact entry wins, else the one glob that matches."""
    if name in LAYOUTS:
        return LAYOUTS[name]
    hits = [p for p in LAYOUTS if any(c in p for c in "*?[") and fnmatch.fnmatchcase(name, p)]
    if len(hits) > 1:
        raise ValueError(f"{name} matches {len(hits)} layout patterns: {hits}")
    if not hits:
        raise KeyError(f"{name} has no layout in the declaration")
    return LAYOUTS[hits[0]]
'''.strip("\n")


def literal(obj: Any) -> str:
    """A deterministic Python literal (insertion order kept)."""
    return pprint.pformat(obj, width=110, sort_dicts=False)


def assignments(data: Any) -> list[str]:
    """`NAME = literal` lines (each after its `# note`, if any) for the constants a generated module starts with."""
    lines: list[str] = []
    for name, value, note in data:
        if note:
            lines.append(f"# {note}")
        lines.append(f"{name} = {literal(value)}")
    return lines


def mesh_sizes(mesh: Mapping[str, Any]) -> dict[str, int]:
    """A mesh's axis sizes by name, fastest first, with the ep alias if any."""
    out = {a["name"]: a["size"] for a in mesh["axes"]}
    for a in mesh.get("aliases", []):
        out[a["name"]] = a["size"]
    return out


def axis_sizes(doc: Mapping[str, Any]) -> dict[str, int]:
    """`mesh_sizes` of a one-program declaration's (or view's) mesh."""
    return mesh_sizes(doc["meshes"][0])


def mesh_slow_first(mesh: Mapping[str, Any]) -> list[tuple[str, int]]:
    """A mesh's physical axes slowest first (the row-major order of torch, JAX and MindSpore device matrices)."""
    return [(a["name"], a["size"]) for a in reversed(mesh["axes"])]


def slow_first(doc: Mapping[str, Any]) -> list[tuple[str, int]]:
    """`mesh_slow_first` of a one-program declaration's (or view's) mesh."""
    return mesh_slow_first(doc["meshes"][0])


def coords(doc: Mapping[str, Any], rank: int) -> dict[str, int]:
    """A rank's coordinate on each axis (fastest axis first), plus its ep coordinate: its place among the axes the
    alias is `within` (fastest first; training: cp, dp; serving: tp, dp), modulo ep."""
    out: dict[str, int] = {}
    rest = rank
    for a in doc["meshes"][0]["axes"]:
        out[a["name"]] = rest % a["size"]
        rest //= a["size"]
    sizes = axis_sizes(doc)
    for alias in doc["meshes"][0].get("aliases", []):
        if alias["size"] > 1:
            index, scale = 0, 1
            for name in alias.get("within") or ("cp", "dp"):
                index += out.get(name, 0) * scale
                scale *= sizes.get(name, 1)
            out[alias["name"]] = index % alias["size"]
    return out


def shard_index(spec: Any, coord: Mapping[str, int], sizes: Mapping[str, int]) -> tuple[int, int]:
    """(index, count) of the shard a rank holds along one dim split over `spec`'s axes (first axis major)."""
    idx, count = 0, 1
    for a in dim_axes(spec):
        idx = idx * sizes[a] + coord.get(a, 0)
        count *= sizes[a]
    return idx, count


@dataclass(frozen=True, slots=True)
class Group:
    """Ranks first..first+count-1 that run one plan: a program, or one stage of a program whose stages differ in
    width; `view` is its one-program declaration over ranks 0..count-1 (see `programs.view`)."""

    name: str
    submodels: list[str]
    first: int
    count: int
    view: dict[str, Any]


def groups(doc: Mapping[str, Any]) -> list[Group]:
    """Every program, in order, with a program of stages of different widths split into its stages."""
    out = []
    for k, v in enumerate(views(doc)):
        prog = doc["programs"][k]
        first, count = ranks_of(prog, doc["cluster"]["devices"])
        subs = list(prog.get("submodels", []))
        stages = stage_views(v, first)
        if not stages:
            out.append(Group(prog["name"], subs, first, count, v))
        for st, (a, c, sv) in enumerate(stages):
            out.append(Group(f"{prog['name']}/stage{st}", subs, first + a, c, sv))
    return out


def grouped(doc: Mapping[str, Any]) -> bool:
    """Whether a generated file needs the PROGRAMS table: several programs, or stages of different widths."""
    return len(groups(doc)) > 1


def stage_views(v: Mapping[str, Any], first: int) -> list[tuple[int, int, dict[str, Any]]]:
    """(first rank in the program, rank count, view) of each stage of a program whose stages differ in width, the
    view on the stage's own mesh, with `stage` (its index) and `stage_groups` (every stage's absolute ranks and
    tp) in its program; [] when they do not differ."""
    s = view_strategy(v)
    if not s.stage_tp:
        return []
    ranges = stage_ranges(v, s)
    table = [{"stage": k, "first_rank": first + a, "ranks": c, "tp": w}
             for k, ((a, c), w) in enumerate(zip(ranges, s.stage_tp))]
    mesh = v["meshes"][0]
    out = []
    for k, ((a, c), w) in enumerate(zip(ranges, s.stage_tp)):
        sv = dict(v, meshes=[stage_mesh(mesh, w, c, f"{mesh['name']}.stage{k}")], cluster=dict(v["cluster"], devices=c))
        sv["programs"] = [dict(v["programs"][0], ranks={"first": 0, "count": c}, stage=k, stage_groups=table)]
        out.append((a, c, sv))
    return out


def stage_data(doc: Mapping[str, Any]) -> list[tuple[str, Any, str | None]]:
    """The constants of a stage of its own width (None and [] otherwise): its index and every stage's ranks."""
    prog = doc["programs"][0]
    return [("STAGE", prog.get("stage"), "this entry's pipeline stage when stages differ in width (else None)"),
            ("STAGE_RANKS", prog.get("stage_groups", []), "each stage's first rank, rank count and tp")]


#: Source of the declared-axis -> mesh-axis mapping that layout code embeds (`_RENAME` is the file's own table).
ALIAS_SRC = '''
def _alias(spec):
    if spec is None:
        return "None"
    names = (spec,) if isinstance(spec, str) else tuple(spec)
    axes = tuple(m for a in names for m in _RENAME.get(a, (a,)))
    return axes[0] if len(axes) == 1 else axes
'''


#: Source of the pairing of ranks across pipeline stages of different widths, embedded in generated files.
PEERS_SRC = '''
def stage_peers(rank, other):
    """(the rank of stage `other` that `rank` receives from, the ranks of it that `rank` sends to), for stages of
    different widths: the same cp and dp coordinates, and tensor coordinate t paired with t mod the other stage's
    tp, so every rank receives exactly one copy of what crosses (the boundary is whole over tp)."""
    mine = next(s for s in STAGE_RANKS if s["first_rank"] <= rank < s["first_rank"] + s["ranks"])
    theirs = STAGE_RANKS[other]
    t, rest = (rank - mine["first_rank"]) % mine["tp"], (rank - mine["first_rank"]) // mine["tp"]
    base = theirs["first_rank"] + rest * theirs["tp"]
    return base + t % theirs["tp"], [base + u for u in range(theirs["tp"]) if u % mine["tp"] == t]
'''.strip("\n")


def layouts(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The declared parameter layouts without empty fields: what generated files embed."""
    out = {}
    for k, e in doc["layouts"]["params"].items():
        out[k] = {f: v for f, v in e.items() if f != "partial" or v}
    return out


def stage_layers(doc: Mapping[str, Any]) -> list[list[str]]:
    """Per pipeline stage, its layers (all of its chunks, in chunk order)."""
    return [[name for ch in sorted(st["chunks"], key=lambda c: c["chunk"]) for name in ch["layers"]]
            for st in doc["programs"][0]["stages"]]


def stage_blocks(doc: Mapping[str, Any]) -> list[list[str]]:
    return [[name for ch in st["chunks"] for name in ch.get("blocks", [])] for st in doc["programs"][0]["stages"]]


def header(doc: Mapping[str, Any], what: str) -> str:
    """The docstring opening a generated file: what it applies, for which model, with which figures."""
    est = doc.get("estimate") or {}
    m, c = doc["model"], doc["cluster"]
    lines = [f"{what} for {m['name']} ({m['params']:,} parameters) on {c['devices']} devices of {c['name']}.", ""]
    if is_multi(doc):
        lines.append(f"{len(doc['programs'])} programs (HyperMPMD), each on its own ranks with its own mesh and layouts:")
        lines += [f"  {rank_label(doc, k)}: {strategy_of(doc, k).short()}." for k in range(len(doc["programs"]))]
    else:
        lines.append(f"Strategy: {strategy_of(doc).short()}.")
    stages = [g for g in groups(doc) if g.view["programs"][0].get("stage") is not None]
    if stages:
        lines.append("Pipeline stages of different widths, each on its own ranks and mesh (an entry of PROGRAMS):")
        lines += [f"  {g.name} (ranks {g.first}-{g.first + g.count - 1}): mesh "
                  + " x ".join(f"{a['name']}={a['size']}" for a in g.view["meshes"][0]["axes"] if a["size"] > 1)
                  + "." for g in stages]
    if est:
        lines.append(f"Estimated step {est['step_time_s']:.4g} s, peak {est['memory_gib']['peak']:.2f} GiB per device "
                     "(hyperplan's analytic estimate as the declaration records it; `hyperplan validate` re-scores "
                     "it).")
    lines += ["", "Generated by `hyperplan export` from a HyperShard declaration; regenerate rather than edit."]
    return "\n".join(lines)


def devices(doc: Mapping[str, Any]) -> int:
    return math.prod(a["size"] for a in doc["meshes"][0]["axes"])


#: Source of the program selection embedded in files generated from a declaration of several programs.
SELECT_SRC = '''
PROGRAM = None  # the program this process runs: set by use_program()


def program_of(rank):
    """The entry of PROGRAMS whose ranks hold `rank` (a rank runs exactly one program)."""
    for program in PROGRAMS:
        if program["first_rank"] <= rank < program["first_rank"] + program["ranks"]:
            return program
    raise ValueError(f"rank {rank} is in no program: {[(p['name'], p['first_rank'], p['ranks']) for p in PROGRAMS]}")


def use_program(rank_or_name):
    """Bind this module's plan constants (mesh, layouts, stages, policies) to the program a rank runs, or to the
    program of that name; call it before anything else. Returns the program's name."""
    global PROGRAM
    if isinstance(rank_or_name, str):
        PROGRAM = next(p for p in PROGRAMS if p["name"] == rank_or_name)
    else:
        PROGRAM = program_of(rank_or_name)
    globals().update(PROGRAM["plan"])
    return PROGRAM["name"]
'''.strip("\n")


def module_lines(doc: Mapping[str, Any], data_of: Callable[[Mapping[str, Any]], list[tuple[str, Any, str | None]]]
                 ) -> list[str]:
    """The constants of a generated module: `NAME = literal` lines for one program, or the PROGRAMS table (each
    program's constants by name, with its ranks) and the selection functions for several."""
    parts = groups(doc)
    if len(parts) == 1:
        return assignments(data_of(doc))
    table = [{"name": g.name, "submodels": g.submodels, "first_rank": g.first, "ranks": g.count,
              "plan": {name: value for name, value, _ in data_of(g.view)}} for g in parts]
    notes = "; ".join(f"{name}: {note}" for name, _, note in data_of(parts[0].view) if note)
    return [f"# each program's ranks and plan constants ({notes})", f"PROGRAMS = {literal(table)}", "",
            "", SELECT_SRC]


def assemble(head: list[str], doc: Mapping[str, Any],
             data_of: Callable[[Mapping[str, Any]], list[tuple[str, Any, str | None]]], body: str,
             mesh: tuple[str, str] | None = None, extra: tuple[str, ...] = ()) -> str:
    """A generated module: its head (docstring, imports), the plan constants (`module_lines`), `extra` lines, the
    resolver, the mesh builder (`mesh`: the one-program source and the several-programs one) and the body."""
    lines = list(head) + module_lines(doc, data_of) + list(extra) + ["", "", RESOLVER_SRC, ""]
    if any(g.view["programs"][0].get("stage") is not None for g in groups(doc)):
        lines += ["", PEERS_SRC, "", ""]
    if mesh is not None:
        lines += [(mesh[1] if grouped(doc) else mesh[0]).strip("\n"), "", ""]
    lines += [body.strip("\n"), ""]
    return "\n".join(lines)
