"""The calibration plot: predicted against measured tokens/s per device, one point per run (matplotlib)."""

from __future__ import annotations

import io
from pathlib import Path

from planner.errors import InvalidInput
from planner.hypershard.io import write_atomically


def draw(result, path: Path) -> None:
    """Write a log-log scatter of predicted against measured tokens/s per device, fit and held-out runs apart,
    with the y = x line and the +-15% band."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInput("--plot needs matplotlib, which is not installed; run pip install 'hyperplan[plot]' "
                           "or drop --plot") from None
    fig, ax = plt.subplots(figsize=(6.4, 6.0), dpi=120)
    points = [(p.tokens_per_s_per_device, p.fitted, p.cluster) for p in result.predictions]
    for fitted, marker in ((True, "o"), (False, "^")):
        xs = [m for (m, _), f, _ in points if f == fitted]
        ys = [q for (_, q), f, _ in points if f == fitted]
        if xs:
            ax.scatter(xs, ys, marker=marker, s=22, label="fit runs" if fitted else "held-out runs")
    values = [v for (m, q), _, _ in points for v in (m, q) if v > 0]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        for k in (0.85, 1.15):
            ax.plot([lo, hi], [lo * k, hi * k], color="grey", linewidth=0.6, linestyle="--")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured tokens/s per device")
    ax.set_ylabel("predicted tokens/s per device")
    ax.set_title("hyperplan calibrate: predicted against measured (dashed: +-15%)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower().lstrip(".") or "png")
    plt.close(fig)
    write_atomically(str(path), buf.getvalue, (), "plot")
