"""Fit the head-dim law of flash attention (`cost_models.compute.head_dim_factor`) on cuDNN's published runs.

    python benchmarks/fit_attention_head_dim.py

cuDNN's SDPA training benchmark (tests/data/cudnn_sdpa.json, from NVIDIA/cudnn-frontend) times head dim 64
(gpt-oss's shape, a 1,024-token window) beside head dim 128 on H200. The dgx-h200 preset's cudnn plateaus and
length law were fitted on the head-dim-128 rows alone; this fits D, per phase, on the head-dim-64 rows (least
squares of the log time), and prints each row's error with it, and the held-out GB200 rows (head dim 64, a
128-token window) under the Blackwell presets' D. Prints the figures the presets' `attention_half_dims` carry.

It also times DeepSeek-V3's MLA shape (query-key head dim 192, values 128) on H200 and GB200: the rate of those
wide heads over head dim 128's, per GPU and phase (the geometric mean over the lengths, never above 1), is what
the presets' `attention_wide_heads` carry. H200's MLA rows were timed with a deterministic backward only (on
GB200, where both were timed, the two differ by -4 % to +9 % per row, 0.1 % on the geometric mean).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.optimize import minimize_scalar  # noqa: E402

from cost_models import load_cluster  # noqa: E402
from cost_models.compute import attention_time_s  # noqa: E402
from planner.costing.attention import kept_fraction, pass_window  # noqa: E402

DATA = ROOT / "tests" / "data" / "cudnn_sdpa.json"
PRESET = {"H200": "dgx-h200", "GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}
PHASES = {"fwd": ("forward", 0), "bwd": ("backward", 1)}


def useful_keys(row: dict) -> float:
    """Mean unmasked keys per query row, as the benchmark counts its FLOPs (benchmark_single_sdpa.py, flops)."""
    seq, window = row["seq"], row["window"]
    if row["mask"] != "top_left":
        return float(seq)
    if not window or seq <= window:
        return (seq + 1) / 2
    return (window * (window + 1) / 2 + (seq - window) * window) / seq


def kept_keys(row: dict) -> float:
    """Mean key positions a query row's computed tiles cover, as the cost model counts them (a row run in FP8, its
    "dtype", by the window its pass skips tiles by: `pass_window`)."""
    window = pass_window(row["window"], row["phase"] == "bwd", row.get("dtype", ""))
    return kept_fraction(row["seq"], row["seq"], row["mask"] == "top_left", window) * row["seq"]


def useful_flops(row: dict) -> float:
    """The row's FLOPs as the benchmark counts them, from its shape (its rounded TFLOP/s times its time agree to
    0.6 % where they have the digits): over the unmasked pairs, QK^T and PV forward, 2 (d_qk + d_v) a pair;
    backward S again, dP, dV, dQ and dK, 2 (3 d_qk + 2 d_v) a pair, 2.5x the forward at equal head dims: the
    count the cost model charges (`planner.costing.attention.backward_flops_ratio`)."""
    pairs = row["batch"] * row["heads"] * row["seq"] * useful_keys(row)
    qk, v = row["head_dim_qk"], row["head_dim_vo"]
    return 2.0 * pairs * ((3 * qk + 2 * v) if row["phase"] == "bwd" else (qk + v))


def predicted_ms(row: dict, cluster=None) -> float:
    """The row's time as the cost model charges it (on `cluster`, by default the row's GPU's preset): the FLOPs of
    the tiles it computes at the law's rate for the keys they cover and the head dim, in the row's FP8 format where
    it has one ("dtype")."""
    cluster = cluster or load_cluster(PRESET[row["gpu"]])
    keys = kept_keys(row)
    flops = useful_flops(row) * keys / useful_keys(row)
    head_dim = (row["head_dim_qk"] + row["head_dim_vo"]) / 2
    return 1e3 * attention_time_s(cluster, flops, 0.0, PHASES[row["phase"]][0], "cudnn", keys, head_dim,
                                  row.get("dtype", ""))


def narrow_rows(gpu: str, phase: str) -> list[dict]:
    return [r for r in json.loads(DATA.read_text(encoding="utf-8"))["rows"]
            if r["gpu"] == gpu and r["phase"] == phase and r["head_dim_qk"] < 128 and not r["deterministic"]]


def wide_rows(gpu: str, phase: str) -> list[dict]:
    """The GPU's MLA-shaped rows of `phase`: the non-deterministic ones where there are any (GB200), else all."""
    rows = [r for r in json.loads(DATA.read_text(encoding="utf-8"))["rows"]
            if r["gpu"] == gpu and r["phase"] == phase and r["head_dim_qk"] > 128 and r["mask"] == "top_left"]
    return [r for r in rows if not r["deterministic"]] or rows


def fit_wide(gpu: str, phase: str) -> float:
    """The rate of the GPU's MLA-shaped rows over head dim 128's law, at most 1: exp(mean log(predicted at 128's
    rate / measured))."""
    at_128 = dataclasses.replace(load_cluster(PRESET[gpu]), attention_wide_heads=(1.0, 1.0))
    rows = wide_rows(gpu, phase)
    rate = math.exp(sum(math.log(predicted_ms(r, at_128) / r["time_ms"]) for r in rows) / len(rows))
    return min(1.0, rate)


def fit(phase: str) -> float:
    """D of `phase` minimising the squared log error of H200's narrow-head rows."""
    base = load_cluster(PRESET["H200"])
    rows, at = narrow_rows("H200", phase), PHASES[phase][1]

    def loss(d0: float) -> float:
        dims = tuple(d0 if i == at else base.attention_half_dims[i] for i in range(2))
        c = dataclasses.replace(base, attention_half_dims=dims)
        return sum(math.log(predicted_ms(r, c) / r["time_ms"]) ** 2 for r in rows)

    return float(minimize_scalar(loss, bounds=(0.0, 512.0), method="bounded", options={"xatol": 0.1}).x)


def print_rows(rows: list[dict], cluster, label) -> None:
    """Each row's measured and predicted time on `cluster`, named by `label(row)`."""
    for r in rows:
        p = predicted_ms(r, cluster)
        print(f"  {label(r)}: measured {r['time_ms']:7.3f} ms, predicted {p:7.3f} ms ({p / r['time_ms'] - 1:+.0%})")


def main() -> int:
    fitted = {p: fit(p) for p in PHASES}
    print("D fitted on H200's head-dim-64 rows: forward %.0f, backward %.0f" % (fitted["fwd"], fitted["bwd"]))
    for gpu in PRESET:
        cluster = load_cluster(PRESET[gpu])
        print(f"{gpu} ({PRESET[gpu]}: attention_half_dims {list(cluster.attention_half_dims)}, "
              f"{'fitted' if gpu == 'H200' else 'held out'})")
        for phase in PHASES:
            print_rows(narrow_rows(gpu, phase), cluster, lambda r: f"{phase} window {r['window']:>5} seq {r['seq']:>6}")
        wide = [round(fit_wide(gpu, phase), 3) for phase in PHASES]
        print(f"  MLA heads (192/128) over head dim 128's rate, forward and backward: {wide} "
              f"(preset: {list(cluster.attention_wide_heads)})")
        for phase in PHASES:
            print_rows(wide_rows(gpu, phase), cluster,
                       lambda r: f"{phase} MLA seq {r['seq']:>6}{' (deterministic)' if r['deterministic'] else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
