"""Programs of a declaration (HyperMPMD): each on its own ranks, with its own mesh, stages, layouts and policies.

A declaration of one program keeps its layouts, ZeRO, recompute and
offload sections at the top level; a declaration of several programs
(encoders beside the backbone) gives each program its own, since each
runs its own strategy. Everything that reads one program — the strategy,
the checks, the exporters — reads it through a *view*: a document of one
program over ranks 0..count-1, shaped like a single-program declaration,
so the code that reads one program is the code that reads them all. A
program's own section wins over a top-level one.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.errors import InvalidInput

#: Sections that belong to a program's strategy: in the program, or at the top level for all programs.
SECTIONS = ("layouts", "zero", "recompute", "offload")
#: Keys of a program entry that are its own sections or figures rather than its shape.
_OWN = SECTIONS + ("estimate",)


def is_multi(doc: Mapping[str, Any]) -> bool:
    return len(doc["programs"]) > 1


def is_serving(doc: Mapping[str, Any]) -> bool:
    """Whether a declaration is of a serving plan (workload mode infer): prefill and decode programs."""
    w = doc.get("workload")
    return isinstance(w, Mapping) and w.get("mode") == "infer"


def ranks_of(prog: Mapping[str, Any], default_count: int) -> tuple[int, int]:
    """(first rank, rank count) of a program; a program without ranks runs on all of them."""
    r = prog.get("ranks") or {"first": 0, "count": default_count}
    return r["first"], r["count"]


def mesh_of(doc: Mapping[str, Any], k: int) -> dict[str, Any]:
    """The mesh program k names (InvalidInput naming the meshes there are when it names none of them)."""
    prog = doc["programs"][k]
    for mesh in doc["meshes"]:
        if mesh["name"] == prog["mesh"]:
            return mesh
    names = ", ".join(repr(m["name"]) for m in doc["meshes"])
    raise InvalidInput(f"programs[{k}] ({prog['name']}) runs on mesh {prog['mesh']!r}, but the meshes are {names}; "
                       f"name one of them in programs[{k}].mesh")


def view(doc: Mapping[str, Any], k: int) -> dict[str, Any]:
    """Program k as a declaration of one program on ranks 0..count-1 (its stage ranks shifted alike); the one
    program of a single-program declaration is the declaration itself, sections resolved."""
    prog = doc["programs"][k]
    local = {key: v for key, v in prog.items() if key not in _OWN}
    if is_multi(doc):
        first, count = ranks_of(prog, doc["cluster"]["devices"])
        local["ranks"] = {"first": 0, "count": count}
        local["stages"] = [_shifted(st, first) for st in prog["stages"]]
    else:  # the program is the whole cluster: its own ranks are checked against it as written
        count = doc["cluster"]["devices"]
    out: dict[str, Any] = {key: doc[key] for key in ("hypershard", "model", "workload") if key in doc}
    out["cluster"] = dict(doc["cluster"], devices=count)
    out["meshes"] = [mesh_of(doc, k)]
    out["programs"] = [local]
    for key in SECTIONS:
        section = prog.get(key, doc.get(key))
        if section is None:
            raise InvalidInput(f"programs[{k}] ({prog['name']}) has no {key} section and the declaration none at "
                               f"the top level; give programs[{k}] its own {key}")
        out[key] = section
    est = prog.get("estimate") if is_multi(doc) else doc.get("estimate")
    if est is not None:
        out["estimate"] = est
    return out


def _shifted(stage: Mapping[str, Any], first: int) -> dict[str, Any]:
    out = dict(stage)
    if "ranks" in stage:
        out["ranks"] = {"first": stage["ranks"]["first"] - first, "count": stage["ranks"]["count"]}
    return out


def views(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A view per program, in order."""
    return [view(doc, k) for k in range(len(doc["programs"]))]


def rank_problems(doc: Mapping[str, Any]) -> list[str]:
    """The programs' rank ranges must tile 0..devices-1 in order, each as large as its mesh."""
    n = doc["cluster"]["devices"]
    out: list[str] = []
    nxt = 0
    for k, prog in enumerate(doc["programs"]):
        first, count = ranks_of(prog, n)
        if first != nxt:
            out.append(f"programs[{k}] ({prog['name']}) starts at rank {first}, but the programs before it end at "
                       f"rank {nxt - 1}; programs take consecutive rank ranges from 0")
        nxt = first + count
    if nxt != n:
        out.append(f"the programs' ranks end at {nxt - 1}, but the cluster has ranks 0..{n - 1}")
    return out


def rank_label(doc: Mapping[str, Any], k: int) -> str:
    """'language_model (ranks 8-15)': how checks and generated files name a program."""
    first, count = ranks_of(doc["programs"][k], doc["cluster"]["devices"])
    return f"{doc['programs'][k]['name']} (ranks {first}-{first + count - 1})"
