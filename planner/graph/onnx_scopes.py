"""The module path (`scope`) of each node, and inlining of model-local functions that keeps it.

Sources, first that answers wins:
1. metadata ``pkg.torch.onnx.name_scopes`` (PyTorch dynamo exporter): a
   Python-list string of scope names, outermost first, ending with the FX node
   name: ``['', 'model', 'model.layers.0', 'model.layers.0.self_attn',
   'model.layers.0.self_attn.q_proj', 'linear']``. Recent exporters write
   full paths, older ones relative names (``['', 'model', 'layers.0', ...]``);
   both give ``model.layers.0.self_attn.q_proj``.
2. metadata ``namespace`` (same exporter, older form):
   ``': LlamaForCausalLM/model: LlamaModel/model.layers.0: LlamaDecoderLayer/...'``.
3. the node name, TorchScript-exporter style: ``/model/layers.0/self_attn/q_proj/MatMul``.
Otherwise ''.
"""

from __future__ import annotations

import ast
import re

import onnx
import onnx.inliner

from planner.errors import InvalidModel

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
NAMESPACE_KEY = "namespace"
_QUOTED = re.compile(r"'([^'\\]*)'")
_PLACEHOLDERS = frozenset({"", "_empty_nn_module_stack_from_metadata_hook"})


def _join(parts: list[str]) -> str:
    """Join scope names that may be full paths ('model', 'model.layers.0') or relative ('layers.0')."""
    path = ""
    for p in parts:
        if p in _PLACEHOLDERS:
            continue
        if path and (p == path or p.startswith(path + ".")):
            path = p
        else:
            path = f"{path}.{p}" if path else p
    return path


def _parse_list(text: str) -> list[str] | None:
    items = _QUOTED.findall(text)
    if items or text.strip() in ("[]", ""):
        return items
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else None


def scope_from_name_scopes(text: str) -> str:
    items = _parse_list(text)
    if not items:
        return ""
    return _join(items[:-1])  # the last entry is the FX node, not a module


def scope_from_namespace(text: str) -> str:
    parts = [seg.split(":")[0].strip() for seg in text.split("/")]
    return _join(parts[:-1])


def scope_from_node_name(name: str) -> str:
    """`/model/layers.0/mlp/MatMul` -> `model.layers.0.mlp`; a Sequential's child `/mlp/mlp.0/` is `mlp.0`."""
    if "/" not in name:
        return ""
    parts: list[str] = []
    for p in [p for p in name.split("/") if p][:-1]:
        if parts and p.startswith(parts[-1] + "."):
            parts[-1] = p
        else:
            parts.append(p)
    return ".".join(parts)


def node_scope(node: onnx.NodeProto) -> str:
    """The scope of one node by the module's rules."""
    namespace = None
    for p in node.metadata_props:
        if p.key == NAME_SCOPES_KEY:
            return scope_from_name_scopes(p.value)
        if p.key == NAMESPACE_KEY:
            namespace = p.value
    if namespace is not None:
        return scope_from_namespace(namespace)
    return scope_from_node_name(node.name)


def _prefix(outer: str, inner: str) -> str:
    if not outer:
        return inner
    return f"{outer}.{inner}" if inner else outer


def _join_names(call: str, inner: str) -> str:
    """'/model/layers.3/Block' + '/fc/MatMul' -> '/model/layers.3/fc/MatMul'; '' unless both are paths."""
    if not (inner and call.startswith("/")):
        return ""
    return call.rsplit("/", 1)[0] + inner


def inline_functions(model: onnx.ModelProto, scopes: list[str]) -> tuple[onnx.ModelProto, list[str], str]:
    """Inline model-local functions; return the model, the scope of each resulting node, and a note.

    The inliner replaces each call by the function's body in place, in order,
    but drops metadata; we rebuild the scopes by expanding each call the same
    way: a body node's scope is the call's scope followed by its own. Names
    get the same treatment when both are paths (``/model/layers.3/Block`` and
    ``/self_attn/MatMul`` -> ``/model/layers.3/self_attn/MatMul``, as a flat
    export names it); others keep the inliner's unique names.
    """
    if not model.functions:
        return model, scopes, ""
    funcs = {(f.domain, f.name): f for f in model.functions}
    memo: dict[tuple[str, str], list[tuple[str, str]]] = {}

    def expand(key: tuple[str, str], depth: int = 0) -> list[tuple[str, str]]:
        """(scope, path name or '') of each node the function inlines to."""
        if key in memo:
            return memo[key]
        if depth > 64:
            raise RecursionError
        out: list[tuple[str, str]] = []
        for n in funcs[key].node:
            own = node_scope(n)
            callee = (n.domain, n.op_type)
            if callee in funcs:
                out.extend((_prefix(own, s), _join_names(n.name, m)) for s, m in expand(callee, depth + 1))
            else:
                out.append((own, n.name if n.name.startswith("/") else ""))
        memo[key] = out
        return out

    calls = [(n.domain, n.op_type) for n in model.graph.node if (n.domain, n.op_type) in funcs]
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # the C++ inliner raises bare RuntimeErrors / ValueErrors
        reason = str(exc).strip().split("\n")[0][:200]
        raise InvalidModel(f"the model's local functions could not be inlined ({reason}); "
                           "check that every function called is defined") from None
    new_scopes: list[str] = []
    names: list[str] = []
    try:
        for n, scope in zip(model.graph.node, scopes):
            key = (n.domain, n.op_type)
            if key in funcs:
                for s, m in expand(key):
                    new_scopes.append(_prefix(scope, s))
                    names.append(_join_names(n.name, m))
            else:
                new_scopes.append(scope)
                names.append("")
    except RecursionError:
        new_scopes = []
    if len(new_scopes) != len(inlined.graph.node):  # the inliner did something we did not mirror
        new_scopes = [scope_from_node_name(n.name) for n in inlined.graph.node]
    else:
        for node, name in zip(inlined.graph.node, names):
            if name:
                node.name = name
    if not calls:
        return inlined, new_scopes, ""
    used = sorted({f"{d}::{o}" for d, o in memo} | {f"{d}::{o}" for d, o in calls})
    note = (f"inlined {len(calls)} call(s) of model-local functions ({', '.join(used[:8])}"
            f"{', ...' if len(used) > 8 else ''}) into {len(inlined.graph.node)} nodes")
    return inlined, new_scopes, note
