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
