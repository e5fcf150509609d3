"""Read every Megatron-Bridge pre-training row on DGX H100, B200, GB200 and GB300 with the configuration that ran it.

    python benchmarks/extract_bridge_sweep.py /path/to/Megatron-Bridge.git [-o tests/data/bridge_sweep.json]

The Megatron-Bridge performance summaries (docs/performance-summary-archive.md) list, per NeMo release, each
model's throughput per GPU with its layout. The release's scripts/performance/configs/*/*workload_base_configs.py
hold the presets those rows ran (`{MODEL}_PRETRAIN_CONFIG_{GPU}_{PRECISION}_{VERSION}`, before v0.3.0
`{MODEL}_{GPU}_{PRECISION}_BASE_CONFIG`): the layout, CUDA graphs, the MoE dispatcher backend and all-to-all overlap,
recompute and offload. This script parses them (ast; nothing is imported or run), picks for each row the preset
whose GPUs, layout, global and micro batch are the row's, and reads from the release's *_llm_pretrain.py the two
settings the presets leave to code: the token dispatcher a function forces and its TP communication overlap.
Releases 25.11 to 26.06.01 (each read at the ref `TAGS` gives: the presets its table ran) from the archive; 26.08
(v0.6.0) from docs/performance-summary.md, whose presets are Python functions (src/megatron/bridge/perf_recipes,
read by benchmarks/bridge_perf_recipes.py). Models the zoo has.
`benchmarks/bench_bridge_sweep.py` estimates every row read here; none of them is fitted.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bridge_perf_recipes as recipes  # noqa: E402

ARCHIVE = "docs/performance-summary-archive.md"
#: the current release's table (the archive holds the earlier ones)
SUMMARY = "docs/performance-summary.md"
#: NeMo container release -> the Megatron-Bridge ref whose presets ran its table: the tag of the release branch
#: that published the table, the one closest to the table's commit (tag dates: v0.2.0 2025-11-26, v0.3.0
#: 2026-02-26, v0.3.1 2026-03-20, v0.4.0 2026-04-16, v0.4.2 2026-05-28, v0.5.0 2026-06-16, v0.5.1 2026-07-20,
#: v0.6.0 2026-08-19; the shipped 26.04 rows' notes cite v0.4.0's presets), or the table's own commit where the
#: presets changed between the tag and it:
#: - 26.02.01: r0.3.0 1f0cfc3bc ("2602_perf_table_reorder and patch container data", 2026-03-21, the day after
#:   v0.3.1) publishes the table; the commit before it, 904597bd3 (#2915), sets GPT-OSS's B200 and B300 presets
#:   to the EP8 and HybridEP its rows list;
#: - 26.04.01: v0.4.2, not v0.4.1. v0.4.1 (2026-05-06) is v0.4.0 plus security fixes on a branch of its own
#:   (r0.4.1), while the table (main 17a381f95 and 21d102f5e; r0.4.0 cab6db381 and 2b82f6f17, 2026-05-26/27) was
#:   published from r0.4.0, whose v0.4.2 first carries it and holds the presets it lists: DeepSeek-V3 on B200 at
#:   PP8 VP2 EP32, which v0.4.1 has not, and Qwen3-235B on B300 through HybridEP (cherry-pick 6a5c997e7)
TAGS = {"25.11": "v0.2.0", "26.02": "v0.3.0", "26.02.01": "1f0cfc3bc58a08507775ec029cd4d01e97bd16f5",
        "26.04": "v0.4.0", "26.04.01": "v0.4.2", "26.06": "v0.5.0", "26.06.01": "v0.5.1", "26.08": "v0.6.0"}
SYSTEMS = {"DGX-H100": ("dgx-h100", "H100"), "DGX-B200": ("dgx-b200", "B200"), "DGX-GB200": ("gb200-nvl72", "GB200"),
           "DGX-GB300": ("gb300-nvl72", "GB300"), "DGX-B300": ("dgx-b300", "B300")}
#: The tables' model names -> (zoo model, preset name prefix)
MODELS = {"LLAMA3_8B": ("llama3-8b", "LLAMA3_8B"), "LLAMA3_70B": ("llama3-70b", "LLAMA3_70B"),
          "LLAMA3.1_405B": ("llama3-405b", "LLAMA31_405B"), "DeepSeekV3": ("deepseek-v3", "DEEPSEEK_V3"),
          "DeepSeekV3 (w/ MTP)": ("deepseek-v3", "DEEPSEEK_V3"), "DeepSeekV3 (w/o MTP)": ("deepseek-v3", "DEEPSEEK_V3"),
          "GPT OSS 120B": ("gpt-oss-120b", "GPT_OSS_120B"),
          "Qwen3_30B_a3B": ("qwen3-30b-a3b", "QWEN3_30B_A3B"),
          "Qwen3_235B_a22B": ("qwen3-235b-a22b", "QWEN3_235B_A22B")}
PRECISIONS = {"BF16": "BF16", "FP8": "FP8_CS", "FP8-CS": "FP8_CS", "MXFP8": "FP8_MX", "FP8-MX": "FP8_MX"}
NAME = re.compile(r"^(?P<model>[A-Z0-9_]+?)_(?:PRETRAIN_CONFIG_)?(?P<gpu>GB300|GB200|B300|B200|H100)_"
                  r"(?P<prec>BF16|FP8_CS|FP8_MX|NVFP4)_(?P<ver>V\d+|BASE_CONFIG)$")
#: The row's columns a preset must agree with to be the one that ran it
LAYOUT = {"#-GPUs": "num_gpus", "TP": "tensor_model_parallel_size", "PP": "pipeline_model_parallel_size",
          "CP": "context_parallel_size", "VP": "virtual_pipeline_model_parallel_size",
          "EP": "expert_model_parallel_size", "GBS": "global_batch_size", "MBS": "micro_batch_size"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], check=True, capture_output=True,
                          text=True).stdout


def number(cell: str) -> float | None:
    """A table cell's figure: the first number (a cell may add another precision's in parentheses)."""
    m = re.match(r"\s*([0-9][0-9,.]*)", cell)
    return float(m.group(1).replace(",", "")) if m else None


def table_rows(text: str) -> list[dict]:
    """Every pre-training row of the archive, with its release, model and line number."""
    rows, release, section, model, header = [], None, None, None, None
    for lineno, line in enumerate(text.splitlines(), 1):
        if m := re.match(r"^## (\S+) NeMo Container", line):
            release = m.group(1)
        elif m := re.match(r"^### (.*)", line):
            section = m.group(1).strip()
        elif m := re.match(r"^#### (Model|System): (.*)", line):
            model, header = (m.group(1), m.group(2).strip()), None
        elif line.startswith("|") and "#-GPUs" in line:
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        elif line.startswith("|") and header and not line.startswith("|--"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != len(header) or section != "Pre-Training Performance":
                continue
            row = dict(zip(header, cells))
            row[model[0]] = model[1].removeprefix("System: ")
            rows.append(row | {"release": release, "line": lineno})
    return rows


def literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


@lru_cache(maxsize=None)
def presets(repo: Path, tag: str) -> dict[str, dict]:
    """Every workload preset of a tag, each as the fields it sets over WorkloadBaseConfig's defaults."""
    utils = ast.parse(git(repo, "show", f"{tag}:scripts/performance/utils/utils.py"))
    base = {}
    for node in ast.walk(utils):
        if isinstance(node, ast.ClassDef) and node.name == "WorkloadBaseConfig":
            base = {s.target.id: literal(s.value) for s in node.body
                    if isinstance(s, ast.AnnAssign) and s.value is not None}
    files = [f for f in git(repo, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split()
             if f.endswith("workload_base_configs.py")]
    out: dict[str, dict] = {}
    for f in files:
        for node in ast.parse(git(repo, "show", f"{tag}:{f}")).body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                continue
            name, v = node.targets[0].id, node.value
            if isinstance(v, ast.Name) and v.id in out:
                out[name] = out[v.id]
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name):
                kw = {k.arg: literal(k.value) for k in v.keywords}
                if v.func.id == "WorkloadBaseConfig":
                    out[name] = base | kw | {"_file": f}
                elif v.func.id == "replace" and isinstance(v.args[0], ast.Name) and v.args[0].id in out:
                    out[name] = out[v.args[0].id] | kw | {"_file": f}
    return out


