"""Write the shipped calibration runs (planner/calibration/runs/*.json) from the published rows in tests/data.

    python benchmarks/calibration_readings.py            # write the files
    python benchmarks/calibration_readings.py --check    # exit 1 if a shipped file differs from what this writes

The published rows (tests/data/published_runs.json, modern_runs.json,
more_runs.json; see tests/data/SOURCES.md) say what ran in the words of
their sources. `hyperplan calibrate` takes runs in one checked format
(`planner.calibration.runs`). This is our reading of each row into it:
the zoo model, the stack, the strategy as the row gives it, the measured
step time (the row's, or its batch x sequence over its tokens/s), and a
note for everything the row leaves open. Rows are read here and nowhere
else; tests/test_calibration_readings.py checks every degree against the
row it came from.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.calibration_specs import SPECS  # noqa: E402

DATA = ROOT / "tests" / "data"
OUT = ROOT / "planner" / "calibration" / "runs"
FILES = ("published_runs.json", "modern_runs.json", "more_runs.json")
ABOUT = {
    "a100": "Megatron-LM on A100 (Selene), 2021-22: Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Table 5.",
    "h100": "DGX H100 (H100 SXM5 80 GB, 700 W): NeMo 24.07, Megatron-Bridge 25.09-26.06, Megatron-LM r0.8, "
            "NeMo Automodel and the Megatron MoE ModelZoo.",
    "h100-96gb": "Meta Grand Teton H100 (96 GB HBM2e, 500 W): torchtitan's published benchmarks.",
    "h200": "H200 (WhiteFiber): torchtitan via Trainy.",
    "b200": "DGX B200: Megatron-Bridge performance summaries.",
    "b300": "DGX B300: Megatron-Bridge performance summaries, every row read with the workload preset of its release "
            "(tests/data/bridge_sweep.json, benchmarks/bench_bridge_sweep.py).",
    "gb200": "GB200 NVL72: Megatron-Bridge performance summaries and the Megatron MoE ModelZoo.",
    "gb300": "GB300 NVL72: the Megatron MoE ModelZoo's row (never fitted) and Megatron-Bridge performance summaries, "
             "every Bridge row read with the workload preset of its release (tests/data/bridge_sweep.json, "
             "benchmarks/bench_bridge_sweep.py).",
    "ascend-910b": "Ascend 910B (Atlas 900 A2 PODc): MindSpeed-LLM performance tables and example scripts.",
    "moe-recipes": "Megatron-LM's MoE recipe index (branch dev, examples/moe_recipes) on DGX H100, B200 and B300, "
                   "GB200 and GB300: each recipe's YAML as run, its step time derived from the index's TFLOP/s.",
}


def raw_rows() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in FILES:
        data = json.loads((DATA / name).read_text(encoding="utf-8"))
        for row in data["runs"]:
            out[row["id"]] = row | {"_file": name}
    return out


def measured(row: dict, variant: dict) -> dict:
    """The step time of a row (or of one of its variants) as the calibration format takes it."""
    if "tokens_per_s" in variant:
        return {"tokens_per_s_per_device": variant["tokens_per_s"]}
    if "step_s" in variant:
        return {"step_s": variant["step_s"]}
    m, d = row.get("measured", {}), row.get("derived", {})
    if "derived" in variant:  # one of the step times the row derives (the key names which)
        return {"step_s": d[variant["derived"]]}
    if "also" in variant:  # another layout the same table measured, kept beside the row (its key names the layout)
        return {"step_s": m["also"][variant["also"]]["step_s"]}
    if isinstance(m.get("step_s"), (int, float)):
        return {"step_s": m["step_s"]}
    if isinstance(m.get("iter_s"), (int, float)):
        return {"step_s": m["iter_s"]}
    if isinstance(m.get("tokens_per_s_per_gpu"), (int, float)):
        return {"tokens_per_s_per_device": m["tokens_per_s_per_gpu"]}
    if isinstance(m.get("tokens_per_s_per_npu"), (int, float)):
        return {"tokens_per_s_per_device": m["tokens_per_s_per_npu"]}
    if isinstance(d.get("step_s"), (int, float)):
        return {"step_s": d["step_s"]}
    if isinstance(row.get("iter_s"), (int, float)):
        return {"step_s": row["iter_s"]}
    if "tflops_per_gpu" in row:  # Narayanan 2021 Table 1: TFLOP/s counting the recomputed forward (eq. 3)
        b, s, n, h, v = row["batch"], row["seq"], row["L"], row["h"], row.get("vocab", 51200)
        flops = 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
        return {"step_s": round(flops / (row["tflops_per_gpu"] * 1e12 * row["gpus"]), 4)}
    raise ValueError(f"{row['id']}: no measured step time, tokens/s or derived step time")


def category(row: dict, spec: dict) -> str:
    """dense_training or moe_training (the published rows also file Ascend runs apart; the hardware says that)."""
    given = row.get("category", "dense_training")
    if given in ("dense_training", "moe_training"):
        return given
    return "moe_training" if spec.get("strategy", {}).get("ep", 1) > 1 or "a3b" in spec["model"] else "dense_training"


def reading(rid: str, row: dict, spec: dict, variant: dict) -> dict:
    out = {
        "id": rid + variant.get("suffix", ""),
        "source": f"tests/data/{row['_file']}#{row['id']}" + (f" ({variant['what']})" if "what" in variant else ""),
        "category": category(row, spec),
        "hardware": spec["hardware"],
        "devices": spec["devices"],
        "model": spec["model"],
    }
    if spec.get("overrides"):
        out["overrides"] = spec["overrides"]
    out |= {"seq_len": spec["seq_len"], "global_batch": spec["global_batch"],
            "dtype": variant.get("dtype", spec.get("dtype", "bf16")), "stack": spec["stack"]}
    execution = spec.get("execution", {}) | variant.get("execution", {})
    if execution:
        out["execution"] = execution
    out["strategy"] = spec["strategy"]
    out["measured"] = measured(row, variant)
    if "memory_gib" in variant or "memory_gib" in spec:
        out["memory_gib"] = variant.get("memory_gib", spec.get("memory_gib"))
    out["notes"] = list(spec.get("notes", ())) + list(variant.get("notes", ()))
    for key in ("known_regression", "never_fitted"):
        if spec.get(key):
            out[key] = spec[key]
    out["table"] = table_name(row)
    return out


#: Shipped files read from the Megatron-Bridge sweep: file name -> the hardware whose rows it takes (each row as the
#: preset of its release sets it, `bench_bridge_sweep.run_of`, in the sweep file's order, after the SPECS filed there)
SWEPT = {"gb300": "gb300-nvl72", "b300": "dgx-b300"}
#: Releases read after the presets were fitted (NeMo 26.08, Megatron-Bridge v0.6.0, read 2026-12-05): not shipped,
#: so `benchmarks/bench_bridge_sweep.py` scores their rows against fits that never saw them
LATER_RELEASES = frozenset({"26.08"})
#: The archive of Megatron-Bridge's performance summaries, one table per release
BRIDGE_ARCHIVE = ("NVIDIA-NeMo/Megatron-Bridge", "docs/performance-summary-archive.md")


def bridge_table(release: str) -> str:
    """The table (`Run.table`) of a Megatron-Bridge performance-summary row: its release's."""
    return f"Megatron-Bridge performance summary, NeMo {release}"


