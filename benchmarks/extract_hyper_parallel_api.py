"""Pin the hyper-parallel API the hyper-parallel export uses: signatures read from a source checkout with ast.

    python benchmarks/extract_hyper_parallel_api.py /path/to/hyper-parallel [--commit SHA] [-o FILE]

Writes tests/data/hyper_parallel_api.json (by default): the source (repository, commit, platform) and, per
module path the generated files import from, each imported name's file, kind and parameters; then the
methods and enum members the generated code reaches through objects (`mesh.get_group`,
`CheckpointPolicy.MUST_SAVE`). Nothing is imported or run: the files are parsed, and a name re-exported by
`from X import name` is followed to where it is defined. Re-run it against a newer checkout and the tests
(tests/test_hyper_parallel_api.py) say which generated call no longer fits.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.hypershard.backends.hyper_parallel_src import IMPORTS, REACHED  # noqa: E402

REPO = "mindspore-ai/hyper-parallel"
#: The torch platform's class, whose methods stand behind `plat.NAME` in platform-neutral modules.
PLATFORM = ("hyper_parallel/platform/torch/platform.py", "TorchPlatform")


def imported_names() -> dict[str, list[str]]:
    """Module path -> names, from the generated files' `from hyper_parallel... import` lines."""
    out: dict[str, list[str]] = {}
    for node in ast.parse("\n".join(IMPORTS)).body:
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "hyper_parallel":
            out.setdefault(node.module, []).extend(a.name for a in node.names)
    return out


class Source:
    """A checkout's Python files, parsed on demand."""

    def __init__(self, root: Path):
        self.root, self._trees = root, {}

    def file_of(self, module: str) -> str:
        base = module.replace(".", "/")
        for rel in (f"{base}/__init__.py", f"{base}.py"):
            if (self.root / rel).exists():
                return rel
        raise LookupError(f"no module {module} under {self.root}")

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            self._trees[rel] = ast.parse((self.root / rel).read_text(), rel)
        return self._trees[rel]

    def find(self, module: str, name: str, seen: int = 0) -> tuple[str, ast.AST]:
        """(file, defining node) of `name` as `module` exposes it, following `from X import name`."""
        rel = self.file_of(module)
        for node in self.tree(rel).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return rel, node
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return rel, node
        for node in self.tree(rel).body:
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                alias = next(a for a in node.names if (a.asname or a.name) == name)
                target = node.module if node.level == 0 else _relative(module, rel, node)
                if seen > 10:
                    raise LookupError(f"{module}.{name}: re-exported in a loop")
                return self.find(target, alias.name, seen + 1)
        raise LookupError(f"{module} defines no {name}")


