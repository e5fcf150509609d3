"""Pin the launch-config names hyperplan writes to the frameworks' own sources (a developer tool, not a test).

    python benchmarks/launch_sources.py megatron  [--git DIR]   # tests/data/megatron_arguments.json
    python benchmarks/launch_sources.py check     [--git DIR]   # benchmarks/megatron_parser_check.json
    python benchmarks/launch_sources.py torchtitan [--git DIR]  # tests/data/torchtitan_source.json
    python benchmarks/launch_sources.py mindformers [--git DIR] # tests/data/mindformers_config.json

`megatron` builds Megatron-LM's real argument parser (`add_megatron_arguments` of
megatron/training/arguments.py at tag core_v0.16.1, the release of the megatron-core
wheel installed from PyPI) from a Megatron-LM git directory, and records every flag
with its dest, type, nargs and choices. Nothing of Megatron-LM is copied into the
repository: the file is read from the git directory into a temporary folder and
imported from there. `check` goes further, outside any test: it exports plans to
megatron arguments, adds a model's own arguments (from the zoo preset's published
shape) and runs Megatron-LM's parse_args, validate_args (WORLD_SIZE set to the plan's
devices; get_device_arch_version, which needs a GPU, answered as Hopper, 9) and
core_transformer_config_from_args, recording the degrees Megatron-LM derives.
`torchtitan` and `mindformers` record the field names our exports use, read from
their sources at the commits named in each file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MIRROR = Path("/work/.mirror")
MEGATRON_TAG = "core_v0.16.1"
TORCHTITAN_TAG = "v0.2.2"


def git(gitdir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(gitdir), *args], check=True, capture_output=True,
                          text=True).stdout


def extract(gitdir: Path, ref: str, paths: list[str], into: Path) -> None:
    archive = subprocess.run(["git", "--git-dir", str(gitdir), "archive", ref, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def megatron_arguments(tree: Path):
    """Megatron-LM's megatron.training.arguments module, imported from `tree` without running the package's
    __init__ (which imports the whole trainer); megatron.core is the installed wheel."""
    sys.path.insert(0, str(tree))
    pkg = types.ModuleType("megatron.training")
    pkg.__path__ = [str(tree / "megatron" / "training")]
    sys.modules["megatron.training"] = pkg
    import megatron.training.global_vars as gv

    for name in ("get_args", "get_timers", "get_adlr_autoresume", "get_signal_handler", "get_tokenizer",
                 "get_tensorboard_writer", "get_wandb_writer", "get_one_logger"):
        setattr(pkg, name, getattr(gv, name))
    from megatron.training import arguments

    return arguments


def flag_table(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Per flag: whether it takes a value, and (when given) its dest (when not the flag's own name), type, nargs
    and choices."""
    out = {}
    for action in parser._actions:
        for flag in action.option_strings:
            entry = {"value": action.nargs != 0}
            if action.dest != flag.lstrip("-").replace("-", "_"):
                entry["dest"] = action.dest
            if action.type is not None:
                entry["type"] = getattr(action.type, "__name__", str(action.type))
            if action.nargs not in (None, 0):
                entry["nargs"] = action.nargs
            if action.choices:
                entry["choices"] = [str(getattr(c, "name", c)) for c in action.choices]
            out[flag] = entry
    return dict(sorted(out.items()))


def dump(obj: dict, table: str) -> str:
    """JSON with one line per entry of `table` (a reviewable diff when a pinned source moves)."""
    head = {k: v for k, v in obj.items() if k != table}
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in obj[table].items())
    return json.dumps(head, indent=1)[:-2] + f',\n "{table}": {{\n{rows}\n }}\n}}\n'


def with_megatron(gitdir: Path, work):
    with tempfile.TemporaryDirectory() as tmp:
        extract(gitdir, MEGATRON_TAG, ["megatron/training", "megatron/legacy"], Path(tmp))
        commit = git(gitdir, "rev-parse", f"{MEGATRON_TAG}^{{commit}}").strip()
        return work(megatron_arguments(Path(tmp)), commit)


def cmd_megatron(gitdir: Path) -> None:
    def work(arguments, commit):
        parser = arguments.add_megatron_arguments(argparse.ArgumentParser())
        import megatron.core

        return {"source": f"NVIDIA/Megatron-LM@{commit} ({MEGATRON_TAG}) megatron/training/arguments.py, "
                          "add_megatron_arguments",
                "read_with": f"megatron-core {megatron.core.__version__} (PyPI)",
                "renames": {"decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
                            "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
                            "fp8_param_gather": "fp8_param"},
                "renames_source": "core_transformer_config_from_args (same file): the args it copies under "
                                  "another TransformerConfig field name",
                "flags": flag_table(parser)}

    out = with_megatron(gitdir, work)
    (DATA / "megatron_arguments.json").write_text(dump(out, "flags"))
    print(f"{len(out['flags'])} flags -> tests/data/megatron_arguments.json")


