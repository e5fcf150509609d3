"""Bind symbolic dimensions (`dim_param`) to numbers before shape inference.

Three sources, in order of precedence:
1. `dims`: exact name -> value (``--dim sequence_length=4096``).
2. `batch`: every symbol whose name reads as a batch size. The name is split
   into lower-case words (at '_', '-', ' ', '.', camelCase and digit runs);
   it is a batch dim when it is one of ``n``, ``b``, ``bs``, ``bsz``,
   ``batch``, ``batchsize``, ``nbatch`` or contains the word ``batch``
   (``batch_size``, ``BatchSize``, ``input_batch``).
3. `seq_len`: every symbol whose words include ``seq``, ``seqlen``,
   ``sequence``, ``len``, ``length``, ``tokens``, ``ntokens``, ``num_tokens``
   or ``time`` (``seq``, ``sequence_length``, ``encoder_sequence_length``),
   unless a word is ``past``, ``cache``, ``max`` or ``total``: those are KV-cache
   or capacity sizes that differ from the prompt length and must be bound with
   ``--dim``.

4. roles, for symbols whose names say nothing (``s0``, ``s72``: what
   torch's dynamo exporter writes even when ``Dim("batch")`` is given): the
   dims of the graph's token inputs (integer, rank 2: ``input_ids``,
   ``attention_mask``, ``position_ids``) are batch and sequence; the first dim
   of a floating input of rank 3 or more (pixels, audio features, embeddings)
   is a batch (`input_roles`).

Symbols may be expressions of other symbols, as exporters write them
(``seq + 1``, ``2*s0``, ``past_sequence_length + sequence_length``); they are
evaluated once their names are bound (+, -, *, /, //, %, min, max, floor, ceil).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Mapping

_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_BATCH_EXACT = frozenset({"n", "b", "bs", "bsz", "batch", "batchsize", "nbatch", "batch_size"})
_SEQ_WORDS = frozenset({"seq", "seqlen", "sequence", "len", "length", "tokens", "ntokens", "time"})
_SEQ_EXCLUDE = frozenset({"past", "cache", "max", "total"})
_FUNCS = {"min": min, "max": max, "floor": math.floor, "ceil": math.ceil,
          "Min": min, "Max": max, "floor_div": lambda a, b: a // b}


def words(name: str) -> list[str]:
    """Lower-case words of a symbol name: 'batchSize_2' -> ['batch', 'size', '2']."""
    return [w.lower() for w in _WORDS.findall(name)]


def is_batch_name(name: str) -> bool:
    w = words(name)
    return name.lower() in _BATCH_EXACT or "".join(w) in _BATCH_EXACT or "batch" in w or "batchsize" in w


def is_seq_name(name: str) -> bool:
    w = set(words(name))
    return bool(w & _SEQ_WORDS) and not (w & _SEQ_EXCLUDE)


#: What a graph input's dims are, by its kind: (is integer, rank) -> the role of each leading dim.
_TOKEN_ROLES = ("batch", "seq")
_FEATURE_ROLES = ("batch",)


def input_roles(inputs: list[tuple[bool, list[str]]]) -> dict[str, str]:
    """Symbol -> 'batch' or 'seq' from the graph's inputs, each given as (integer dtype, its dims' symbols, ''
    for a fixed dim): token inputs (integer, rank 2) give batch and sequence, floating inputs of rank 3 or
    more a batch. A symbol given two roles keeps none (see the module docstring)."""
    seen: dict[str, set[str]] = {}
    for integer, syms in inputs:
        roles = _TOKEN_ROLES if integer and len(syms) == 2 else _FEATURE_ROLES if not integer and len(syms) >= 3 \
            else ()
        for role, sym in zip(roles, syms):
            if sym:
                seen.setdefault(sym, set()).add(role)
    return {sym: next(iter(r)) for sym, r in sorted(seen.items()) if len(r) == 1}


def bind(symbols: list[str], dims: Mapping[str, int] | None, batch: int | None,
         seq_len: int | None, roles: Mapping[str, str] | None = None) -> dict[str, int]:
    """Values for the plain-name `symbols` the four sources decide (unbound ones are left out)."""
    out: dict[str, int] = {}
    dims = dims or {}
    roles = roles or {}
    for s in symbols:
        if s in dims:
            out[s] = int(dims[s])
        elif batch is not None and is_batch_name(s):
            out[s] = int(batch)
        elif seq_len is not None and is_seq_name(s):
            out[s] = int(seq_len)
        elif batch is not None and roles.get(s) == "batch" and not is_seq_name(s):
            out[s] = int(batch)
        elif seq_len is not None and roles.get(s) == "seq" and not is_batch_name(s):
            out[s] = int(seq_len)
    return out


def names_in(expr: str) -> list[str]:
    """The symbol names an expression uses ('seq + 1' -> ['seq']); the name itself if it does not parse."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return [expr]
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS})


def evaluate(expr: str, values: Mapping[str, int]) -> int | None:
    """Integer value of a dim expression over bound `values`; None if a name is unbound or it is not arithmetic."""
    if expr in values:
        return int(values[expr])
    try:
        tree = ast.parse(expr, mode="eval")
        result = _eval(tree.body, values)
    except (SyntaxError, KeyError, ValueError, TypeError, ZeroDivisionError, RecursionError):
        return None
    if result is None or result != int(result) or result < 0:
        return None
    return int(result)


def _eval(node: ast.AST, values: Mapping[str, int]) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, values)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, values), _eval(node.right, values)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*(_eval(a, values) for a in node.args))
    raise ValueError("not a dim expression")
