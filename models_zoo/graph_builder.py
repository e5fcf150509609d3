"""Emit an ONNX graph the way PyTorch's exporter would, without any weights.

Why a builder of our own: the zoo's graphs must be small (a 671B model in
a few hundred KB) and fast to build (< 2 s), so parameters are
*weightless* initializers (external data at a location that names no file),
repeated layers can be local functions, and every op is appended straight
to protobuf lists.

Conventions the rest of hyperplan relies on:

- initializers are parameters and nothing else; small constants (shapes,
  axes, scales) are `Constant` nodes, so summing initializer dims counts
  parameters;
- a parameter is named by its module path, as `torch.nn.Module.named_parameters`
  gives it (``model.layers.0.self_attn.q_proj.weight``), with the shape the
  framework stores (``nn.Linear``: ``[out_features, in_features]``);
- a node is named after its module scope in TorchScript-exporter style
  (``/model/layers.0/self_attn/q_proj/MatMul``) and carries the metadata
  key ``pkg.torch.onnx.name_scopes`` in the format of torch's dynamo exporter
  (``"['', 'model', 'model.layers.0', ..., 'matmul_12']"``);
- with ``flat=False`` each repeated layer is one model-local function
  (`layer_functions`) called once per layer: body nodes are named relative
  to the layer (``/self_attn/q_proj/MatMul``) without metadata, the call
  sits in the layer's scope, so an importer that inlines gets the same
  names and scopes back;
- weightless initializers use ``data_location=EXTERNAL`` with location
  ``#weightless``. onnx.checker does not look for a file when the location
  starts with ``#`` and no model path is given; a saved zoo file must
  therefore be read with ``onnx.load(path, load_external_data=False)``
  (what any planner of a 100B+ model does anyway).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from onnx import ModelProto, StringStringEntryProto, TensorProto, helper

#: Location of weightless parameters; '#' tells onnx.checker there is no file to look for.
WEIGHTLESS_LOCATION = "#weightless"
#: Opset of every zoo graph: 22 is the first where Conv, AveragePool and Cos take bfloat16.
OPSET = 22
IR_VERSION = 10
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
#: Domain of the zoo's layer functions (model-local, version 1).
FUNCTION_DOMAIN = "hyperplan.zoo"

DTYPES: dict[str, int] = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
}


def split_module_path(path: str) -> list[str]:
    """'model.layers.0.self_attn' -> ['model', 'layers.0', 'self_attn'] (an index stays with its list)."""
    out: list[str] = []
    for part in path.split("."):
        if part.isdigit() and out:
            out[-1] = f"{out[-1]}.{part}"
        elif part:
            out.append(part)
    return out


class GraphBuilder:
    """Append-only ONNX graph under construction, with a current module scope.

    One builder makes one model; it is not reused. `param` declares a
    weightless parameter in the current scope, `op` appends a node and
    returns its output names.
    """

    def __init__(self, name: str, dtype: str, *, flat: bool = True) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(sorted(DTYPES))}.")
        self.name = name
        self.dtype = dtype
        self.elem = DTYPES[dtype]
        self.flat = flat
        self.graph = helper.make_graph([], name, [], [])
        #: Layer functions defined so far, by name (`layer_functions.LayerFunction`), in definition order.
        self.functions: dict[str, Any] = {}
        #: In a function body: the parameters it takes as inputs, (relative name, shape); None in a graph.
        self.body_params: list[tuple[str, tuple[int, ...]]] | None = None
        self._scope: list[str] = []
        self._scope_info: tuple[str, str, list[str]] = ("", "", [""])
        self._op_counts: dict[tuple[str, str], int] = {}
        self._consts: dict[tuple, str] = {}
        self._values = 0
        self.param_numel = 0

    # ---- scopes -------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, path: str) -> Iterator[None]:
        """Enter a module scope relative to the current one ('layers.3', 'self_attn.q_proj')."""
        parts = split_module_path(path)
        saved = (self._scope, self._scope_info)
        self._scope = self._scope + parts
        self._refresh_scope()
        try:
            yield
        finally:
            self._scope, self._scope_info = saved

    @property
    def module_path(self) -> str:
        return self._scope_info[1]

    def _refresh_scope(self) -> None:
        dotted = ".".join(self._scope)
        cumulative = [""] + [".".join(self._scope[: i + 1]) for i in range(len(self._scope))]
        self._scope_info = ("/" + "/".join(self._scope) if self._scope else "", dotted, cumulative)

    # ---- graph interface ----------------------------------------------------------------
    def input(self, name: str, elem: int, shape: Sequence[int]) -> str:
        self.graph.input.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, value: str, name: str, elem: int, shape: Sequence[int]) -> None:
        """Expose `value` as graph output `name` (an Identity keeps the producer's name free)."""
        self.op("Identity", [value], outputs=[name])
        self.graph.output.append(helper.make_tensor_value_info(name, elem, list(shape)))

    def param(self, suffix: str, shape: Sequence[int]) -> str:
        """Declare a weightless parameter `<module path>.<suffix>` of the model dtype.

        In a function body the parameter is a function input of that
        (layer-relative) name instead; each call declares the real one.
        """
        full = f"{self.module_path}.{suffix}" if self.module_path else suffix
        if self.body_params is not None:
            self.body_params.append((full, tuple(int(d) for d in shape)))
            return full
        t = self.graph.initializer.add()
        t.name = full
        t.data_type = self.elem
        t.dims.extend(int(d) for d in shape)
        t.data_location = TensorProto.EXTERNAL
        entry = t.external_data.add()
        entry.key = "location"
        entry.value = WEIGHTLESS_LOCATION
        numel = 1
        for d in shape:
            numel *= int(d)
        self.param_numel += numel
        return full

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        n_out: int = 1,
        outputs: Sequence[str] | None = None,
        domain: str = "",
        **attrs: object,
    ) -> str | list[str]:
        """Append one node in the current scope; return its output name (a list when n_out > 1).

        Function bodies carry no scope metadata: their node names hold the
        layer-relative path, and one copy per function is all the file has.
        """
        prefix, _, cumulative = self._scope_info
        key = (prefix, op_type)
        k = self._op_counts.get(key, 0)
        self._op_counts[key] = k + 1
        node_name = f"{prefix}/{op_type}" + (f"_{k}" if k else "")
        if outputs is None:
            outputs = []
            for _ in range(n_out):
                self._values += 1
                outputs.append(f"{op_type.lower()}_{self._values}")
        node = helper.make_node(op_type, list(inputs), list(outputs), name=node_name, domain=domain or None, **attrs)
        if self.body_params is None:
            short = f"{op_type.lower()}_{k}" if k else op_type.lower()
            node.metadata_props.append(StringStringEntryProto(key=NAME_SCOPES_KEY, value=repr(cumulative + [short])))
        self.graph.node.append(node)
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def const(self, values: Sequence[float] | Sequence[int] | float | int, elem: int = TensorProto.INT64) -> str:
        """A small constant as a `Constant` node (never an initializer), shared within a scope."""
        scalar = not isinstance(values, (list, tuple))
        vals = tuple(values) if not scalar else (values,)
        key = (self._scope_info[0], elem, scalar, vals)
        if key in self._consts:
            return self._consts[key]
        dims: list[int] = [] if scalar else [len(vals)]
        tensor = helper.make_tensor("value", elem, dims, list(vals))
        out = self.op("Constant", [], value=tensor)
        self._consts[key] = out
        return out

    def fconst(self, value: float) -> str:
        """A scalar constant of the model dtype (for scales and epsilons)."""
        return self.const(float(value), self.elem)

    def op_counts(self) -> dict[tuple[str, str], int]:
        """Nodes emitted so far per (scope prefix, op type): the numbering of node names."""
        return self._op_counts

    def skip_op_names(self, counts: dict[tuple[str, str], int]) -> None:
        """Advance the numbering as if nodes `counts` (prefixes relative to the current scope) had been
        emitted here: a layer called as a function leaves later names as the flat graph has them."""
        prefix = self._scope_info[0]
        for (rel, op_type), n in counts.items():
            key = (prefix + rel, op_type)
            self._op_counts[key] = self._op_counts.get(key, 0) + n

    # ---- result ---------------------------------------------------------------------------
    def finish(self, metadata: dict[str, str], doc: str = "") -> ModelProto:
        opsets = [helper.make_opsetid("", OPSET)]
        if self.functions:
            opsets.append(helper.make_opsetid(FUNCTION_DOMAIN, 1))
        model = helper.make_model(
            self.graph,
            opset_imports=opsets,
            producer_name="hyperplan.models_zoo",
            producer_version="0.1.0",
            ir_version=IR_VERSION,
            doc_string=doc,
            functions=[f.proto for f in self.functions.values()],
        )
        for k in sorted(metadata):
            model.metadata_props.append(StringStringEntryProto(key=k, value=metadata[k]))
        return model


def materialize(model: ModelProto, seed: int = 0, scale: float = 0.02) -> ModelProto:
    """A copy of a float32 zoo model whose weightless parameters hold random data (for running it)."""
    rng = np.random.default_rng(seed)
    out = ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type != TensorProto.FLOAT:
            raise ValueError(f"materialize needs a float32 model; parameter {t.name!r} is not float32.")
        data = (rng.standard_normal(tuple(t.dims)) * scale).astype(np.float32)
        if t.name.endswith(("norm.weight", "layernorm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
            data += 1.0
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
        t.raw_data = data.tobytes()
    return out