def table_name(row: dict) -> str:
    """The set of measurements a published row belongs to (`Run.table`): a Megatron-Bridge summary's release, else
    the document that published it (repository and path), or a paper's table."""
    src = row.get("source")
    if not isinstance(src, dict):
        return row["src"]  # published_runs.json: the paper and table ("Narayanan 2021 Table 1")
    if (src.get("repo"), src.get("path")) == BRIDGE_ARCHIVE:
        return bridge_table(str(src["section"]).split(" ")[0])
    path = re.split(r" \(| \+ | and | == | ; ", str(src.get("path") or ""))[0]  # the document, not its notes
    return " ".join(x for x in (str(src.get("repo") or ""), path) if x) or row["id"]


def readings() -> dict[str, list[dict]]:
    """Shipped file name -> its runs, in SPECS order (and the sweep's, for the `SWEPT` files)."""
    from benchmarks.bench_bridge_sweep import DATA as SWEEP, run_of

    raw = raw_rows()
    files: dict[str, list[dict]] = {}
    for rid, spec in SPECS.items():
        row = raw[spec.get("row", rid)]
        for variant in spec.get("variants", ({},)):
            files.setdefault(spec["file"], []).append(reading(rid, row, spec, variant))
    swept = json.loads(SWEEP.read_text(encoding="utf-8"))["rows"]
    for name, hardware in SWEPT.items():  # the sweep's rows after any a spec files there
        files[name] = files.get(name, []) + [run for i, row in enumerate(swept) if row["hardware"] == hardware
                                             and row["release"] not in LATER_RELEASES
                                             and (run := run_of(row, i)) is not None]
    return files


#: A JSON list of integers as json.dumps(indent=1) spreads it, one number a line (a pipeline split's 128 counts)
INT_LIST = re.compile(r"\[\n\s*(-?\d+(?:,\n\s*-?\d+)*)\n\s*\]")


def texts() -> dict[str, str]:
    """Each shipped file's text: indented JSON, a list of integers on one line."""
    def dump(doc: dict) -> str:
        text = json.dumps(doc, indent=1, ensure_ascii=False)
        return INT_LIST.sub(lambda m: "[" + ", ".join(n.strip() for n in m.group(1).split(",")) + "]", text) + "\n"
    return {name: dump({"about": ABOUT[name], "runs": runs}) for name, runs in readings().items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a shipped file differs")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, text in texts().items():
        path = OUT / f"{name}.json"
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python benchmarks/calibration_readings.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
