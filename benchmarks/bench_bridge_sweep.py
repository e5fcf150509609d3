"""The estimate against every Megatron-Bridge pre-training row on DGX H100, B200, B300, GB200 and GB300
(NeMo 25.11-26.08).

    python benchmarks/bench_bridge_sweep.py            # per hardware and kind of job: rows, mean and max |error|
    python benchmarks/bench_bridge_sweep.py --rows     # and every row
    python benchmarks/bench_bridge_sweep.py --write    # and write planner/calibration/bridge_sweep_errors.json and
                                                       # hardware_pairs.json (benchmarks/bench_hardware_pairs.py)

The rows and the workload preset each ran are tests/data/bridge_sweep.json (benchmarks/extract_bridge_sweep.py
reads them from Megatron-Bridge's performance summaries and its release tags). Each row is costed as its preset
sets it, read here and nowhere else:

- precision: BF16; FP8 by per-tensor current scaling (the tables' FP8 and FP8-CS); MXFP8 (FP8-MX);
- layout: TP, PP, CP, VP, EP (ETP 1 where the preset says so), the micro and global batch; Megatron-FSDP as ZeRO-3,
  otherwise the distributed optimizer (ZeRO-1, the recipes' default); sequence parallel with TP;
- the preset's recompute modules (selective) or none; its CPU offload of N layers as that share of the
  activations; its CUDA graphs (a scope list, or the full iteration);
- MoE: the flex dispatcher (DeepEP or HybridEP) where the preset names a backend and the release's function does
  not force the all-to-all dispatcher, else the all-to-all one; the 1F1B all-to-all overlap where the preset sets it;
- TP communication overlapped unless the release's function builds CommOverlapConfig(tp_comm_overlap=False);
- DeepSeek-V3: the recipes' precision-aware optimizer (8 bytes of state) and group-limited routing (4 of 8 groups of
  32 experts, wherever they sit);
- FP8 attention where a preset sets fp8_dot_product_attention (26.06 on): the flash kernel at the hardware's
  measured FP8 figures in the recipe's format (`Execution.fp8_attention`);
- not costed where a preset sets it (26.06 on): the CuTe DSL fused grouped MLP (the activation inside the expert
  GEMMs); the estimate runs the activation unfused, but as that MLP runs its experts: one grouped
  kernel a projection (`expert_gemm_streams` 0), without the eager clamps of gpt-oss's gated activation or its
  per-expert bias loop (`glu_clamp_bytes`, `expert_bias_bytes` 0: Transformer Engine's op fuser takes the clamp as
  its ScaledClampedQGeGLU's limit and the bias, scaled by the routing probability, in its GroupedLinear's
  scale_bias; megatron/core/transformer/moe/experts.py on main of 2026-08-22, TE v2.15 on);
- the pipeline split: Llama 3.1 405B's and Qwen3-235B's recipes count the embedding and the loss as a layer each
  (account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split), so their first and last chunks
  hold a layer fewer; DeepSeek-V3 with its recipe's multi-token-prediction depth and pipeline layout (the preset's
  pp_layout, else the recipe's by pp and vpp: `calibration_spec_helpers.dsv3_as_run`); the other models' layers
  split evenly;
- ASSUMPTION: routing forced balanced and dropless (the summaries' footnote), and what a preset does not set is the
  stack's default.

None of these rows is fitted, except the few the calibration set ships (marked: their presets' fits saw them).
A row whose layout matches no preset of its release's tag (run with command-line overrides, or a preset added after
the tag) is left out and counted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from statistics import median
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_calibration import unscored as unscored_runs  # noqa: E402
from benchmarks.calibration_readings import LATER_RELEASES, bridge_table  # noqa: E402
from benchmarks.calibration_spec_helpers import (  # noqa: E402
    CUTEDSL_MLP, DSV3_MTP, DSV3_OPT, DSV3_ROUTING, FP8_ATTENTION, dsv3_as_run, publisher_issue,
)
from planner.calibration import read_runs  # noqa: E402
from planner.calibration.bridge_sweep import ERRORS, errors_table  # noqa: E402
from planner.calibration.hardware_pairs import PAIRS, pairs, pairs_table  # noqa: E402
from planner.calibration.layout_pairs import Pair  # noqa: E402
from planner.calibration.predict import Predictor, predict_all, summarise  # noqa: E402
from planner.calibration.runs import parse_run  # noqa: E402
from planner.costing.pipeline_cut import accounted_split  # noqa: E402

DATA = ROOT / "tests" / "data" / "bridge_sweep.json"
SOURCE = "tests/data/bridge_sweep.json"  # how a run read from it names its source (`run_of`)
MOE = {"deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b"}
LAYERS = {"llama3-8b": 32, "llama3-70b": 80, "llama3-405b": 126}
#: A footnote in which the publisher says a bug slowed the row (26.06.01's GPT-OSS rows: "Performance regression in
#: GPT-OSS 120B pre-training is a known issue ... resolved with the next container release"): neither fitted nor scored
REGRESSION = re.compile(r"\bperformance regression\b", re.IGNORECASE)
#: Models whose Megatron-Bridge recipe counts the embedding and the loss as a layer each when it splits the pipeline
#: (account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split, in every tag v0.2.0-v0.5.1:
#: llama31_405b_pretrain_config in src/megatron/bridge/recipes/llama/llama3.py, qwen3_235b_a22b_pretrain_config in
#: recipes/qwen/qwen3_moe.py; the 8B and 70B recipes set neither), with their layer counts
ACCOUNTED = {"llama3-405b": 126, "qwen3-235b-a22b": 94}
GRAPH_SCOPES = {"attn", "mlp", "moe", "moe_router", "moe_preprocess"}


def known_regression(row: dict) -> str:
    """The publisher's sentence saying a bug slowed the row: its table's footnote (`REGRESSION`) or its tracker
    (`PUBLISHER_ISSUES`); "" for a row that measures the stack."""
    return next((text for text in row.get("footnotes", {}).values() if REGRESSION.search(text)),
                publisher_issue(row["release"], row["hardware"], row["model"], row["precision"]))


def run_of(row: dict, index: int) -> dict | None:
    """A sweep row as a calibration run (the format `hyperplan calibrate` reads), or None without a preset."""
    p = row.get("preset_fields")
    if p is None:
        return None
    code = row.get("code", {})
    tp, pp, cp = p.get("tensor_model_parallel_size", 1), p.get("pipeline_model_parallel_size", 1), \
        p.get("context_parallel_size", 1)
    gpus = p["num_gpus"]
    strategy = {"micro_batch": p["micro_batch_size"], "dp": gpus // (tp * pp * cp), "sp": tp > 1,
                "zero": 3 if p.get("use_megatron_fsdp") else 1}
    for key, field in (("tp", tp), ("pp", pp), ("cp", cp), ("vpp", p.get("virtual_pipeline_model_parallel_size")),
                       ("ep", p.get("expert_model_parallel_size", 1)), ("etp", p.get("expert_tensor_parallel_size"))):
        if field and field > 1 or (key == "etp" and field == 1 and p.get("expert_model_parallel_size", 1) > 1):
            strategy[key] = field
    chunks = pp * (p.get("virtual_pipeline_model_parallel_size") or 1)
    if row["model"] in ACCOUNTED and (split := accounted_split(ACCOUNTED[row["model"]], chunks)):
        strategy["stage_layers"] = list(split)
    notes = []
    mtp = row["model"] == "deepseek-v3" and "w/o MTP" not in row.get("table_model", "")
    if row["model"] == "deepseek-v3":
        strategy, note = dsv3_as_run(strategy, p.get("pp_layout"), mtp)
        notes.append(note)
    modules = p.get("recompute_modules")
    strategy["recompute"] = "selective" if modules else "none"
    if p.get("cpu_offloading_num_layers") and row["model"] in LAYERS:
        strategy["offload"] = {"activations": round(p["cpu_offloading_num_layers"] / LAYERS[row["model"]], 4)}
    ex: dict = {}
    if modules:
        ex["recompute_modules"] = list(modules)
    if row["precision"] == "FP8_MX":
        ex["fp8_recipe"] = "mxfp8"
    elif row["precision"] == "FP8_CS":
        ex["fp8_recipe"] = "current"
    if p.get("cuda_graph_impl"):
        scope = p.get("cuda_graph_scope")
        scopes = ["full_iteration"] if scope in (None, "full_iteration", []) else list(scope)
        if not set(scopes) <= GRAPH_SCOPES | {"full_iteration"}:
            return None
        ex["cuda_graphs"] = scopes
    if code.get("tp_comm_overlap") is False:
        ex["overlap_tp_comm"] = False
    if row["model"] in MOE:
        flex = p.get("moe_flex_dispatcher_backend") and code.get("moe_token_dispatcher_type") != "alltoall"
        ex["moe_dispatcher"] = "deepep" if flex else "alltoall"
        if p.get("moe_a2a_overlap"):
            ex["overlap_ep_comm"] = True
    if row["model"] == "deepseek-v3":
        ex |= DSV3_OPT | DSV3_ROUTING
    if p.get("cutedsl_fused_grouped_mlp"):  # one grouped kernel a projection, the clamps and the bias inside
        ex |= CUTEDSL_MLP
    if p.get("fp8_dot_product_attention"):  # the flash kernel in the recipe's FP8 format
        ex |= FP8_ATTENTION
    notes += ["not costed: cutedsl_fused_grouped_mlp"] if p.get("cutedsl_fused_grouped_mlp") else []
    notes += [f"the table's footnote: {text}" for text in row.get("footnotes", {}).values()]
    regression = known_regression(row)
    return {"id": f"{row['release']}-{row['hardware']}-{row['model']}-{row['precision'].lower()}-{gpus}gpu",
            "source": f"{SOURCE}#rows[{index}] ({row['preset']})",
            "category": "moe_training" if row["model"] in MOE else "dense_training", "hardware": row["hardware"],
            "devices": gpus, "model": row["model"], "seq_len": int(float(row["row"]["Sequence Length"])),
            "global_batch": p["global_batch_size"], "dtype": "bf16" if row["precision"] == "BF16" else "fp8",
            "stack": "megatron-core", "execution": ex, "strategy": strategy,
            **({"overrides": DSV3_MTP} if mtp else {}),
            "measured": {"tokens_per_s_per_device": row["tokens_per_s_per_gpu"]}, "notes": notes,
            "table": bridge_table(row["release"])} | ({"known_regression": regression} if regression else {})


def row_key(run) -> tuple | None:
    """(hardware, model, devices, global batch, tokens/s) of a run measured in tokens/s: the published row it reads
    (None for a run measured otherwise)."""
    tps = run.raw.get("measured", {}).get("tokens_per_s_per_device")
    return (run.hardware, run.model, run.devices, run.global_batch, float(tps)) if tps else None


def shipped_keys() -> set:
    """The rows the shipped calibration runs read: a run read from this sweep by its id, one read by hand by its
    `row_key` (two releases may publish the same figure for one preset: the id tells them apart)."""
    return {r.id if r.source.startswith(SOURCE) else row_key(r) for r in read_runs()} - {None}


def sweep(predictor: Predictor | None = None) -> tuple[list, int, list[str], int]:
    """Every sweep row estimated (by `predictor`, a new one by default): (predictions each with whether the
    calibration set ships its row, rows without a preset, rows not estimable with the reason, rows read)."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    runs, unread = [], 0
    for i, row in enumerate(data["rows"]):
        spec = run_of(row, i)
        if spec is None:
            unread += 1
        else:
            runs.append(parse_run(spec, where=f"bridge_sweep.json rows[{i}]"))
    preds, skipped = predict_all(runs, predictor)
    shipped = shipped_keys()
    out = [(p, p.run.id in shipped or row_key(p.run) in shipped) for p in preds]
    return out, unread, skipped, len(data["rows"])


