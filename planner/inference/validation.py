"""Published serving deployments against the estimate: each row costed at its own configuration.

Rows live in a JSON file (tests/data/serving_deployments.json): the model,
the cluster (a preset or a hardware table given in the file, whose `efficiency` may
name a preset whose [efficiency] table it shares), the devices,
the layout, the batch per replica, the context and the dtype, and the
measured tokens/s per device. The estimate uses the same cost model as the
planner, with nothing fitted per row.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from cost_models import Cluster, load_cluster
from cost_models.loader import PRESET_DIR, parse_cluster, preset_names

from planner.inference.phase_cost import Layout, Precision, StepModel, tokens_per_s_per_device
from planner.inference.serve import load_profile


def load_rows(path: str | Path) -> tuple[dict[str, Any], dict[str, Cluster]]:
    """The file's document and its inline clusters by name."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    clusters = {name: parse_cluster(_shared_efficiency(table, f"{Path(path).name}:{name}"),
                                    source=f"{Path(path).name}:{name}", default_name=name)
                for name, table in doc.get("clusters", {}).items()}
    return doc, clusters


def _shared_efficiency(table: dict[str, Any], where: str) -> dict[str, Any]:
    """The hardware table with `"efficiency": "<preset>"` replaced by that preset's [efficiency] table (the same
    silicon's fit, by name, so it follows the preset's refits)."""
    name = table.get("efficiency")
    if not isinstance(name, str):
        return table
    if name not in preset_names():
        raise ValueError(f"{where}: efficiency names {name!r}, not a preset ({', '.join(preset_names())})")
    with open(PRESET_DIR / f"{name}.toml", "rb") as f:
        return {**table, "efficiency": tomllib.load(f)["efficiency"]}


def estimate_row(row: dict[str, Any], clusters: dict[str, Cluster]) -> dict[str, Any]:
    """Tokens/s per device at the row's configuration, the step time and what limits it."""
    name = row["cluster"]
    base = clusters[name] if name in clusters else load_cluster(name)
    hw = base.scaled(row["devices"])
    lay = row["layout"]
    profile = load_profile(row["model"])
    layout = Layout(tp=lay["tp"], dp=lay["dp"], pp=lay["pp"], ep=lay["tp"] * lay["dp"] if profile.is_moe else 1)
    model = StepModel(profile, hw, layout, Precision(dtype=row["dtype"]))
    batch, ctx = row["batch"], row["context"]
    if row["phase"] == "decode":
        st = model.step(phase="decode", batch=batch, q=1, context=ctx)
        rate = tokens_per_s_per_device(st, layout, batch)
    else:
        st = model.step(phase="prefill", batch=batch, q=ctx, context=ctx)
        rate = tokens_per_s_per_device(st, layout, batch * ctx)
    measured = row["measured_tokens_per_s_per_device"]
    return {"id": row["id"], "estimate": rate, "measured": measured, "error": rate / measured - 1.0,
            "step_ms": st.pass_s * 1e3, "limiter": st.limiter, "fits": st.fits, "compared": row["compared"],
            "breakdown_ms": {k: v * 1e3 for k, v in sorted(st.breakdown_s.items())}}


def check_all(path: str | Path) -> list[dict[str, Any]]:
    """Every row of the file, estimated."""
    doc, clusters = load_rows(path)
    return [estimate_row(r, clusters) for r in doc["rows"]]
