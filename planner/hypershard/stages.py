"""Pipeline stages of different widths (`Strategy.stage_tp`) in a declaration: each stage's tp, ranks and mesh.

Such a program declares each stage's tensor degree (`stages[k].tp`) and
ranks (`stages[k].ranks`); its mesh holds the axes the stages share (cp,
dp), the widest stage's tp, and pp with no stride (no one stride fits
blocks of different sizes). A stage's own mesh is the program's with tp
set to the stage's degree and strides recomputed fastest-first, over the
stage's ranks: the blocks `plan.stage_ranks` places widest first, so
power-of-two tensor groups never straddle a node. Editing one stage's
`tp` is editing the strategy; everything here is read from those fields,
so nothing else needs to change with it but the ranks the placement
implies (`validate` says which).
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput
from planner.strategy import Strategy

#: How a rank is placed within a stage of its own width (the `placement` of a mesh whose stages differ).
STAGE_PLACEMENT = ("stages of different widths: stage k runs on programs[].stages[k].ranks, rank = that first rank + "
                   "sum of coordinate x stride over tp (the stage's own tp), cp, dp, the first axis varies fastest; "
                   "the strides given are the widest stage's")


def mesh_tp(mesh: Mapping[str, Any]) -> int:
    return next((a["size"] for a in mesh["axes"] if a["name"] == "tp"), 1)


def declared_widths(view: Mapping[str, Any]) -> tuple[int, ...]:
    """Each stage's tensor degree as a one-program view declares it (a stage without `tp` takes the mesh's);
    () when every stage has the mesh's, the uniform pipeline. InvalidInput when the mesh's tp is not the widest."""
    mesh = view["meshes"][0]
    tp = mesh_tp(mesh)
    prog = view["programs"][0]
    widths = tuple(int(st.get("tp", tp)) for st in prog["stages"])
    if all(w == tp for w in widths):
        return ()
    pp = next((a["size"] for a in mesh["axes"] if a["name"] == "pp"), 1)
    text = "+".join(map(str, widths))
    if len(widths) != pp:
        raise InvalidInput(f"program {prog['name']!r} gives {len(widths)} stages tensor degrees {text}, but mesh "
                           f"{mesh['name']!r} has pp {pp}; list one stage per pipeline stage")
    if max(widths) != tp:
        raise InvalidInput(f"program {prog['name']!r} gives its stages tensor degrees {text}, so the tp axis of mesh "
                           f"{mesh['name']!r} must be the widest, {max(widths)}, not {tp}; set it to {max(widths)}")
    return widths


def placed_ranges(s: Strategy) -> list[tuple[int, int]]:
    """(first, count) of each stage's ranks within its program, as the planner places them."""
    from planner.plan import stage_ranks

    return [(first, last - first + 1) for first, last in stage_ranks(s)]


def stage_ranges(view: Mapping[str, Any], s: Strategy) -> list[tuple[int, int]]:
    """(first, count) of each stage's ranks within the program: as declared, else as placed."""
    placed = placed_ranges(s)
    out = []
    for k, st in enumerate(view["programs"][0]["stages"]):
        r = st.get("ranks")
        out.append((r["first"], r["count"]) if r else placed[k])
    return out


def device_problem(view: Mapping[str, Any], s: Strategy, devices: int, where: str) -> str | None:
    """One sentence when the strategy's degrees do not use the `devices` ranks `where` names; stages that state
    their tp are named by it, since that is the field to edit."""
    if s.devices == devices:
        return None
    widths = s.stage_tp or tuple(st["tp"] for st in view["programs"][0]["stages"] if "tp" in st)
    if len(widths) != s.pp:
        return f"mesh axes tp x cp x dp x pp = {s.devices} devices, but {where} is {devices}"
    replica = s.cp * s.dp
    fix = (f"change stages[].tp so that they add up to {devices // replica}" if devices % replica == 0
           else f"change the mesh's cp x dp ({replica}) to divide {devices}")
    return (f"the stages' tensor degrees {'+'.join(map(str, widths))} x cp {s.cp} x dp {s.dp} = {s.devices} devices, "
            f"but {where} is {devices}; {fix}")


def stage_mesh(mesh: Mapping[str, Any], tp: int, count: int, name: str) -> dict[str, Any]:
    """Stage's own mesh: `mesh` with tp of the stage's degree and pp of 1, strides fastest-first, on `count` ranks
    (InvalidInput when they do not multiply to `count`)."""
    axes, stride = [], 1
    for a in mesh["axes"]:
        size = tp if a["name"] == "tp" else 1 if a["name"] == "pp" else a["size"]
        axes.append({"name": a["name"], "size": size, "stride": stride})
        stride *= size
    if stride != count:
        raise InvalidInput(f"{name} runs on {count} ranks, but its tp {tp} x cp x dp = {stride}; give the stage "
                           f"{stride} ranks or another tp")
    out: dict[str, Any] = {"name": name, "devices": count, "axes": axes}
    if mesh.get("aliases"):
        out["aliases"] = [dict(a, stride=1 if "tp" in a.get("within", ()) else tp) if "stride" in a else dict(a)
                          for a in mesh["aliases"]]
    out["placement"] = STAGE_PLACEMENT
    return out


def param_widths(view: Mapping[str, Any], structure: Any, s: Strategy) -> dict[str, tuple[int, ...]]:
    """Parameter -> the tensor degrees of the stages that hold it (a tied one may sit in two); empty when the
    stages are all of one width."""
    if not s.stage_tp:
        return {}
    names = {b.name for b in structure.blocks}
    out: dict[str, set[int]] = {}
    for st in view["programs"][0]["stages"]:
        width = s.tp_of_stage(st["stage"]) if st["stage"] < s.pp else s.tp
        for ch in st["chunks"]:
            for name in list(ch["layers"]) + list(ch.get("blocks", [])):
                if name in names:
                    for p in structure.block(name).params:
                        out.setdefault(p, set()).add(width)
    return {p: tuple(sorted(w)) for p, w in out.items()}