def cmd_torchtitan(gitdir: Path) -> None:
    """torchtitan's module names of its LLMs' pipeline chunks, read at v0.2.2: the attributes each model defines,
    and what its own generate_llm_fqn_per_model_part (run from the source read, pure Python) gives for equal
    splits, with the embedding and output counted as no layer."""
    import ast
    import re

    commit = git(gitdir, "rev-parse", f"{TORCHTITAN_TAG}^{{commit}}").strip()
    models = {}
    for name in ("llama3", "llama4", "deepseek_v3", "qwen3", "gpt_oss"):
        text = git(gitdir, "show", f"{TORCHTITAN_TAG}:torchtitan/models/{name}/model/model.py")
        models[name] = sorted(set(re.findall(r"self\.(tok_embeddings|layers|norm|output) = ", text)))
    src = git(gitdir, "show", f"{TORCHTITAN_TAG}:torchtitan/distributed/pipeline_parallel.py")
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)
              and n.name == "generate_llm_fqn_per_model_part")
    scope: dict = {"math": __import__("math")}
    exec(compile(ast.Module([fn], []), "pipeline_parallel.py", "exec"), scope)
    split = scope["generate_llm_fqn_per_model_part"]
    examples = {f"{n} parts, {layers} layers": split(n, layers, input_weight=0, output_weight=0)
                for n, layers in ((2, 8), (4, 8), (4, 16))}
    out = {"source": f"pytorch/torchtitan@{commit} ({TORCHTITAN_TAG}) torchtitan/models/*/model/model.py and "
                     "torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part",
           "model_modules": models, "equal_splits": examples}
    (DATA / "torchtitan_source.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(models)} models, {len(examples)} splits -> tests/data/torchtitan_source.json")


def cmd_mindformers(gitdir: Path) -> None:
    """MindFormers' YAML sections as its config template checks them (class attributes of the Config classes in
    mindformers/tools/register/template.py; each section says whether it refuses unknown keys), the model_config
    keys its Megatron-Core-style models map (COMMON_CONFIG_MAPPING of parallel_core/transformer_config_utils.py),
    and the MindSpore parallel-context keys the `parallel` section passes on (mindspore 2.10, installed)."""
    import ast
    import importlib.util

    commit = git(gitdir, "rev-parse", "HEAD").strip()
    tree = ast.parse(git(gitdir, "show", "HEAD:mindformers/tools/register/template.py"))
    sections = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        attrs = {t.id: n.value for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}
        if "_name" in attrs and isinstance(attrs["_name"], ast.Constant) and attrs["_name"].value:
            strict = attrs.get("_raise_error_for_unexpected_key")
            sections[attrs["_name"].value] = {
                "keys": sorted(k for k in attrs if not k.startswith("_")),
                "refuses_unknown_keys": True if strict is None else bool(ast.literal_eval(strict))}
    mapping = ast.parse(git(gitdir, "show", "HEAD:mindformers/parallel_core/transformer_config_utils.py"))
    keys = []
    for node in ast.walk(mapping):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMMON_CONFIG_MAPPING" for t in node.targets):
            for k, v in zip(node.value.keys, node.value.values):
                names = ast.literal_eval(k)
                target = v.value if isinstance(v, ast.Constant) else ast.literal_eval(v.elts[0])
                for name in (names,) if isinstance(names, str) else names:
                    keys.append([name, target])
    ms = Path(importlib.util.find_spec("mindspore").submodule_search_locations[0]) / "parallel" / "_auto_parallel_context.py"
    ms_tree = ast.parse(ms.read_text())
    ms_keys = {}
    for cls in (n for n in ms_tree.body if isinstance(n, ast.ClassDef)
                and n.name in ("_ParallelOptimizerConfig", "_PipelineConfig", "_PipelineScheduler")):
        ms_keys[cls.name] = sorted(ast.literal_eval(n.value) for n in cls.body if isinstance(n, ast.Assign))
    import importlib.metadata

    out = {"source": f"mindspore-ai/mindformers@{commit} mindformers/tools/register/template.py and "
                     "mindformers/parallel_core/transformer_config_utils.py (COMMON_CONFIG_MAPPING)",
           "sections": sections, "model_config_mapping": keys,
           "mindspore_source": f"mindspore {importlib.metadata.version('mindspore')} (PyPI) "
                               "mindspore/parallel/_auto_parallel_context.py", "mindspore": ms_keys}
    (DATA / "mindformers_config.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(sections)} sections, {len(keys)} model_config keys -> tests/data/mindformers_config.json")


