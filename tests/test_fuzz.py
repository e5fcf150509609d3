"""Mutated inputs never give a traceback: a few hundred seeded mutations of two ONNX fixtures and two plans.

Each mutation is read as `hyperplan inspect` reads a model (import, block discovery, summary) or as
`hyperplan validate` reads a declaration (parse, schema, every check, the re-estimate). Success and the
project's own errors (HyperplanError, SpecError: one sentence, an exit code) pass; anything else is a bug,
reported with the mutation that made it. Seeded, so a failure replays; bounded, so the suite stays quick.
"""

from __future__ import annotations

import copy
import json
import random
import traceback
from pathlib import Path
from typing import Any, Callable

import onnx
import pytest
import yaml

from cost_models.errors import SpecError
from planner.errors import HyperplanError

FIXTURES = Path(__file__).parent / "fixtures"
SEED = 17
ONNX_MUTATIONS = 90  # per fixture
PLAN_MUTATIONS = 90  # per plan
OURS = (HyperplanError, SpecError)

_JUNK: tuple[Any, ...] = (None, "", "tp", "x" * 300, -1, 0, 1, 2**62, -(2**62), 0.5, 1e308, float("nan"),
                          float("inf"), True, False, [], {}, ["tp", "tp"], [None], {"a": 1}, "\u00b2", "日本")


def _failures(cases: list[tuple[str, Callable[[], Any]]]) -> list[str]:
    out = []
    for label, run in cases:
        try:
            run()
        except OURS:
            pass
        except Exception:  # noqa: BLE001 - the point: anything else is a traceback a user would see
            out.append(f"{label}:\n{traceback.format_exc(limit=-3)}")
    return out


# -- ONNX models -------------------------------------------------------------------------------------
def _mutate_model(base: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """One to three structural edits of the model (or its bytes), and what they were."""
    if rng.random() < 0.1:  # raw bytes: a truncated or bit-flipped file
        raw = bytearray(base.SerializeToString())
        if rng.random() < 0.5:
            del raw[rng.randrange(len(raw)):]
            return bytes(raw), "truncated"
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw), "bit flips"
    m = copy.deepcopy(base)
    g = m.graph
    done = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("op_type", "input", "output", "drop_node", "attr", "attr_bytes", "init_dims",
                           "init_dtype", "init_data", "input_dim", "metadata", "opset", "domain", "name"))
        node = g.node[rng.randrange(len(g.node))] if g.node else None
        if kind == "op_type" and node is not None:
            node.op_type = rng.choice(("MatMul", "Gather", "Reshape", "Softmax", "Concat", "Add", "Trilu",
                                       "Range", "Expand", "Where", "ScatterND", "If", "Loop", "Frobnicate", ""))
        elif kind == "input" and node is not None and node.input:
            names = [t.name for t in g.initializer] + [o for n in g.node for o in n.output]
            node.input[rng.randrange(len(node.input))] = rng.choice(names + ["", "no_such_tensor"])
        elif kind == "output" and node is not None and node.output:
            node.output[rng.randrange(len(node.output))] = rng.choice(("", "dup", g.node[0].output[0]))
        elif kind == "drop_node" and node is not None:
            g.node.remove(node)
        elif kind == "attr" and node is not None and node.attribute:
            a = node.attribute[rng.randrange(len(node.attribute))]
            a.i = rng.choice((0, -1, 1, 7, 2**40, -(2**40)))
            if a.ints:
                a.ints[rng.randrange(len(a.ints))] = rng.choice((0, -1, 5, 2**40))
            if rng.random() < 0.3:
                a.type = rng.choice(list(onnx.AttributeProto.AttributeType.values()))
        elif kind == "attr_bytes" and node is not None:
            node.attribute.append(onnx.helper.make_attribute("equation", b"\xff\xfe\x00bytes"))
            if node.attribute:
                node.attribute[0].s = rng.choice((b"\xff\xfe", b"", b"\x00" * 3, "é".encode("latin-1")))
        elif kind in ("init_dims", "init_dtype", "init_data") and g.initializer:
            t = g.initializer[rng.randrange(len(g.initializer))]
            if kind == "init_dims" and t.dims:
                t.dims[rng.randrange(len(t.dims))] = rng.choice((0, -3, 1, 2**31, 2**45))
            elif kind == "init_dtype":
                t.data_type = rng.choice((0, 2, 7, 8, 9, 16, 17, 21, 99))
            else:
                t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data) + 1)]
        elif kind == "input_dim" and g.input:
            dims = g.input[rng.randrange(len(g.input))].type.tensor_type.shape.dim
            if dims:
                d = dims[rng.randrange(len(dims))]
                if rng.random() < 0.5:
                    d.dim_value = rng.choice((0, -1, 1, 2**40))
                else:
                    d.dim_param = rng.choice(("", "s0", "batch*seq", "(((", "seq+", "é", "seq//0"))
        elif kind == "metadata":
            p = m.metadata_props.add() if rng.random() < 0.5 else g.metadata_props.add()
            p.key = rng.choice(("pkg.torch.export.ExportedProgram.graph_signature", "hyperplan.params", "x"))
            p.value = rng.choice(("PARAMETER target='w'", "garbage", "", "[1, 2", "{'a':"))
        elif kind == "opset" and m.opset_import:
            m.opset_import[0].version = rng.choice((0, 1, 7, 99, 10**6))
        elif kind == "domain" and node is not None:
            node.domain = rng.choice(("com.microsoft", "pkg.onnxscript.torch_lib", "ai.onnx.ml", "x.y"))
        elif kind == "name" and node is not None:
            node.name = rng.choice(("", "/", "/model/layers.0/../x", "a" * 2000, "/model/layers.99999999999/x"))
        done.append(kind)
    return m.SerializeToString(), "+".join(done)