@lru_cache(maxsize=None)
def pretrain_functions(repo: Path, tag: str) -> dict[str, tuple[str, str]]:
    """Every top-level function of a tag's *_llm_pretrain.py files: name -> (file, source), the first file's where
    two define one."""
    out: dict[str, tuple[str, str]] = {}
    for f in git(repo, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split():
        if f.endswith("_llm_pretrain.py"):
            tree = ast.parse(source := git(repo, "show", f"{tag}:{f}"))
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name not in out:
                    out[node.name] = (f, ast.get_source_segment(source, node) or "")
    return out


def code_settings(repo: Path, tag: str, model_prefix: str, gpu: str) -> dict:
    """What a release's *_llm_pretrain.py function for the model and GPU forces beyond the preset: the token
    dispatcher (an explicit moe_token_dispatcher_type) and TP communication overlap (CommOverlapConfig)."""
    want = f"{model_prefix.lower()}_pretrain_config_{gpu.lower()}"
    if want not in (functions := pretrain_functions(repo, tag)):
        return {}
    f, body = functions[want]
    out: dict = {"_function": f"{f}:{want}"}
    if m := re.search(r'moe_token_dispatcher_type\s*=\s*"(\w+)"', body):
        out["moe_token_dispatcher_type"] = m.group(1)
    if m := re.search(r"CommOverlapConfig\(\s*tp_comm_overlap\s*=\s*(True|False)", body):
        out["tp_comm_overlap"] = m.group(1) == "True"
    return out


def matches(row: dict, preset: dict) -> bool:
    for col, field in LAYOUT.items():
        want = number(row.get(col, "")) if row.get(col, "n/a") != "n/a" else None
        have = preset.get(field)
        if col == "VP":
            have = None if have in (None, 1) else have
            want = None if want in (None, 1) else want
        elif col in ("TP", "PP", "CP", "EP", "MBS"):
            have, want = have or 1, want or 1
        if want != have:
            return False
    fsdp = (number(row.get("FSDP", "0")) or 0) > 0
    return fsdp == bool(preset.get("use_megatron_fsdp"))


def footnotes(text: str) -> dict[str, str]:
    """The archive's footnotes: marker -> text."""
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\[\^([^\]]+)\]:\s*(.*)$", text, re.M)}