def scored(items: list) -> list:
    """The (prediction, shipped) pairs whose rows measure the stack: not one its publisher says a bug slowed."""
    return [(p, was) for p, was in items if p.group != "regression"]


def unscored(items: list) -> str:
    """The sentence under the table on the rows left out of it (`bench_calibration.unscored`)."""
    return unscored_runs((p for p, _ in items), "row")


def release_spread(rows: list[dict]) -> str:
    """How much a row moves from one release to the next with its preset unchanged (the same fields as extracted
    and the same settings its release's code forces; a row its publisher says a bug slowed left out): what no model
    of the preset can follow, the floor under the tables' errors. One sentence."""
    releases = sorted({r["release"] for r in rows}, key=lambda v: tuple(int(x) for x in v.split(".")))
    runs = defaultdict(list)
    for r in rows:
        if "preset_fields" in r and not known_regression(r):
            fields = {k: v for k, v in r["preset_fields"].items() if k != "_file"}
            key = (r["hardware"], r["model"], r["precision"], json.dumps([fields, r.get("code", {})], sort_keys=True))
            runs[key].append(r)
    changes = []
    for same in runs.values():
        same.sort(key=lambda r: releases.index(r["release"]))
        for a, b in zip(same, same[1:]):
            changes.append((b["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"] - 1.0, a, b))
    if not changes:
        return ""
    sizes = [abs(c) for c, _, _ in changes]
    worst, a, b = max(changes, key=lambda t: abs(t[0]))
    return (f"Release to release with the preset unchanged, {len(changes)} pairs of rows: tokens/s per GPU moved "
            f"{100 * median(sizes):.1f} % (median), {100 * sum(sizes) / len(sizes):.1f} % (mean), at most "
            f"{100 * worst:+.1f} % ({b['model']} on {b['hardware']}, {a['release']} -> {b['release']}).")