def model_words(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int,
                experts: int = 0, top_k: int = 0) -> list[str]:
    """A Llama-family model's own Megatron-LM arguments (what MODEL_ARGS holds in Megatron-LM's examples)."""
    words = ["--num-layers", layers, "--hidden-size", hidden, "--ffn-hidden-size", ffn, "--num-attention-heads", heads,
             "--group-query-attention", "--num-query-groups", kv_heads, "--max-position-embeddings", seq, "--swiglu",
             "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--no-rope-fusion",
             "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", vocab]
    if experts:
        words += ["--num-experts", experts, "--moe-router-topk", top_k]
    return [str(w) for w in words]


def declarations(files: list[str]) -> list[tuple[str, dict, list[str]]]:
    """(name, declaration, model words): the tests' launch plans, and any declaration files of zoo models given."""
    import yaml

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from launch_plans import WRITES, plan, shape

    from models_zoo.presets import BY_NAME

    out = []
    for name in WRITES["megatron"]:
        m = shape(name)
        out.append((name, plan(name), model_words(m["num_layers"], m["hidden_size"], m["num_attention_heads"],
                                                  m["num_query_groups"], m["ffn_hidden_size"], 128,
                                                  plan(name)["workload"]["seq_len"], m.get("num_moe_experts", 0),
                                                  m.get("moe_router_topk", 0))))
    for f in files:
        doc = yaml.safe_load(Path(f).read_text())
        c = BY_NAME[doc["model"]["zoo"]].config
        out.append((Path(f).name, doc, model_words(c.layers, c.hidden, c.heads, c.kv_heads, c.ffn, c.vocab,
                                        doc["workload"]["seq_len"], getattr(c, "experts", 0), getattr(c, "top_k", 0))))
    return out


def cmd_check(gitdir: Path, files: list[str]) -> None:
    """Megatron-LM's own parse_args, validate_args and core_transformer_config_from_args on our exports."""
    from planner.hypershard.backends import launch_config
    from planner.hypershard import strategy_of

    def work(arguments, commit):
        arguments.get_device_arch_version = lambda: 9  # no GPU here: answer as Hopper, which validate_args asks
        rows = []
        for name, doc, model in declarations(files):
            cfg = launch_config(doc, "megatron")["config"]
            s = strategy_of(doc)
            os.environ.update(WORLD_SIZE=str(doc["cluster"]["devices"]), RANK="0")
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
            os.environ.update(cfg["env"])
            sys.argv = ["pretrain_gpt.py", *model, *cfg["args"]]
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            tc = arguments.core_transformer_config_from_args(args)
            got = dict(tp=tc.tensor_model_parallel_size, pp=tc.pipeline_model_parallel_size,
                       vpp=tc.virtual_pipeline_model_parallel_size or 1, cp=tc.context_parallel_size,
                       dp=args.data_parallel_size, ep=tc.expert_model_parallel_size,
                       etp=tc.expert_tensor_parallel_size)
            want = dict(tp=s.tp, pp=s.pp, vpp=s.vpp, cp=s.cp, dp=s.dp, ep=s.ep, etp=s.expert_tp)
            rows.append({"plan": name, "args": cfg["args"], "megatron": got, "equal": got == want})
            print(f"{name}: {'ok' if got == want else 'DIFFERENT'} {got}", file=sys.stderr)
        return {"source": f"NVIDIA/Megatron-LM@{commit} ({MEGATRON_TAG}): parse_args, validate_args and "
                          "core_transformer_config_from_args of megatron/training/arguments.py, with megatron-core "
                          "from PyPI; get_device_arch_version answered 9 (no GPU)", "runs": rows}

    out = with_megatron(gitdir, work)
    (ROOT / "benchmarks" / "megatron_parser_check.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{sum(r['equal'] for r in out['runs'])}/{len(out['runs'])} equal -> benchmarks/megatron_parser_check.json")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["megatron", "check", "torchtitan", "mindformers"])
    ap.add_argument("--git", type=Path, help="the project's git directory (default: the mirror under /work)")
    ap.add_argument("files", nargs="*", help="check: declarations of zoo models to export and check too")
    a = ap.parse_args()
    default = {"megatron": "NVIDIA+Megatron-LM", "check": "NVIDIA+Megatron-LM", "torchtitan": "pytorch+torchtitan",
               "mindformers": "mindspore-ai+mindformers"}[a.what]
    gitdir = a.git or MIRROR / default / "repo"
    if a.what == "check":
        cmd_check(gitdir, a.files)
    else:
        globals()[f"cmd_{a.what}"](gitdir)