@lru_cache(maxsize=None)
def shown(repo: Path, tag: str, path: str) -> str:
    """A file as a tag holds it (read once, however many rows' presets read it)."""
    return git(repo, "show", f"{tag}:{path}")


@lru_cache(maxsize=None)
def preset_tables(repo: Path, tag: str) -> bool:
    """Whether a tag keeps its presets as workload tables (scripts/performance/configs, before v0.6.0)."""
    return bool(git(repo, "ls-tree", "--name-only", tag, "scripts/performance/configs").strip())


@lru_cache(maxsize=None)
def function_presets(repo: Path, tag: str, prefix: str, gpu: str, precision: str) -> dict[str, dict]:
    """A v0.6.0-on tag's preset functions of a model, GPU and precision, each as the fields the older presets
    record and what its code forces (`_code`)."""
    show = lambda path: shown(repo, tag, path)  # noqa: E731
    files = git(repo, "ls-tree", "-r", "--name-only", tag, recipes.ROOT_DIR).split()
    out = {}
    for name, (f, gpus, _) in recipes.recipe_functions(show, files, prefix.lower(), gpu.lower(),
                                                       recipes.PRECISION[precision]).items():
        settings = recipes.preset_settings(show, f, name)
        out[name] = recipes.preset_fields(settings, gpus, f) | {"_code": recipes.code_of(settings, f, name)}
    return out