@pytest.mark.parametrize("fixture", ["gpt2", "llama_gqa"])
def test_mutated_models_fail_in_one_sentence(fixture, tmp_path):
    from planner.graph.blocks import discover_blocks
    from planner.graph.onnx_import import import_model
    from planner.graph.summary import summarize

    base = onnx.load(str(FIXTURES / f"{fixture}.onnx"))
    rng = random.Random(f"{SEED}-{fixture}")
    cases = []
    for k in range(ONNX_MUTATIONS):
        data, what = _mutate_model(base, rng)
        path = tmp_path / f"m{k}.onnx"
        path.write_bytes(data)

        def run(path=path):
            graph = import_model(str(path), batch=2, seq_len=8)
            summarize(graph, discover_blocks(graph))

        cases.append((f"{fixture} mutation {k} ({what})", run))
    failures = _failures(cases)
    assert not failures, f"{len(failures)} of {ONNX_MUTATIONS} mutations gave a traceback:\n" + "\n".join(failures[:5])


# -- declarations ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, dict]:
    """A training plan (two pipeline stages) and a serving plan (prefill and decode) of a two-layer GPT."""
    from planner.api import plan_inference, plan_model
    from planner.hypershard import Request, declare_plan, declare_serving

    request = Request(model="gpt", cluster="dgx-h100", overrides={"layers": 2}, dims={})
    train = plan_model("gpt", cluster="dgx-h100", devices=4, global_batch=8, seq_len=256, overrides={"layers": 2})
    serve = plan_inference("gpt", cluster="dgx-h100", devices=4, prompt_len=128, gen_len=32, batch=2,
                           overrides={"layers": 2})
    return {"train": declare_plan(train, request), "serve": declare_serving(serve, request)}


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out += _paths(v, prefix + (k,))
    return out


def _mutate_doc(base: dict, rng: random.Random) -> tuple[str, str, str]:
    """A mutated declaration as text (YAML or JSON), its suffix, and what was done."""
    doc = copy.deepcopy(base)
    done = []
    for _ in range(rng.randint(1, 2)):
        path = rng.choice(_paths(doc)[1:])
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        op = rng.choice(("junk", "junk", "delete", "extra", "scale"))
        if op == "junk":
            parent[key] = copy.deepcopy(rng.choice(_JUNK))
        elif op == "delete":
            del parent[key]
        elif op == "extra" and isinstance(parent[key], dict):
            parent[key][rng.choice(("zzz", "tp", "stage"))] = rng.choice(_JUNK)
        elif op == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * rng.choice((0, -1, 2, 1000, 10**9))
        done.append(f"{op} {'.'.join(map(str, path))}")
    suffix = ".json" if rng.random() < 0.3 else ".yaml"
    if suffix == ".json":
        text = json.dumps(doc, indent=1)  # NaN and Infinity as JSON's non-standard words
    else:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        lines = text.splitlines()
        if rng.random() < 0.2 and len(lines) > 2:  # a repeated or a lost line
            i = rng.randrange(1, len(lines))
            lines.insert(i, lines[i]) if rng.random() < 0.5 else lines.pop(i)
            done.append(f"line {i}")
            text = "\n".join(lines) + "\n"
    return text, suffix, "; ".join(done)


@pytest.mark.parametrize("which", ["train", "serve"])
def test_mutated_declarations_fail_in_one_sentence(plans, which, tmp_path):
    from planner.hypershard.io import read_document
    from planner.hypershard.validate import validate_document

    rng = random.Random(f"{SEED}-{which}")
    cases = []
    for k in range(PLAN_MUTATIONS):
        text, suffix, what = _mutate_doc(plans[which], rng)
        path = tmp_path / f"d{k}{suffix}"
        path.write_text(text, encoding="utf-8")

        def run(path=path):
            validate_document(read_document(str(path)), path.name, base_dir=str(tmp_path))

        cases.append((f"{which} mutation {k} ({what})", run))
    failures = _failures(cases)
    assert not failures, f"{len(failures)} of {PLAN_MUTATIONS} mutations gave a traceback:\n" + "\n".join(failures[:5])
