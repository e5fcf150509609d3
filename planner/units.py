"""Numbers for people: each in the unit that fits it, three significant digits, never an exponent.

840 ns, 12.3 ms, 1.58 min, 1,296 h; 512 MiB, 14.9 TiB; 7.24 B parameters; 1.3 TFLOP. Used by the CLI's
tables and by the library's messages ("needs 14.9 TiB per device"), so that both read alike.
"""

from __future__ import annotations

import math
from typing import Sequence

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
_BINARY = ((2**50, "Pi"), (2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))
GIB = 2.0**30


def sig(value: float, digits: int = 3) -> str:
    """`digits` significant digits and never an exponent: 1023.4 -> '1,023', 12.34 -> '12.3', 2.0 -> '2'."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(value: float, table: Sequence[tuple[float, str]], unit: str, digits: int = 3) -> str:
    if not math.isfinite(value):
        return str(value)
    for scale, prefix in table:
        if abs(value) >= scale:
            return f"{sig(value / scale, digits)} {prefix}{unit}".rstrip()
    return f"{sig(value, digits)} {unit}".rstrip()


def count(n: float) -> str:
    """A parameter or element count: 26784 -> '26.8 K', 7.24e9 -> '7.24 B'."""
    return _scaled(float(n), _COUNT, "")


def flops(x: float) -> str:
    """FLOPs with an SI prefix: 1.3e12 -> '1.3 TFLOP'."""
    return _scaled(float(x), _SI, "FLOP")


def nbytes(x: float) -> str:
    """Bytes in binary units: 3 * 2**30 -> '3 GiB', 1.53e4 * 2**30 -> '14.9 TiB'."""
    return _scaled(float(x), _BINARY, "B")


def gib(x: float) -> str:
    """A figure held in GiB, in the binary unit that fits it: 0.5 -> '512 MiB', 15300 -> '14.9 TiB'."""
    return nbytes(float(x) * GIB)


def seconds(x: float) -> str:
    """A duration in the unit that fits it: 8.4e-7 -> '840 ns', 0.0123 -> '12.3 ms', 95 -> '1.58 min', 0 -> '0 s'."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0 s"
    for limit, scale, unit in ((1e-6, 1e-9, "ns"), (1e-3, 1e-6, "us"), (1.0, 1e-3, "ms"), (60.0, 1.0, "s"),
                               (3600.0, 60.0, "min")):
        if abs(x) < limit:
            return f"{sig(x / scale)} {unit}"
    return f"{sig(x / 3600.0)} h"


