"""Megatron-Bridge's performance presets as Python functions (tag v0.6.0 on, NeMo 26.08): read without running them.

From v0.6.0 a workload preset is a function, src/megatron/bridge/perf_recipes/<family>/<gpu>/<model>.py:
`<model>_pretrain_<N>gpu_<gpu>_<precision>[_<variant>]_config`, which builds the library recipe's ConfigContainer
and sets fields on it, directly (`cfg.model.expert_model_parallel_size = 64`) and through the family's helpers
(`_enable_deepseek_full_iteration_mxfp8(cfg, fp8_dot_product_attention=True)` in <family>/common.py and
perf_recipes/_common.py). `preset_settings` walks such a function's statements (ast; nothing is imported or run):
an assignment of a literal (or of a helper's argument) to a field path records it, the last one wins; a call of a
function defined in the perf_recipes modules runs its body with its arguments bound; a CommOverlapConfig(...)
assigned to a path records its keywords; `cfg.env_vars = {...}` records the literal variables; a library setter
(`SETTERS`) records the value it is given. Not followed: the
library recipe the function starts from (megatron.bridge.recipes: its defaults are the stack's, as for the older
presets), and `if`/`for`/`with` blocks (only the benchmark helper's clean-ups use them). `preset_fields` turns the
settings into the fields `benchmarks/extract_bridge_sweep.py` records for the older presets.
"""

from __future__ import annotations

import ast
import re
from typing import Callable

ROOT_DIR = "src/megatron/bridge/perf_recipes"
PACKAGE = "megatron.bridge.perf_recipes"
FUNCTION = re.compile(r"^(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>gb300|gb200|b300|b200|h100)_"
                      r"(?P<prec>bf16|fp8cs|fp8mx|nvfp4)(?:_(?P<variant>[a-z0-9_]+?))?_config$")
#: the sweep's precision names -> the functions'
PRECISION = {"BF16": "bf16", "FP8_CS": "fp8cs", "FP8_MX": "fp8mx", "NVFP4": "nvfp4"}
#: setting path -> the field name the older presets (WorkloadBaseConfig) give it
FIELDS = {"model.tensor_model_parallel_size": "tensor_model_parallel_size",
          "model.pipeline_model_parallel_size": "pipeline_model_parallel_size",
          "model.context_parallel_size": "context_parallel_size",
          "model.virtual_pipeline_model_parallel_size": "virtual_pipeline_model_parallel_size",
          "model.expert_model_parallel_size": "expert_model_parallel_size",
          "model.expert_tensor_parallel_size": "expert_tensor_parallel_size",
          "train.global_batch_size": "global_batch_size", "train.micro_batch_size": "micro_batch_size",
          "model.cuda_graph_impl": "cuda_graph_impl", "model.cuda_graph_scope": "cuda_graph_scope",
          "model.moe_flex_dispatcher_backend": "moe_flex_dispatcher_backend",
          "comm_overlap.overlap_moe_expert_parallel_comm": "moe_a2a_overlap",
          "mixed_precision.fp8_dot_product_attention": "fp8_dot_product_attention",
          "model.pipeline_model_parallel_layout": "pp_layout"}
#: library recipe helpers (not followed) whose second argument, or `layout=`, sets a field of the config their first
#: names when given: recipes/deepseek/h100/deepseek_v3.py (v0.6.0) set_deepseek_v3_pipeline_model_parallel_layout
#: (`if layout is not None: model_cfg.pipeline_model_parallel_layout = layout`; without one, its map by pp and vpp)
SETTERS = {"set_deepseek_v3_pipeline_model_parallel_layout": ("layout", "pipeline_model_parallel_layout")}