def retuned(items: list, rows: list[dict]) -> str:
    """How well the estimate follows a preset's retuning: consecutive rows of one job (hardware, model, precision)
    whose run changed as the estimate reads it (its strategy, stack settings, batch or GPUs; not a renamed preset
    that runs the same), the estimated ratio of their tokens/s per GPU against the measured one
    (`layout_pairs.ratio_error`), per kind of job. What a plan's choice between two settings rests on, with the
    releases' own drift (`release_spread`) in the measured ratio. One sentence."""
    order = sorted({r["release"] for r in rows}, key=lambda v: tuple(int(x) for x in v.split(".")))
    jobs = defaultdict(list)
    for p, _ in scored(items):
        r = rows[int(re.search(r"rows\[(\d+)\]", p.run.source).group(1))]
        ran = (json.dumps(p.run.strategy, sort_keys=True), p.run.execution, p.run.global_batch, p.run.devices)
        jobs[(r["hardware"], r["model"], r["precision"])].append((order.index(r["release"]), ran, p))
    found = defaultdict(list)
    for group in jobs.values():
        group.sort(key=lambda t: t[0])
        for (_, ran_a, a), (_, ran_b, b) in zip(group, group[1:]):
            if ran_a != ran_b:
                (ma, pa), (mb, pb) = a.tokens_per_s_per_device, b.tokens_per_s_per_device
                found[a.run.category].append(Pair(b, a, float(mb / ma), float(pb / pa)))
    if not found:
        return ""
    parts = []
    for category, got in sorted(found.items()):
        worst = max(got, key=lambda p: p.error)
        parts.append(f"{category.split('_')[0]} {len(got)} pairs, {100 * median(p.error for p in got):.1f} % "
                     f"(median), {100 * worst.error:.1f} % at most ({worst.a.run.model} on {worst.a.run.hardware}, "
                     f"{worst.b.run.id.split('-')[0]} -> {worst.a.run.id.split('-')[0]}), "
                     f"{sum(p.flipped for p in got)} flipped")
    return ("Release to release with the preset retuned (its layout, batch or stack settings changed), the "
            "estimated change in tokens/s per GPU against the measured one: " + "; ".join(parts) + ".")


