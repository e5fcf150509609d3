"""Fit flash attention's FP8 plateaus (`Cluster.attention_fp8_plateau`) on cuDNN's published FP8 runs.

    python benchmarks/fit_attention_fp8.py

cuDNN's SDPA training benchmark (tests/data/cudnn_sdpa_fp8.json, from NVIDIA/cudnn-frontend) times the kernel in
FP8 (per-tensor scales) and MXFP8 beside its BF16 runs on GB200 and GB300 (cuDNN 9.22). Per GPU, format and phase
this fits the plateau, a fraction of the fp8 peak, on the causal head-dim-128 rows (Llama's shape, 2K-32K tokens)
under the preset's length law (`attention_half_keys`, fitted on the BF16 rows), least squares of the log time.
It then fits the rate of DeepSeek-V3's MLA heads (query-key 192, values 128) over that law on their causal rows
(the geometric mean of predicted over measured). Held out, each printed with its error: the non-causal rows of
both shapes, and GPT-OSS's head-dim-64 rows at a 128-token window under the preset's head-dim law, their backward
counted on every causal tile (`planner.costing.attention.pass_window`). Each row is predicted as
benchmarks/fit_attention_head_dim.py predicts the BF16 rows, in its FP8 format. Prints the figures the presets'
`attention_fp8` and `attention_fp8_wide_heads` carry.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.optimize import minimize_scalar  # noqa: E402

from benchmarks.fit_attention_head_dim import predicted_ms, print_rows as print_each  # noqa: E402
from cost_models import load_cluster  # noqa: E402

DATA = ROOT / "tests" / "data" / "cudnn_sdpa_fp8.json"
PRESET = {"GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}
FORMATS = ("fp8", "mxfp8")
PHASES = ("fwd", "bwd")


@functools.cache
def _all_rows() -> tuple[dict, ...]:
    return tuple(json.loads(DATA.read_text(encoding="utf-8"))["rows"])


def rows(gpu: str, fmt: str, phase: str, model: str, mask: str = "top_left") -> list[dict]:
    return [r for r in _all_rows()
            if (r["gpu"], r["dtype"], r["phase"], r["model"], r["mask"]) == (gpu, fmt, phase, model, mask)]


def fit(gpu: str, fmt: str) -> tuple[float, float]:
    """(forward, backward) plateaus minimising the squared log error of the causal head-dim-128 rows."""
    base = load_cluster(PRESET[gpu])
    out = []
    for at, phase in enumerate(PHASES):
        fitted = rows(gpu, fmt, phase, "llama3.1")

        def loss(p: float, at=at, fitted=fitted) -> float:
            pair = [0.5, 0.5]
            pair[at] = p
            c = dataclasses.replace(base, attention_fp8_plateaus=((fmt, *pair),))
            return sum(math.log(predicted_ms(r, c) / r["time_ms"]) ** 2 for r in fitted)

        out.append(float(minimize_scalar(loss, bounds=(0.05, 1.0), method="bounded", options={"xatol": 1e-4}).x))
    return out[0], out[1]


def fit_wide(gpu: str, fmt: str, plateaus: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) rate of the MLA-shaped causal rows over head dim 128's law under `plateaus`:
    exp(mean log(predicted at head dim 128's rate / measured))."""
    c = dataclasses.replace(load_cluster(PRESET[gpu]), attention_fp8_plateaus=((fmt, *plateaus),),
                            attention_fp8_wide_heads=((fmt, 1.0, 1.0),))
    out = []
    for phase in PHASES:
        picked = rows(gpu, fmt, phase, "dsv3")
        out.append(math.exp(sum(math.log(predicted_ms(r, c) / r["time_ms"]) for r in picked) / len(picked)))
    return out[0], out[1]


def print_rows(label: str, picked: list[dict], cluster) -> None:
    print_each(picked, cluster, lambda r: f"{label} {r['phase']} seq {r['seq']:>6}")


def main() -> int:
    for gpu, preset in PRESET.items():
        cluster = load_cluster(preset)
        print(f"{gpu} ({preset}: attention_fp8 {[list(v) for v in cluster.attention_fp8_plateaus]})")
        for fmt in FORMATS:
            fwd, bwd = fit(gpu, fmt)
            wide = fit_wide(gpu, fmt, (fwd, bwd))
            print(f"  {fmt}: plateaus fitted on the causal head-dim-128 rows, forward {fwd:.3f}, backward {bwd:.3f} "
                  f"of the fp8 peak; MLA's heads at {wide[0]:.3f} and {wide[1]:.3f} of head dim 128's rate")
            c = dataclasses.replace(cluster, attention_fp8_plateaus=((fmt, fwd, bwd),),
                                    attention_fp8_wide_heads=((fmt, *wide),))
            for phase in PHASES:
                print_rows(f"{fmt} fitted", rows(gpu, fmt, phase, "llama3.1"), c)
                print_rows(f"{fmt} fitted, MLA", rows(gpu, fmt, phase, "dsv3"), c)
            for phase in PHASES:
                print_rows(f"{fmt} held out, no mask", rows(gpu, fmt, phase, "llama3.1", "no_mask"), c)
                print_rows(f"{fmt} held out, MLA no mask", rows(gpu, fmt, phase, "dsv3", "no_mask"), c)
                print_rows(f"{fmt} held out, window 128", rows(gpu, fmt, phase, "gpt_oss"), c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