def _relative(module: str, rel: str, node: ast.ImportFrom) -> str:
    package = module.split(".") if rel.endswith("__init__.py") else module.split(".")[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def signature(fn: ast.FunctionDef, drop_self: bool = False) -> dict:
    """Parameter names of a def: positional-or-keyword (in order), keyword-only, how many positionals are
    required, and whether it takes *args / **kwargs (`drop_self`: a method's self, unless it is static)."""
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args]
    required = len(names) - len(args.defaults)
    static = any(ast.unparse(d) == "staticmethod" for d in fn.decorator_list)
    if drop_self and names and names[0] in ("self", "cls") and not static:
        names, required = names[1:], required - 1
    return {"params": names, "keyword_only": [a.arg for a in args.kwonlyargs], "required": max(required, 0),
            "var_positional": args.vararg is not None, "var_keyword": args.kwarg is not None}


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def class_signature(src: Source, rel: str, cls: ast.ClassDef) -> dict:
    """The constructor's parameters: __init__ (minus self), a dataclass's fields, or a base's in the same file."""
    init = _method(cls, "__init__")
    if init is not None:
        return signature(init, drop_self=True)
    if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        fields = [(n.target.id, n.value is not None) for n in cls.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        base = _base(src, rel, cls)
        inherited = class_signature(src, rel, base)["params"] if base is not None else []
        names = inherited + [f for f, _ in fields]
        return {"params": names, "keyword_only": [], "required": sum(1 for _, d in fields if not d),
                "var_positional": False, "var_keyword": False}
    base = _base(src, rel, cls)
    if base is not None:
        return class_signature(src, rel, base)
    return {"params": [], "keyword_only": [], "required": 0, "var_positional": False, "var_keyword": False}


def _base(src: Source, rel: str, cls: ast.ClassDef) -> ast.ClassDef | None:
    names = [b.id for b in cls.bases if isinstance(b, ast.Name)]
    return next((n for n in src.tree(rel).body if isinstance(n, ast.ClassDef) and n.name in names), None)


def partial_signature(src: Source, rel: str, node: ast.Assign) -> dict:
    """`NAME = partial(plat.METHOD, kw=fn)`: the platform method's parameters less the bound ones; keywords it
    forwards (**kwargs) to a bound function of this module count as that function's keyword-only ones."""
    call = node.value
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "partial"):
        raise LookupError(f"{rel}: {ast.unparse(node)[:80]} is no functools.partial")
    target = call.args[0]
    plat_rel, plat_cls = PLATFORM
    fn = _method(next(n for n in src.tree(plat_rel).body if isinstance(n, ast.ClassDef) and n.name == plat_cls),
                 target.attr)
    sig = signature(fn, drop_self=True)
    bound = {k.arg: k.value for k in call.keywords}
    sig["params"] = [p for p in sig["params"] if p not in bound]
    for value in bound.values():
        inner = next((n for n in src.tree(rel).body if isinstance(n, ast.FunctionDef) and isinstance(value, ast.Name)
                      and n.name == value.id), None)
        if inner is not None and sig["var_keyword"]:
            sig["keyword_only"] += [a.arg for a in inner.args.kwonlyargs]
    sig["via"] = f"functools.partial({ast.unparse(target)}, {', '.join(bound)}=...); {plat_rel} {plat_cls}"
    return sig


def describe(src: Source, module: str, name: str) -> dict:
    rel, node = src.find(module, name)
    if isinstance(node, ast.ClassDef):
        return {"file": rel, "kind": "class", **class_signature(src, rel, node)}
    if isinstance(node, ast.FunctionDef):
        return {"file": rel, "kind": "function", **signature(node)}
    return {"file": rel, "kind": "partial", **partial_signature(src, rel, node)}


def reached(src: Source) -> dict:
    """Methods (signatures) and enum members the generated code reaches through objects."""
    out = {}
    for qualified, attrs in REACHED.items():
        module, _, name = qualified.rpartition(".")
        rel, cls = src.find(module, name)
        entry = {"file": rel}
        for attr in attrs:
            fn = _method(cls, attr)
            members = {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
            if fn is not None:
                entry[attr] = signature(fn, drop_self=True)
            elif attr in members:
                entry[attr] = {"kind": "member"}
            else:
                raise LookupError(f"{qualified} has no {attr} in {rel}")
        out[qualified] = entry
    return out


def pin(root: Path, commit: str) -> dict:
    src = Source(root)
    modules = {m: {n: describe(src, m, n) for n in sorted(names)} for m, names in sorted(imported_names().items())}
    return {"source": {"repository": REPO, "commit": commit, "platform": "torch (HYPER_PARALLEL_PLATFORM=torch)",
                       "extracted_by": "benchmarks/extract_hyper_parallel_api.py"},
            "modules": modules, "reached": reached(src)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a hyper-parallel checkout: the folder holding hyper_parallel/")
    parser.add_argument("--commit", help="the source's full commit, when the folder is no git work tree")
    parser.add_argument("-o", "--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "tests" / "data" / "hyper_parallel_api.json")
    args = parser.parse_args()
    commit = args.commit
    if commit is None:
        run = subprocess.run(["git", "-C", str(args.source), "rev-parse", "HEAD"], capture_output=True, text=True)
        if run.returncode != 0:
            parser.error(f"{args.source} is no git work tree; pass --commit")
        commit = run.stdout.strip()
    data = pin(args.source, commit)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {sum(len(v) for v in data['modules'].values())} names from {REPO}@{commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