class _Reader:
    """The functions of the perf_recipes modules a recipe file imports (and theirs), and their evaluation."""

    def __init__(self, show: Callable[[str], str]) -> None:
        self.show, self.functions, self.seen = show, {}, set()

    def load(self, path: str) -> None:
        if path in self.seen:
            return
        self.seen.add(path)
        tree = ast.parse(self.show(path))
        for node in tree.body:  # a module's own definitions before what it imports, as Python resolves its names
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, node)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
                self.load(f"{ROOT_DIR}/{node.module.removeprefix(PACKAGE + '.').replace('.', '/')}.py")

    def run(self, fn: ast.FunctionDef, env: dict, out: dict) -> None:
        for stmt in fn.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self.assign(stmt.targets[0], stmt.value, env, out)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self.call(stmt.value, env, out)

    def call(self, node: ast.Call, env: dict, out: dict) -> str | None:
        """Run a perf_recipes function (its body with its arguments bound); the path it returns, if a config."""
        name = node.func.id if isinstance(node.func, ast.Name) else None
        fn = self.functions.get(name)
        if fn is None:
            if name in SETTERS and node.args:
                keyword, field = SETTERS[name]
                given = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == keyword), None)
                path, value = self.value(node.args[0], env), self.value(given, env) if given is not None else None
                if isinstance(path, _Path) and value is not None:
                    out[f"{path}.{field}"] = value
                elif isinstance(path, _Path):  # the setter's own choice (its map) replaces an earlier value
                    out.pop(f"{path}.{field}", None)
            return None
        params = fn.args.posonlyargs + fn.args.args
        bound = dict(zip([a.arg for a in params[len(params) - len(fn.args.defaults):]],
                         [self.value(d, {}) for d in fn.args.defaults]))
        bound |= {a.arg: self.value(d, {}) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None}
        bound |= {a.arg: self.value(v, env) for a, v in zip(params, node.args)}
        bound |= {k.arg: self.value(k.value, env) for k in node.keywords if k.arg}
        self.run(fn, bound, out)
        returned = next((s.value for s in fn.body if isinstance(s, ast.Return) and s.value is not None), None)
        return self.value(returned, bound) if returned is not None else None

    def assign(self, target: ast.expr, value: ast.expr, env: dict, out: dict) -> None:
        if isinstance(target, ast.Name):  # `cfg = recipe()`: the config the statements below set fields of
            if isinstance(value, ast.Call):
                made = self.call(value, env, out)
                env[target.id] = made if isinstance(made, _Path) else _Path("")
            else:
                env[target.id] = self.value(value, env)
            return
        path = self.value(target, env)
        if not isinstance(path, _Path):
            return
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "CommOverlapConfig":
            out.update({f"{path}.{k.arg}": self.value(k.value, env) for k in value.keywords if k.arg})
        elif isinstance(value, ast.Dict) and str(path) == "env_vars":
            out.update({f"env_vars.{k.value}": self.value(v, env) for k, v in zip(value.keys, value.values)
                        if isinstance(k, ast.Constant)})
        else:
            out[str(path)] = self.value(value, env)

    def value(self, node: ast.expr, env: dict):
        """A literal, a bound name, or a config path (`cfg.model`); None for anything else."""
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.value(node.value, env)
            return _Path(f"{base}.{node.attr}".lstrip(".")) if isinstance(base, _Path) else None
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None


class _Path(str):
    """A field path of the config under construction ("" for the config itself)."""


def preset_settings(show: Callable[[str], str], file: str, function: str) -> dict:
    """Every field path a perf_recipes function sets, with its value (None where not a literal)."""
    reader = _Reader(show)
    reader.load(file)
    out: dict = {}
    reader.run(reader.functions[function], {}, out)
    return {k: v for k, v in out.items() if not isinstance(v, _Path)}


def recipe_functions(show: Callable[[str], str], files: list[str], model: str, gpu: str, precision: str) -> dict:
    """The preset functions of a model, GPU and precision in a tag's perf_recipes files: name -> (file, number of
    GPUs, variant or "")."""
    out = {}
    for f in files:
        if f.startswith(f"{ROOT_DIR}/") and f"/{gpu}/" in f and f.endswith(".py"):
            for node in ast.parse(show(f)).body:
                m = FUNCTION.match(node.name) if isinstance(node, ast.FunctionDef) else None
                if m and m["model"] == model and m["gpu"] == gpu and m["prec"] == precision:
                    out[node.name] = (f, int(m["gpus"]), m["variant"] or "")
    return out


def preset_fields(settings: dict, gpus: int, file: str) -> dict:
    """A function's settings as the older presets' fields, with what its release's code forced (`code`)."""
    fields = {"num_gpus": gpus} | {name: settings[path] for path, name in FIELDS.items()
                                   if settings.get(path) is not None}
    get = settings.get
    if get("model.cuda_graph_impl") == "local" and get("model.cuda_graph_modules") == "full_iteration":
        fields["cuda_graph_impl"], fields["cuda_graph_scope"] = "full_iteration", []
    if get("model.recompute_granularity") == "selective" and get("model.recompute_modules") is not None:
        fields["recompute_modules"] = settings["model.recompute_modules"]
    if get("model.cpu_offloading") and get("model.cpu_offloading_num_layers"):
        fields["cpu_offloading_num_layers"] = settings["model.cpu_offloading_num_layers"]
    if get("ddp.use_megatron_fsdp") or get("dist.use_megatron_fsdp"):
        fields["use_megatron_fsdp"] = True
    if get("env_vars.NVTE_CUTEDSL_FUSED_GROUPED_MLP") in (1, "1") or get("model.cutedsl_fused_grouped_mlp"):
        fields["cutedsl_fused_grouped_mlp"] = True
    return {k: v for k, v in fields.items() if v is not False} | {"_file": file}


def code_of(settings: dict, file: str, function: str) -> dict:
    """The settings the older releases forced in code rather than in the preset: the token dispatcher and TP
    communication overlap."""
    out: dict = {"_function": f"{file}:{function}"}
    if settings.get("model.moe_token_dispatcher_type"):
        out["moe_token_dispatcher_type"] = settings["model.moe_token_dispatcher_type"]
    if settings.get("comm_overlap.tp_comm_overlap") is not None:
        out["tp_comm_overlap"] = settings["comm_overlap.tp_comm_overlap"]
    return out
