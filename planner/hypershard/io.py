"""Reading and writing declarations: YAML or JSON by extension, atomically, with one-sentence errors.

A malformed file is the user's input, so every failure is an `InvalidInput`
naming the file and the field (`meshes[0].axes[1].size must be an integer,
got 'four'`), checked against the JSON Schema shipped beside this module.
Writing keeps the document's own key order (it reads top-down: model,
cluster, mesh, programs, layouts, ..., estimate) and short lists of scalars
on one line (`dims: [tp, null]`), so the same plan gives the same bytes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from planner.errors import InvalidInput
from planner.hypershard.programs import is_serving

SUFFIXES = (".yaml", ".yml", ".json")


class _Dumper(yaml.SafeDumper):
    """Block style, except flat lists of scalars (layouts, levels), which read best on one line."""


def _scalar_or_axes(x: Any) -> bool:
    return x is None or isinstance(x, (str, int, float, bool)) or (isinstance(x, list) and all(isinstance(y, str) for y in x))


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    names = all(isinstance(x, str) for x in data)  # layer lists: one wrapped line rather than one per layer
    flow = bool(data) and (names or (len(data) <= 8 and all(_scalar_or_axes(x) for x in data)))
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(tuple, _represent_list)


def dumps(doc: Mapping[str, Any], suffix: str) -> str:
    """The document's text in the format of `suffix` (.json, else YAML)."""
    if suffix.lower() == ".json":
        return json.dumps(doc, indent=2) + "\n"
    return yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=120)


def write_document(doc: Mapping[str, Any], path: str, protect: tuple[str, ...] = ()) -> None:
    """Write YAML or JSON by extension, atomically, never over one of the inputs (`protect`); the files it names
    by relative path are written relative to the document's folder (`relocated`)."""
    check_suffix(path)
    doc = relocated(doc, path)
    write_atomically(path, lambda: dumps(doc, Path(path).suffix), protect, "output")


#: The fields of a declaration that may name a file by path: its model, its hardware file, its stack file
FILE_FIELDS = (("model", "path"), ("cluster", "spec"), ("workload", "stack"))


