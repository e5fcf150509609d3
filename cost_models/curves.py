"""Efficiency curves: the achievable fraction of a peak, as data, interpolated in log(size).

Why a curve and not a constant: small matmuls, small messages and small copies
reach a much lower fraction of peak than large ones, and the fraction grows
roughly with the logarithm of the size (Calculon keeps the same kind of
table per system). Keeping the points as data in the hardware file lets the
calibration fit move them without touching code.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from cost_models.errors import SpecError


@dataclass(frozen=True, slots=True)
class EfficiencyCurve:
    """Fraction of peak (0, 1] by size (FLOPs or bytes); linear in log(size), flat past the ends."""

    points: tuple[tuple[float, float], ...]
    _log_sizes: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise SpecError("an efficiency curve needs at least one [size, efficiency] point.")
        previous = 0.0
        for size, eff in self.points:
            if not (math.isfinite(size) and size > previous):
                raise SpecError(
                    f"efficiency curve sizes must be positive and strictly increasing, got {size:g} after {previous:g}."
                )
            if not (0.0 < eff <= 1.0):
                raise SpecError(f"an efficiency must lie in (0, 1], got {eff:g} at size {size:g}.")
            previous = size
        object.__setattr__(self, "_log_sizes", tuple(math.log(s) for s, _ in self.points))

    @classmethod
    def constant(cls, efficiency: float) -> EfficiencyCurve:
        """A flat curve: the same fraction of peak at every size."""
        return cls(points=((1.0, float(efficiency)),))

    def __call__(self, size: float) -> float:
        """Efficiency at `size`; sizes outside the points take the nearest end's value."""
        pts = self.points
        if size <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        x = math.log(size)
        hi = bisect.bisect_right(self._log_sizes, x)
        x0, x1 = self._log_sizes[hi - 1], self._log_sizes[hi]
        e0, e1 = pts[hi - 1][1], pts[hi][1]
        return e0 + (e1 - e0) * (x - x0) / (x1 - x0)

    def scaled(self, factor: float) -> EfficiencyCurve:
        """Every efficiency times `factor`, capped at 1: the one-knob move a calibration fit makes."""
        if not (factor > 0.0 and math.isfinite(factor)):
            raise SpecError(f"an efficiency scale factor must be a positive number, got {factor!r}.")
        return EfficiencyCurve(points=tuple((s, min(1.0, e * factor)) for s, e in self.points))

    @property
    def is_constant(self) -> bool:
        """True when every point has the same efficiency."""
        return len({e for _, e in self.points}) == 1

    def to_list(self) -> list[list[float]]:
        """Points as plain lists, for JSON and TOML."""
        return [[s, e] for s, e in self.points]


# -- the overhead law: how the matmul and memory curves are generated -------------------------------------
#
# One op costs a fixed overhead t0 (launch, prologue, last partial wave) beside a rate plateau * peak:
#     time = t0 + size / (plateau * peak)  =>  efficiency = plateau * size / (size + n_half),
#     n_half = t0 * plateau * peak,
# Hockney's (r_inf, n_1/2) model of a pipelined unit (Hockney & Jesshope, Parallel Computers 2, 1988,
# sec. 1.3.3): n_half is the size at which an op reaches half the plateau. It is the law that
# `hyperplan calibrate --fit` (planner/calibration/fit.py) fits; the same t0 on a faster device moves n_half up with the peak, which
# is why a curve cannot be copied between devices as a table but can be regenerated from its parameters.


def overhead_law(size: float, peak_per_s: float, plateau: float, overhead_s: float) -> float:
    """Fraction of `peak_per_s` reached by one op of `size` (FLOPs or bytes) that pays `overhead_s` once."""
    return plateau * size / (size + half_size(peak_per_s, plateau, overhead_s))


def half_size(peak_per_s: float, plateau: float, overhead_s: float) -> float:
    """n_1/2 = t0 * plateau * peak: the op size (FLOPs or bytes) that reaches half the plateau."""
    if not (math.isfinite(peak_per_s) and peak_per_s > 0.0):
        raise SpecError(f"the overhead law needs a positive peak rate, got {peak_per_s!r}.")
    if not (0.0 < plateau <= 1.0):
        raise SpecError(f"the overhead law's plateau must lie in (0, 1], got {plateau!r}.")
    if not (math.isfinite(overhead_s) and overhead_s > 0.0):
        raise SpecError(f"the overhead law's per-op overhead must be a positive number of seconds, got {overhead_s!r}.")
    return overhead_s * plateau * peak_per_s


def half_decade_sizes(n_half: float, span_decades: tuple[float, float]) -> tuple[float, ...]:
    """Sizes 10**(k/2) from n_half * 10**span[0] to n_half * 10**span[1], ends rounded to the nearest half-decade.

    Sizes are kept to 3 significant digits (3.16e7), as the presets store them. Spans relative to n_half put
    the samples at the same places on the curve's shape whatever the device's peak.
    """
    low, high = span_decades
    if not (math.isfinite(n_half) and n_half > 0.0):
        raise SpecError(f"a half-efficiency size must be a positive number, got {n_half!r}.")
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise SpecError(f"a sampling span must be two finite decade offsets, low < high, got {span_decades!r}.")
    centre = math.log10(n_half)
    first, last = (math.floor(2.0 * (centre + d) + 0.5) for d in (low, high))
    return tuple(float(f"{10.0 ** (k / 2.0):.3g}") for k in range(first, last + 1))


def law_curve(
    peak_per_s: float, plateau: float, overhead_s: float, span_decades: tuple[float, float], digits: int = 3
) -> EfficiencyCurve:
    """The overhead law sampled at half-decades around its n_half, efficiencies rounded to `digits` (>= 10**-digits)."""
    n_half = half_size(peak_per_s, plateau, overhead_s)
    floor = 10.0**-digits
    points = tuple(
        (s, max(floor, round(plateau * s / (s + n_half), digits))) for s in half_decade_sizes(n_half, span_decades)
    )
    return EfficiencyCurve(points=points)