def candidates(repo: Path, tag: str, prefix: str, gpu: str, precision: str) -> dict[str, dict]:
    """The presets of a tag that could have run a model on a GPU at a precision: name -> fields."""
    if preset_tables(repo, tag):
        return {k: v for k, v in presets(repo, tag).items()
                if (m := NAME.match(k)) and m["model"] == prefix and m["gpu"] == gpu and m["prec"] == precision}
    return function_presets(repo, tag, prefix, gpu, precision)


def sweep(repo: Path, commit: str) -> list[dict]:
    out = []
    for doc in (ARCHIVE, SUMMARY):
        text = git(repo, "show", f"{commit}:{doc}")
        out += doc_rows(repo, text, doc)
    return out


def doc_rows(repo: Path, text: str, doc: str) -> list[dict]:
    """The zoo models' pre-training rows of one performance summary, each with the preset that ran it."""
    out, notes = [], footnotes(text)
    for row in table_rows(text):
        tag = TAGS.get(row["release"])
        name = row.get("Model")
        system = SYSTEMS.get(row.get("System", ""))
        precision = PRECISIONS.get(row.get("Precision", "").split("(")[0].strip())
        if not (tag and name in MODELS and system and precision):
            continue
        zoo, prefix = MODELS[name]
        found = candidates(repo, tag, prefix, system[1], precision)
        chosen = sorted(k for k, v in found.items() if matches(row, v))
        entry = {"release": row["release"], "tag": tag, "line": row["line"], "table_model": name, "model": zoo,
                 "hardware": system[0], "precision": precision,
                 "tokens_per_s_per_gpu": number(row["Tokens / sec / GPU"]),
                 "row": {k: v for k, v in row.items() if k not in ("release", "line")}}
        if doc != ARCHIVE:
            entry["doc"] = doc
        marks = sorted({m for c in row.values() if isinstance(c, str) for m in re.findall(r"\[\^([^\]]+)\]", c)})
        if marks:
            entry["footnotes"] = {m: notes.get(m, "") for m in marks}
        if chosen:
            if "_code" in found[chosen[0]]:  # a function preset's plain name before its variants (`_large_scale`)
                chosen.sort(key=len)
            fields = {k: v for k, v in found[chosen[0]].items() if k != "_code"}
            distinct = {json.dumps({k: v for k, v in found[c].items() if k not in ("_file", "_code")}, sort_keys=True)
                        for c in chosen}
            entry["preset"] = chosen[0]
            entry["preset_fields"] = {k: v for k, v in fields.items()
                                      if v is not None and v is not False and k != "peft"}
            if len(distinct) > 1:
                entry["ambiguous"] = chosen
            entry["code"] = found[chosen[0]].get("_code") or code_settings(repo, tag, prefix, system[1])
        out.append(entry)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a Megatron-Bridge git directory (bare or .git)")
    ap.add_argument("--commit", default="HEAD", help="the commit whose archive to read (default HEAD)")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "tests" / "data" / "bridge_sweep.json")
    args = ap.parse_args()
    commit = git(args.repo, "rev-parse", args.commit).strip()
    rows = sweep(args.repo, commit)
    doc = {"about": "Megatron-Bridge pre-training rows on DGX H100, B200, B300, GB200 and GB300 (NeMo 25.11-26.08) "
                    "with the workload preset each ran, read by benchmarks/extract_bridge_sweep.py",
           "source": {"repo": "NVIDIA-NeMo/Megatron-Bridge", "commit": commit, "archive": ARCHIVE, "tags": TAGS},
           "rows": rows}
    args.output.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{len(rows)} rows, {sum('preset' in r for r in rows)} with their preset -> {args.output}")


if __name__ == "__main__":
    main()
