"""Published serving deployments against the estimate: each row costed at its own configuration.

Rows live in a JSON file (the shipped ones: `published_deployments.json` beside this module; a user's
own, in the same format, through `hyperplan calibrate --serving FILE`): the model, the cluster (a preset or
a hardware table given in the file, whose `efficiency` may name a preset whose [efficiency] table it
shares), the devices, the layout, the batch per replica, the context and the dtype, and the measured
tokens/s per device. The estimate uses the same cost model as the planner, with nothing fitted per row.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from cost_models import Cluster, load_cluster
from cost_models.errors import SpecError
from cost_models.loader import PRESET_DIR, parse_cluster, preset_names

from planner.errors import HyperplanError, InvalidInput
from planner.inference.phase_cost import SERVING_DTYPES, Layout, Precision, StepModel, tokens_per_s_per_device
from planner.inference.serve import load_profile

#: The published deployments hyperplan ships (their sources in each row and in the file's `about`).
SHIPPED = Path(__file__).parent / "published_deployments.json"
PHASES = ("prefill", "decode")


def load_rows(path: str | Path) -> tuple[dict[str, Any], dict[str, Cluster]]:
    """The file's document, its rows checked (one sentence naming the file and the field when one is wrong), and
    its inline clusters by name."""
    where = Path(path).name
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it ({exc.strerror or exc}); give a deployments JSON file") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where}: not JSON ({exc.msg}, line {exc.lineno}); give a deployments JSON file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise InvalidInput(f"{where}: expected an object with a non-empty list \"rows\" of deployments "
                           f"(the format of {SHIPPED.name})")
    inline = doc.get("clusters", {})
    if not isinstance(inline, dict):
        raise InvalidInput(f"{where}: \"clusters\" must map names to hardware tables")
    try:
        clusters = {name: parse_cluster(_shared_efficiency(table, f"{where}:{name}"), source=f"{where}:{name}",
                                        default_name=name) for name, table in inline.items()}
    except (SpecError, ValueError) as exc:
        raise InvalidInput(str(exc).rstrip(".")) from None
    seen: set[str] = set()
    for k, row in enumerate(doc["rows"]):
        _check_row(row, f"{where}: rows[{k}]", set(clusters), seen)
    return doc, clusters


#: What a deployment row may hold: what the estimate reads, and its provenance (source, measured_as, notes,
#: why_not_compared)
ROW_KEYS = frozenset({"id", "model", "cluster", "devices", "phase", "layout", "batch", "context", "dtype",
                      "measured_tokens_per_s_per_device", "compared", "source", "measured_as", "notes",
                      "why_not_compared"})


def _check_row(row: Any, where: str, inline: set[str], seen: set[str]) -> None:
    if not isinstance(row, dict):
        raise InvalidInput(f"{where}: a deployment is an object, got {type(row).__name__}")
    for key, kind in (("id", str), ("model", str), ("cluster", str), ("phase", str), ("dtype", str)):
        if not isinstance(row.get(key), kind) or not row[key]:
            raise InvalidInput(f"{where}: \"{key}\" must be a non-empty string")
    where = f"{where} ({row['id']})"
    if row["id"] in seen:
        raise InvalidInput(f"{where}: the id is used twice; give each deployment its own")
    seen.add(row["id"])
    if row["cluster"] not in inline and row["cluster"] not in preset_names() and not row["cluster"].endswith(".toml"):
        raise InvalidInput(f"{where}: cluster {row['cluster']!r} is neither a preset ({', '.join(preset_names())}), "
                           "a .toml file nor a table under \"clusters\"")
    if row["phase"] not in PHASES or row["dtype"] not in SERVING_DTYPES:
        raise InvalidInput(f"{where}: phase must be one of {', '.join(PHASES)} and dtype one of "
                           f"{', '.join(SERVING_DTYPES)}, got {row['phase']!r} and {row['dtype']!r}")
    if extra := sorted(set(row) - ROW_KEYS):
        raise InvalidInput(f"{where}: unknown key {extra[0]!r}; a deployment has {', '.join(sorted(ROW_KEYS))}")
    lay = row.get("layout")
    if isinstance(lay, dict) and (extra := sorted(set(lay) - {"tp", "dp", "pp"})):
        raise InvalidInput(f"{where}: layout key {extra[0]!r} is not one the estimate reads; a layout is {{tp, dp, "
                           "pp} (a MoE phase's experts spread over each stage's tp x dp ranks)")
    counts = [row.get("devices"), row.get("batch"), row.get("context")] + (
        [lay.get(a) for a in ("tp", "dp", "pp")] if isinstance(lay, dict) else [None])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts):
        raise InvalidInput(f"{where}: devices, batch, context and layout {{tp, dp, pp}} must be positive integers")
    if lay["tp"] * lay["dp"] * lay["pp"] != row["devices"]:
        raise InvalidInput(f"{where}: layout tp x dp x pp = {lay['tp'] * lay['dp'] * lay['pp']}, but devices is "
                           f"{row['devices']}; make them agree")
    rate = row.get("measured_tokens_per_s_per_device")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise InvalidInput(f"{where}: \"measured_tokens_per_s_per_device\" must be a positive number")
    if not isinstance(row.get("compared", True), bool):
        raise InvalidInput(f"{where}: \"compared\" must be true or false")


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
    return {"id": row["id"], "cluster": name, "phase": row["phase"], "estimate": rate, "measured": measured,
            "error": rate / measured - 1.0, "step_ms": st.pass_s * 1e3, "limiter": st.limiter, "fits": st.fits,
            "compared": row.get("compared", True),
            "breakdown_ms": {k: v * 1e3 for k, v in sorted(st.breakdown_s.items())}}


def check_all(path: str | Path = SHIPPED) -> list[dict[str, Any]]:
    """Every row of the file, estimated."""
    return check_files([path])


def check_files(paths: Sequence[str | Path] = (), hardware: str | None = None) -> list[dict[str, Any]]:
    """Every deployment of `paths` (the shipped ones when empty) on `hardware` (all when None), estimated; a model
    or hardware file a row names that cannot be loaded is refused naming the file and the row."""
    results: list[dict[str, Any]] = []
    named: set[str] = set()
    for path in paths or [SHIPPED]:
        doc, clusters = load_rows(path)
        named |= {r["cluster"] for r in doc["rows"]}
        for row in doc["rows"]:
            if hardware is not None and row["cluster"] != hardware:
                continue
            try:
                results.append(estimate_row(row, clusters))
            except HyperplanError as exc:
                raise type(exc)(f"{Path(path).name} ({row['id']}): {exc}") from None
            except SpecError as exc:
                raise InvalidInput(f"{Path(path).name} ({row['id']}): {str(exc).rstrip('.')}") from None
    if not results:
        raise InvalidInput(f"no deployment runs on {hardware}; the files name {', '.join(sorted(named))}")
    return results
