"""What the search does with a strategy that does not fit in HBM: recompute the fewest whole layers, or move just
enough of a memory class off HBM.

Both are tried in a policy region's leaves (`plan_search._leaves`) from the strategies scored there that were over
memory: `fewest_full_layers` finds the fewest fully recomputed layers per chunk by regula falsi on the measured
peaks; `offload_variants` names the strategies that move just enough of one class (or the optimizer and one more)
to the host tier, in 5 % steps.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from planner.search.scoring import Candidate
from planner.strategy import Strategy

_OFFLOAD_STEP = 0.05


def offload_variants(c: Candidate, hbm: float) -> list[Strategy]:
    """Strategies that move just enough of one memory class (or the optimizer and one more) off HBM to fit.

    Fractions are rounded up to 5% steps; activations first (their traffic hides behind compute), then
    the optimizer states (ZeRO-Offload: the update runs on the host), then parameters.
    """
    mem = c.memory_bytes
    over = mem.get("peak", 0.0) - 0.99 * hbm
    if over <= 0 or c.strategy.tp == 0:
        return []
    base = dict(c.strategy.offload)
    out: list[Strategy] = []

    def frac(need: float, have: float) -> float | None:
        if have <= 0:
            return None
        f = math.ceil(need / have / _OFFLOAD_STEP) * _OFFLOAD_STEP
        return min(1.0, round(f, 2)) if need <= have else None

    for cls in ("activations", "optimizer", "params"):
        f = frac(over, mem.get(cls, 0.0))
        if f:
            out.append(replace(c.strategy, offload=tuple(sorted({**base, cls: f}.items()))))
    rest = over - mem.get("optimizer", 0.0)
    if rest > 0 and mem.get("optimizer", 0.0) > 0:
        for cls in ("activations", "params"):
            f = frac(rest, mem.get(cls, 0.0))
            if f:
                out.append(replace(c.strategy, offload=tuple(sorted({**base, "optimizer": 1.0, cls: f}.items()))))
    return out


def fewest_full_layers(score: Callable[[Strategy], Candidate], s: Strategy, peak_bytes: float, layers: int,
                       limit_bytes: float, on_fit: Callable[[Candidate], None]) -> None:
    """Score `s` with the first k layers of each chunk fully recomputed (`peak_bytes`: the peak of `s` with none;
    `limit_bytes`: the usable HBM; `on_fit` is handed each that fits) while searching the fewest k by regula falsi:
    first one short of full recompute (where only offload fits, that decides), then the chord of the measured peaks
    (memory falls by a layer's activations per chunk: for alike layers the chord lands on or just past the fewest),
    strictly inside the bracket, which decides: the bisection's count."""
    lo, hi = 0, math.ceil(layers / (s.pp * s.vpp))  # lo does not fit; hi is full recompute, its own region
    peak = {lo: peak_bytes}
    while hi - lo > 1:
        mid = hi - 1  # first the most short of full: if even that does not fit, no fewer do
        if hi in peak and peak[lo] > peak[hi] >= 0:
            mid = lo + math.ceil((peak[lo] - limit_bytes) / (peak[lo] - peak[hi]) * (hi - lo))
            mid = min(hi - 1, max(lo + 1, mid))
        c = score(replace(s, full_recompute_layers=mid))
        peak[mid] = c.peak_bytes
        if c.fits:
            hi = mid
            on_fit(c)
        else:
            lo = mid


__all__ = ["fewest_full_layers", "offload_variants"]
