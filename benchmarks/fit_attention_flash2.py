"""Fit FlashAttention-2's own flash-attention length law on H100 (`cost_models.compute.attention_time_s`).

    python benchmarks/fit_attention_flash2.py

FlashAttention-3's benchmark figures (tests/data/flash2_h100.json) label FlashAttention-2's TFLOP/s on one H100
SXM5 at head dim 128 from 512 to 16K tokens: forward with the causal mask, backward without. Per phase this fits
rate(keys) = plateau x keys / (keys + K) (keys per query row: half the length causal, the length without), least
squares of the log rate, and prints the plateau as a share of the BF16 peak, K, and each row's error: the figures
the H100 presets carry as flash2's plateaus and `attention_kernel_half_keys`. FlashAttention-2 reaches its plateau
at shorter rows than cuDNN does (K 202 and 274 against cuDNN 9.19's 407 and 607), so cuDNN's law put on its
plateaus made it 6-10 % slow at 4K tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "flash2_h100.json"
H100_BF16_TFLOPS = 989.0


def keys_of(row: dict) -> float:
    """Keys per query row the kernel's tiles cover: half the length under the causal mask, else all of it."""
    return row["seq"] / 2 if row["causal"] else float(row["seq"])


def fit(rows: list[dict]) -> tuple[float, float]:
    """(plateau TFLOP/s, K) of the length law on `rows`, least squares of the log rate."""
    keys = np.array([keys_of(r) for r in rows])
    rate = np.array([r["tflops"] for r in rows], dtype=float)
    res = least_squares(lambda p: np.log(p[0] * keys / (keys + p[1])) - np.log(rate), [400.0, 300.0],
                        bounds=([1.0, 0.0], [2000.0, 1e5]))
    return float(res.x[0]), float(res.x[1])


def main() -> int:
    rows = json.loads(DATA.read_text(encoding="utf-8"))["rows"]
    for phase in ("fwd", "bwd"):
        mine = [r for r in rows if r["phase"] == phase]
        plateau, half = fit(mine)
        print(f"{phase}: plateau {plateau:.0f} TFLOP/s ({plateau / H100_BF16_TFLOPS:.3f} of the bf16 peak), "
              f"K {half:.0f} keys")
        for r in mine:
            k = keys_of(r)
            print(f"   {r['seq']:6d} tokens  measured {r['tflops']:4d}  law {plateau * k / (k + half):6.1f}  "
                  f"{100 * (plateau * k / (k + half) / r['tflops'] - 1):+5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