def relocated(doc: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """`doc` with the files it names by relative path (given from the current folder) made relative to the folder
    of `path`, where the document will be read from: a plan written into another folder still names its model,
    hardware and stack files. A cluster or stack that names no file here is a preset's name, kept as it is."""
    out = dict(doc)
    folder = os.path.dirname(os.path.abspath(path))
    for section, key in FILE_FIELDS:
        part = out.get(section)
        name = part.get(key) if isinstance(part, Mapping) else None
        if not isinstance(name, str) or not name or os.path.isabs(name):
            continue
        if key != "path" and not os.path.isfile(name):
            continue
        out[section] = {**part, key: os.path.relpath(os.path.abspath(name), folder)}
    return out


def beside(name: str | None, base_dir: str | None) -> str | None:
    """A file a document names by relative path, from the current folder, else from `base_dir` (the document's
    folder) where it is there; a preset's name, or a file found neither way, as it is."""
    if name and base_dir and not os.path.isabs(name) and not os.path.exists(name):
        near = os.path.join(base_dir, name)
        return near if os.path.exists(near) else name
    return name


def anchored(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """`doc` as read from `path`: a file it names by a relative path that is not there from the current folder
    but is beside `path` (where `relocated` wrote it from) is named by the path that reaches it from here."""
    folder = os.path.dirname(os.path.abspath(path))
    for section, key in FILE_FIELDS:
        part = doc.get(section)
        name = part.get(key) if isinstance(part, dict) else None
        if isinstance(name, str) and (near := beside(name, folder)) != name:
            part[key] = os.path.relpath(near)
    return doc


def check_output(out: str | os.PathLike, flag: str, *, protect: tuple[Any, ...] = (), force: bool = False,
                 noun: str = "output") -> None:
    """Before any work: `out` is not one of this command's inputs (`protect`: paths, or names that are not
    files), its folder exists, and it is no existing file unless `force` says to replace it."""
    target = Path(out)
    for p in protect:
        if p is not None and _same_file(p, target):
            raise InvalidInput(f"{flag} {out} is an input of this command ({p}); write the {noun} elsewhere")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InvalidInput(f"{flag} {out}: folder {folder} does not exist")
    _check_writable(target, folder, flag)
    if target.is_dir():
        raise InvalidInput(f"{flag} {out} is a folder; give a file name")
    if target.exists() and not force:
        raise InvalidInput(f"{flag} {out} already exists; pass --force to replace it")


def _check_writable(target: Path, folder: Path, flag: str) -> None:
    """InvalidInput unless a file of `target`'s name can be made in `folder` (tried with an empty temporary file,
    removed at once): a read-only folder or a name too long for its file system is said before any work."""
    limit = os.pathconf(folder, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    if len(os.fsencode(target.name)) > limit:
        raise InvalidInput(f"{flag} {target}: the file name is longer than the {limit} bytes its folder allows; "
                           "give a shorter name")
    fd, tmp = _temporary(folder, f"{flag} {target}")
    os.close(fd)
    os.unlink(tmp)


def _temporary(folder: Path, what: str, suffix: str = "") -> tuple[int, str]:
    """A new empty file in `folder` (its descriptor and path), or InvalidInput saying `what` cannot be written."""
    try:
        return tempfile.mkstemp(dir=str(folder), prefix=".hyperplan-", suffix=suffix)
    except OSError as exc:
        raise InvalidInput(f"{what}: cannot write in folder {folder} ({exc.strerror}); give a path in a folder you "
                           "can write to") from None


def _same_file(a: Any, target: Path) -> bool:
    try:
        return os.path.exists(a) and target.exists() and os.path.samefile(a, target)
    except (OSError, TypeError, ValueError):
        return False


def check_suffix(path: str) -> None:
    """A declaration's file name must say its format (checked before planning, so no work is lost)."""
    if Path(path).suffix.lower() not in SUFFIXES:
        raise InvalidInput(f"-o {path}: use a .yaml, .yml or .json file name")


def write_atomically(out: str, produce: Callable[[], str | bytes], protect: tuple[str, ...], noun: str) -> int:
    """Check that `out` is not an input and its folder exists, then write what `produce()` returns through a
    temporary file renamed into place (nothing half-written, nothing the user gave overwritten); returns the bytes."""
    target = Path(out)
    for p in protect:
        if p and _same_file(p, target):
            raise InvalidInput(f"-o {out} is an input of this command; write the {noun} elsewhere")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.exists():
        raise InvalidInput(f"-o {out}: folder {folder} does not exist")
    data = produce()
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _temporary(folder, f"-o {out}", target.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; give what open() would
        os.replace(tmp, target)
    except BaseException as exc:  # a full disk, Ctrl-C: the temporary file goes, the target stays as it was
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InvalidInput(f"-o {out}: could not write it ({exc.strerror}); nothing was written there") from None
        raise
    return len(raw)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_document(path: str) -> dict[str, Any]:
    """Load and schema-check a declaration; InvalidInput with the file and field for anything wrong. The files it
    names by relative path are found from the current folder, else beside it (`anchored`)."""
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise InvalidInput(f"{path}: a declaration is a .yaml, .yml or .json file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"declaration file '{path}' does not exist; check the path") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not a UTF-8 text file; give a YAML or JSON declaration") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read '{path}' ({exc.strerror or exc}); check the path") from None
    doc = parse(text, p.name, json_format=p.suffix.lower() == ".json")
    check_schema(doc, p.name)
    _check_step_tokens(doc, p.name)
    return anchored(doc, path)


def _check_step_tokens(doc: Mapping[str, Any], name: str) -> None:
    """A training declaration's step within the tokens a step given by flags may hold (`bounds.step_tokens`)."""
    from planner.bounds import MAX_TOKENS_PER_STEP, MAX_TOKENS_WHY

    w = doc.get("workload")
    if isinstance(w, Mapping) and not is_serving(doc) and (
            tokens := w.get("global_batch", 1) * w.get("seq_len", 1)) > MAX_TOKENS_PER_STEP:
        raise InvalidInput(f"{name}: workload.global_batch x workload.seq_len = {tokens:,} tokens per step is more "
                           f"than {MAX_TOKENS_PER_STEP:,}, {MAX_TOKENS_WHY}; fix it")


class _DuplicateKey(ValueError):
    """A mapping names one key twice: the second would silently win."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a scalar",
                                                        key_node.start_mark) from None
            if key in seen:
                raise _DuplicateKey(f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} and "
                                    f"{key_node.start_mark.line + 1}); keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} appears twice in one object; keep one")
        out[key] = value
    return out


def _json_constant(word: str) -> float:
    raise _DuplicateKey(f"{word} is not a number JSON allows; give a finite number")


def read_constraints(path: str) -> dict[str, Any]:
    """The `constraints:` section of a plan file: a declaration `plan -o` wrote (it records the knobs that were
    fixed), or a file holding that one section; InvalidInput naming the file when there is none."""
    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise InvalidInput(f"--constraints {path}: a plan file is a .yaml, .yml or .json file")
    if not p.is_file():
        raise InvalidInput(f"--constraints: file '{path}' does not exist; check the path")
    try:
        doc = parse(p.read_text(encoding="utf-8"), p.name, json_format=p.suffix.lower() == ".json")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not a UTF-8 text file; give a YAML or JSON plan file") from None
    if "hypershard" in doc:
        check_schema(doc, p.name)
    section = doc.get("constraints")
    if not isinstance(section, Mapping):
        raise InvalidInput(f"{p.name} has no constraints: section; write one like `constraints: {{tp: 8, pp: 4}}` "
                           "(the keys of --tp ... --offload, with underscores: micro_batch, stage_tp)")
    return dict(section)


def parse(text: str, name: str, *, json_format: bool) -> dict[str, Any]:
    """The document of `text` (JSON or YAML); InvalidInput naming the file for bad syntax or a repeated key."""
    if json_format:
        try:
            doc = json.loads(text, object_pairs_hook=_json_object, parse_constant=_json_constant)
        except json.JSONDecodeError as exc:
            why = exc.msg.removesuffix(" at")  # "Unterminated string starting at": the position is given here
            raise InvalidInput(f"{name}: not valid JSON at line {exc.lineno}, column {exc.colno} ({why}); "
                               "fix the syntax") from None
        except _DuplicateKey as exc:
            raise InvalidInput(f"{name}: {exc}") from None
        except RecursionError:
            raise InvalidInput(f"{name}: nested too deeply to be a declaration") from None
    else:
        try:
            doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader that also refuses repeated keys
        except _DuplicateKey as exc:
            raise InvalidInput(f"{name}: {exc}") from None
        except RecursionError:
            raise InvalidInput(f"{name}: nested too deeply to be a declaration") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            why = getattr(exc, "problem", None) or "syntax error"
            raise InvalidInput(f"{name}: not valid YAML{where} ({why}); fix the syntax") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{name}: a declaration is a mapping with keys like hypershard, model, meshes; "
                           f"this file holds {type(doc).__name__ if doc is not None else 'nothing'}")
    return doc


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of a declaration (shipped as package data)."""
    return json.loads(resources.files("planner.hypershard").joinpath("schema.json").read_text(encoding="utf-8"))


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _reason(err: Any) -> str:
    v, kind = err.validator, err.validator_value
    got = json.dumps(err.instance)[:60] if not isinstance(err.instance, (dict, list)) else type(err.instance).__name__
    if v == "type":
        kinds = kind if isinstance(kind, list) else [kind]
        return f"must be {' or '.join(kinds)}, got {got}"
    if v == "enum":
        return f"must be one of {', '.join(json.dumps(k) for k in kind)}, got {got}"
    if v == "const":
        return f"must be {json.dumps(kind)}, got {got}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        bound = {"minimum": "at least", "exclusiveMinimum": "more than", "maximum": "at most",
                 "exclusiveMaximum": "less than"}[v]
        return f"must be {bound} {kind}, got {got}"
    if v == "required":
        missing = [k for k in kind if isinstance(err.instance, dict) and k not in err.instance]
        return f"is missing {', '.join(repr(k) for k in missing)}"
    if v == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"has unknown key {', '.join(repr(k) for k in extra)}"
    if v in ("minItems", "maxItems"):
        return f"must have {'at least' if v == 'minItems' else 'at most'} {kind} items"
    if v == "pattern":
        return f"must match {kind}, got {got}"
    return err.message


def check_schema(doc: Mapping[str, Any], name: str) -> None:
    """InvalidInput naming the first field (in document order) that breaks the schema."""
    try:
        import jsonschema
        from jsonschema.exceptions import best_match
    except ImportError:
        raise InvalidInput("checking a declaration needs the jsonschema package; install it with "
                           "`pip install jsonschema`") from None

    version = doc.get("hypershard")
    if version is not None and version != schema()["properties"]["hypershard"]["const"]:
        raise InvalidInput(f"{name} declares format version {version!r}; this hyperplan reads version "
                           f"{schema()['properties']['hypershard']['const']} (re-plan with this version)")
    err = best_match(jsonschema.Draft202012Validator(schema()).iter_errors(doc))
    if err is not None and err.validator is None:  # a section the schema forbids for this kind of declaration
        key = _key_of(doc, err)
        kind = "serving (workload mode infer)" if is_serving(doc) else "training"
        raise InvalidInput(f"{name}: field '{_field(list(err.absolute_path) + [key])}' is not part of a {kind} "
                           "declaration; remove it (the HyperShard schema is planner/hypershard/schema.json)")
    if err is not None:
        raise InvalidInput(f"{name}: field '{_field(err.absolute_path)}' {_reason(err)}; "
                           "fix it (the HyperShard schema is planner/hypershard/schema.json)")
    bad = _non_finite(doc, [])
    if bad is not None:
        path, value = bad
        raise InvalidInput(f"{name}: field '{_field(path)}' is {value}, not a finite number; fix it (every number of "
                           "a declaration is finite)")


def _non_finite(x: Any, path: list[Any]) -> tuple[list[Any], float] | None:
    """The first NaN or infinity in the document (YAML reads .nan and .inf as floats, which JSON Schema's
    `number` accepts), with its path."""
    if isinstance(x, float) and not math.isfinite(x):
        return path, x
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        found = _non_finite(v, path + [k])
        if found is not None:
            return found
    return None


def _key_of(doc: Mapping[str, Any], err: Any) -> Any:
    """The key under which a value the schema forbids outright sits (jsonschema gives the value, not its key)."""
    parent: Any = doc
    for part in err.absolute_path:
        parent = parent[part]
    if isinstance(parent, dict):
        return next((k for k, v in parent.items() if v is err.instance), "?")
    return "?"