def later(items: list) -> str:
    """The sentence on the scored rows of releases published after every preset was fitted
    (`calibration_readings.LATER_RELEASES`): the blindest check the sweep has ("" without any)."""
    group = [p for p, _ in scored(items) if p.run.id.split("-", 1)[0] in LATER_RELEASES]
    if not group:
        return ""
    s = summarise(group)
    rows = "; ".join(f"{p.run.model} on {p.run.hardware} {100 * p.error:+.1f} %"
                     for p in sorted(group, key=lambda p: (p.run.model, p.run.hardware)))
    return (f"Published after every preset was fitted (NeMo {', '.join(sorted(LATER_RELEASES))}), {s.rows} rows: "
            f"mean |error| {100 * s.mean:.1f} %, max {100 * s.max:.1f} % ({rows}).")


def table(items: list) -> list[str]:
    """The README's sweep table: per hardware and kind of job, rows, shipped rows, mean and max |error|, worst."""
    groups = defaultdict(list)
    for p, was in scored(items):
        groups[(p.run.hardware, p.run.category)].append((p, was))
    lines = ["| hardware | category | rows | of them shipped | mean abs error | max abs error | worst row |",
             "|---|---|---:|---:|---:|---:|---|"]
    for (hw, cat), group in sorted(groups.items()):
        s = summarise(p for p, _ in group)
        worst = max((p for p, _ in group), key=lambda p: abs(p.error))
        lines.append(f"| {hw} | {cat} | {len(group)} | {sum(w for _, w in group)} | {100 * s.mean:.1f}% | "
                     f"{100 * s.max:.1f}% | {worst.run.id} ({100 * worst.error:+.1f}%) |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every row's measured and predicted step")
    ap.add_argument("--write", action="store_true", help=f"write the rows' errors estimates cite to {ERRORS.name} "
                    f"and the speedups between presets what-if sweeps cite to {PAIRS.name}")
    args = ap.parse_args()
    items, unread, skipped, read = sweep()
    if args.write:  # and, from the same estimates, the speedups between presets what-if sweeps cite
        ERRORS.write_text(json.dumps(errors_table(scored(items)), indent=1) + "\n", encoding="utf-8")
        PAIRS.write_text(json.dumps(pairs_table(pairs(p for p, _ in scored(items))), indent=1) + "\n",
                         encoding="utf-8")
        print(f"wrote {ERRORS} and {PAIRS}")
    print(f"Megatron-Bridge rows (NeMo 25.11-26.08) on DGX H100, B200, B300, GB200, GB300: {read} read, "
          f"{unread} without a matching preset, {len(skipped)} not estimable, {len(items)} estimated\n")
    print("\n".join(table(items)))
    if said := unscored(items):
        print(f"\n{said}")
    rows = json.loads(DATA.read_text(encoding='utf-8'))['rows']
    print(f"\n{release_spread(rows)}")
    if said := retuned(items, rows):
        print(f"\n{said}")
    if said := later(items):
        print(f"\n{said}")
    if args.rows:
        print()
        for p, was in sorted(items, key=lambda t: (t[0].run.hardware, t[0].run.category, t[0].run.id)):
            print(f"{p.run.id:52} mb {p.micro_batch}  measured {p.measured_s:7.2f} s  predicted "
                  f"{p.predicted_s:7.2f} s  {100 * p.error:+6.1f}%{'  (shipped)' if was else ''}"
                  f"{'  (not scored)' if p.group == 'regression' else ''}"
                  + "".join(f"\n    {n}" for n in p.run.notes))
    for s in skipped:
        print("not estimable:", s)


if __name__ == "__main__":
    main()
