"""A TOML table read with checks: typed getters that raise SpecError naming the file, the field and what it expected
(what a hardware file and a stack file are read through)."""

from __future__ import annotations

import json
import math
from typing import Any

from cost_models.curves import EfficiencyCurve
from cost_models.errors import SpecError


def shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


_MISSING = object()


class Table:
    """One TOML table and its dotted path, with typed getters that raise SpecError naming the field."""

    def __init__(self, data: Any, path: str, source: str) -> None:
        if not isinstance(data, dict):
            raise SpecError(f"{source}: {path}: expected a table, got {shown(data)}.")
        self.data, self.path, self.source = data, path, source

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, what: str) -> SpecError:
        where = self.field(key) if key else self.path
        return SpecError(f"{self.source}: {where}: {what}.")

    def only(self, *keys: str) -> None:
        for key in sorted(self.data):
            if key not in keys:
                raise self.error(key, f"unknown field; expected one of {', '.join(keys)}")

    def _get(self, key: str, default: Any, what: str) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, f"missing; expected {what}")
        return default

    def table(self, key: str, required: bool = True) -> Table:
        value = self._get(key, _MISSING if required else {}, "a table")
        return Table(value, self.field(key), self.source)

    def tables(self, key: str, required: bool) -> list[Table]:
        value = self._get(key, _MISSING if required else [], f"one or more [[{key}]] tables")
        if not isinstance(value, list) or (required and not value):
            raise self.error(key, f"expected one or more [[{key}]] tables, got {shown(value)}")
        return [Table(v, f"{self.field(key)}[{i}]", self.source) for i, v in enumerate(value)]

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default, "a string")
        if not isinstance(value, str) or (default is _MISSING and not value.strip()):
            raise self.error(key, f"expected a non-empty string, got {shown(value)}")
        return value

    def texts(self, key: str) -> list[str]:
        value = self._get(key, [], "a list of strings")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"expected a list of strings, got {shown(value)}")
        return value

    def number(self, key: str, default: Any = _MISSING, allow_zero: bool = False) -> Any:
        value = self._get(key, default, "a positive number")
        if value is default and default is not _MISSING:
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (value == 0 and not allow_zero):
            kind = "a non-negative number" if allow_zero else "a positive number"
            raise self.error(key, f"expected {kind}, got {shown(value)}")
        return float(value)

    def integer(self, key: str, minimum: int, default: Any = _MISSING) -> Any:
        value = self._get(key, default, f"an integer of at least {minimum}")
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.error(key, f"expected an integer of at least {minimum}, got {shown(value)}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default, "true or false")
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {shown(value)}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self._get(key, default, f"one of {', '.join(options)}")
        if value not in options:
            raise self.error(key, f"expected one of {', '.join(options)}, got {shown(value)}")
        return value

    def fraction(self, key: str, default: float) -> float:
        value = self._get(key, default, "a number in (0, 1]")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not (0.0 < value <= 1.0):
            raise self.error(key, f"expected a number in (0, 1], got {shown(value)}")
        return float(value)

    def one_of(self, units: dict[str, float], what: str) -> float:
        """Exactly one of several keys giving the same quantity in different units; returns SI."""
        given = [k for k in units if k in self.data]
        if len(given) != 1:
            keys = " or ".join(units)
            raise self.error("", f"give exactly one of {keys} ({what})")
        return self.number(given[0]) * units[given[0]]

    def curve(self, key: str) -> EfficiencyCurve:
        """A constant in (0, 1] or a list of [size, efficiency] points with sizes increasing; default 1."""
        value = self._get(key, 1.0, "an efficiency")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return EfficiencyCurve.constant(self.fraction(key, 1.0))
        if not isinstance(value, list) or not value:
            raise self.error(
                key, f"expected a number in (0, 1] or a list of [size, efficiency] points, got {shown(value)}")
        points = []
        previous = 0.0
        for i, point in enumerate(value):
            ok = (isinstance(point, list) and len(point) == 2
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point))
            if not ok or not (math.isfinite(point[0]) and point[0] > 0 and 0 < point[1] <= 1):
                raise self.error(
                    f"{key}[{i}]",
                    f"expected [size, efficiency] with size > 0 and efficiency in (0, 1], got {shown(point)}")
            if point[0] <= previous:
                raise self.error(f"{key}[{i}]", f"sizes must increase, got {point[0]:g} after {previous:g}")
            previous = point[0]
            points.append((float(point[0]), float(point[1])))
        return EfficiencyCurve(points=tuple(points))
