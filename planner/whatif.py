"""What-if sweeps: the best plan of one model at each (cluster, device count), and how it scales.

Each point is a full `plan_model` search; points are independent, so they run
in worker processes (at most one per core) and are cached on disk by a hash
of everything that decides the result, so re-running a sweep with one more
point computes only that point. Figures that compare points (scaling and
marginal efficiency, cost per token) are derived after the points are known
and are never cached.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from planner.calibration.hardware_pairs import checked as hardware_checked
from planner.errors import HyperplanError, Infeasible, InvalidInput, SolverTimeout
from planner.model_source import display_name
from planner.whatif_pool import compute
from planner.whatif_cache import read_point, write_point, identity, cache_dir, cacheable, point_key

Progress = Callable[[str, float], None]
"""Called with a message and the fraction of the points done."""

MAX_POINTS = 256  # a typo like 1..100000+1 should be an error, not a week of planning
_RANGE = re.compile(r"^([0-9]+)\.\.([0-9]+)(?:([x+])([0-9]+))?$")  # ASCII digits: int() refuses "²"
_DEVICES_HELP = "write counts like 64,128,256, a geometric range like 64..1024x2 or a stepped range like 64..384+64"
_NUMBERS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu", "peak_memory_gib")


# -- parsing the sweep's axes ---------------------------------------------------------------------
def parse_devices(text: str) -> tuple[int, ...]:
    """`'64,128'`, `'64..1024x2'` (start..stop x factor) or `'64..384+64'` (step) -> sorted distinct counts."""
    counts: set[int] = set()
    for i, raw in enumerate(str(text).split(","), start=1):
        item = raw.strip()
        if not item:
            raise InvalidInput(f"--devices {text!r}: item {i} is empty; {_DEVICES_HELP}")
        if item.isascii() and item.isdigit():
            counts.add(_positive(int(item), item))
            continue
        m = _RANGE.match(item)
        if m is None:
            raise InvalidInput(f"--devices: {item!r} is neither a device count nor a range; {_DEVICES_HELP}")
        start, stop = _positive(int(m[1]), item), int(m[2])
        if stop > start:
            _positive(stop, item)
        kind, by = m[3] or "x", int(m[4] or 2)
        if stop < start:
            raise InvalidInput(f"--devices {item}: the range ends ({stop}) before it starts ({start}); "
                               "write the smaller count first")
        if kind == "x" and by < 2:
            raise InvalidInput(f"--devices {item}: a geometric range needs a factor of at least 2, "
                               f"like {start}..{stop}x2")
        if kind == "+" and by < 1:
            raise InvalidInput(f"--devices {item}: a stepped range needs a step of at least 1, "
                               f"like {start}..{stop}+{start}")
        n = start
        while n <= stop and len(counts) <= MAX_POINTS:
            counts.add(n)
            n = n * by if kind == "x" else n + by
        if len(counts) > MAX_POINTS:
            break
    if len(counts) > MAX_POINTS:
        raise InvalidInput(f"--devices {text!r} makes more than {MAX_POINTS} device counts; use a coarser range")
    return tuple(sorted(counts))


def _positive(n: int, item: str) -> int:
    from planner.bounds import MAX_DEVICES

    if n < 1:
        raise InvalidInput(f"--devices: {item!r} has a count of {n}; device counts start at 1")
    if n > MAX_DEVICES:
        raise InvalidInput(f"--devices: {item!r} has a count of {n:,}; no network joins more than {MAX_DEVICES:,} "
                           "devices (a three-tier fat tree of 128-port switches)")
    return n


def parse_clusters(text: str) -> tuple[str, ...]:
    """`'cloudmatrix384,gb200-nvl72'` -> the names (or .toml paths) in the order given, without repeats (the CLI
    joins repeated --cluster options with commas)."""
    names = [c.strip() for c in str(text).split(",")]
    if not all(names):
        raise InvalidInput(f"--cluster {text!r} has an empty name; "
                           "write NAME[,NAME...], like cloudmatrix384,gb200-nvl72")
    return tuple(dict.fromkeys(names))


def parse_prices(items: Sequence[str] | None, clusters: Sequence[str]) -> dict[str, float]:
    """`['cloudmatrix384=2.5']` -> {cluster: price per device-hour}; the prices are the user's, never guessed."""
    out: dict[str, float] = {}
    for item in items or ():
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not name:
            raise InvalidInput(f"--price {item!r} is not CLUSTER=PRICE; write it like --price {clusters[0]}=2.5")
        if name not in clusters:
            raise InvalidInput(f"--price {item!r}: {name!r} is not a swept cluster ({', '.join(clusters)})")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not price > 0 or price == float("inf"):
            raise InvalidInput(f"--price {item!r}: the price per device-hour must be a positive number, "
                               f"like {name}=2.5")
        out[name] = price
    return out


# -- the cache ------------------------------------------------------------------------------------
# -- one point ------------------------------------------------------------------------------------
def _plan_point(task: Mapping[str, Any]) -> dict[str, Any]:
    """Plan one point (in a worker process); the outcome as a plain, picklable record."""
    if task["mode"] == "infer":
        from planner.inference.sweep import infer_point

        return infer_point(task)
    from planner.api import plan_model

    rec: dict[str, Any] = {"status": "ok", "reason": None, "params": None, "search_complete": None}
    rec.update(dict.fromkeys(_NUMBERS))
    try:
        r = plan_model(task["model"], cluster=task["cluster"], devices=task["devices"],
                       global_batch=task["global_batch"], seq_len=task["seq_len"], dtype=task["dtype"],
                       mode=task["mode"], time_limit_s=task["time_limit_s"], overrides=task["overrides"],
                       dims=task["dims"], memory_gib=task["memory_gib"])
    except Infeasible as exc:  # proven: a search stopped before anything fit raises SolverTimeout
        return {**rec, "status": "infeasible", "reason": str(exc), "plan": None, "search_complete": True}
    except SolverTimeout as exc:  # not proven, so never cached
        return {**rec, "status": "timeout", "reason": str(exc), "plan": None}
    except HyperplanError as exc:  # a wrong input: the same at every point, so the sweep stops
        return {**rec, "status": "raise", "reason": str(exc), "plan": None}
    except Exception as exc:  # noqa: BLE001 - a planner bug at one point must not lose the others
        return {**rec, "status": "error", "reason": f"the planner failed: {type(exc).__name__}: {exc}", "plan": None}
    est = r["estimate"]
    return {**rec, "plan": r["strategy"]["summary"], "params": r["model"]["params"],
            "step_time_s": est["step_time_s"], "tokens_per_s": est["tokens_per_s"],
            "tokens_per_s_per_device": est["tokens_per_s"] / task["devices"], "mfu": est["mfu"],
            "peak_memory_gib": est["memory_gib"]["peak"], "search_complete": r["search"]["complete"],
            "checked": (r.get("accuracy") or {}).get("sentence")}


# -- the sweep ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sweep:
    """A sweep's result document, and how many of its points missed the cache (kept out of the
    document so that a cached and a fresh run print the same bytes)."""

    doc: dict[str, Any]
    computed: int


def run_sweep(
    model: str | os.PathLike,
    *,
    clusters: Sequence[str],
    devices: Sequence[int],
    global_batch: int,
    seq_len: int,
    dtype: str = "bf16",
    mode: str = "train",
    time_limit_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    memory_gib: float | None = None,
    prices: Mapping[str, float] | None = None,
    use_cache: bool = True,
    cache: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Sweep:
    """Plan `model` at every (cluster, device count); `.doc` is what `hyperplan whatif --json` prints.

    Points come out in the order of `clusters`, then by device count. A count
    a cluster cannot take is listed as `invalid`, one where nothing fits as
    `infeasible`, each with the reason. `prices` (per device-hour, the user's
    figures) add a cost per million tokens.
    """
    from planner.strategy import Workload

    if mode == "infer":
        raise InvalidInput("run_sweep plans training steps; an inference sweep is not planned by it: call "
                           "run_infer_sweep with the prompt and generation lengths (hyperplan whatif --mode infer)")
    if mode != "train":
        raise InvalidInput(f"--mode {mode!r}: use train or infer")
    Workload(mode=mode, global_batch=global_batch, seq_len=seq_len, dtype=dtype)  # checks batch and length
    if time_limit_s is not None and not time_limit_s > 0:
        raise InvalidInput(f"--time-limit must be positive, got {time_limit_s}")
    clusters = tuple(dict.fromkeys(clusters))
    base = {"global_batch": global_batch, "seq_len": seq_len, "dtype": dtype, "mode": mode,
            "time_limit_s": None if time_limit_s is None else float(time_limit_s), "memory_gib": memory_gib,
            "overrides": dict(sorted((overrides or {}).items())), "dims": dict(sorted((dims or {}).items()))}
    points, computed = sweep_points(model, clusters, devices, base, _empty, use_cache=use_cache, cache=cache,
                                    workers=workers, progress=progress)
    return Sweep(doc=_summarise(model, clusters, points, base, prices or {}), computed=computed)


def sweep_points(model: str | os.PathLike, clusters: Sequence[str], devices: Sequence[int], base: Mapping[str, Any],
                 empty: Callable[[str, str], dict[str, Any]], *, use_cache: bool, cache: str | os.PathLike | None,
                 workers: int | None, progress: Progress | None) -> tuple[list[dict[str, Any]], int]:
    """Every (cluster, device count) point's record, from the cache or planned (`base` + the point is the
    task `_plan_point` runs); and how many were planned. `empty(status, reason)` makes a record without a plan."""
    from cost_models import load_cluster
    from cost_models.errors import SpecError

    counts = tuple(sorted(set(devices)))
    if not clusters or not counts:
        raise InvalidInput("a sweep needs at least one --cluster and one --devices count")
    folder = Path(cache) if cache is not None else cache_dir()
    points: list[dict[str, Any]] = []
    pending: list[tuple[int, dict[str, Any], str]] = []
    for name in clusters:
        load_cluster(name)  # an unknown cluster stops the sweep: SpecError names the presets
        model_id, cluster_id = identity(model, name)
        for n in counts:
            point = {"cluster": name, "devices": n}
            try:
                load_cluster(name, devices=n)
            except SpecError as exc:
                points.append({**point, **empty("invalid", str(exc))})
                continue
            task = {**base, "model": os.fspath(model), "cluster": name, "devices": n}
            key = point_key({**task, "model": model_id, "cluster": cluster_id})
            hit = read_point(folder, key) if use_cache else None
            hit = hit if hit is not None and well_formed(hit, empty) else None
            points.append({**point, **(hit or {})})
            if hit is None:
                pending.append((len(points) - 1, task, key))
    if not any(p.get("status") != "invalid" for p in points):
        raise InvalidInput(f"no device count of {list(counts)} fits {', '.join(clusters)}: {points[0]['reason']}")
    finished = [0]

    def done(j: int, rec: dict[str, Any]) -> None:
        i, task, key = pending[j]
        points[i].update(rec)
        if use_cache and cacheable(rec):
            write_point(folder, key, rec)
        finished[0] += 1
        if progress is not None:
            progress(f"{task['cluster']} x {task['devices']}", finished[0] / len(pending))

    compute([t for _, t, _ in pending], workers, done, _plan_point)
    return points, len(pending)


def well_formed(hit: Any, empty: Callable[[str, str], dict[str, Any]]) -> bool:
    """Whether a cached record can be served: a record a fresh plan keeps (`cacheable`), with every field a fresh
    one of its status has (`empty`) and a number (or, planned, no number) in each figure's place. A file damaged,
    edited or written by another version that still parses is planned again."""
    if not isinstance(hit, dict) or hit.get("status") not in ("ok", "infeasible") or not cacheable(hit):
        return False
    fresh = empty(hit["status"], "")
    if not set(fresh) <= set(hit):
        return False
    figures = set(fresh) - {"status", "reason", "plan", "serving", "search_complete"}  # a fresh record's numbers
    planned = {"params", *_NUMBERS} if hit["status"] == "ok" else set()  # figures a training plan always has

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return all(number(hit[k]) or (hit[k] is None and k not in planned) for k in figures)


def _empty(status: str, reason: str) -> dict[str, Any]:
    return {"status": status, "reason": reason, "plan": None, "params": None, "search_complete": None,
            **dict.fromkeys(_NUMBERS)}


def _summarise(model: Any, clusters: Sequence[str], points: list[dict[str, Any]], base: Mapping[str, Any],
               prices: Mapping[str, float]) -> dict[str, Any]:
    """Add the figures that compare points of one cluster, and the sweep's header."""
    params = next((p["params"] for p in points if p["params"] is not None), None)
    header = []
    for name in clusters:
        mine = [p for p in points if p["cluster"] == name]
        ok = [p for p in mine if p["status"] == "ok"]
        price = prices.get(name)
        prev = None
        for p in mine:
            p.pop("params", None)
            p["scaling_efficiency"] = p["marginal_efficiency"] = p["cost_per_mtoken"] = None
            if p["status"] != "ok":
                continue
            # Scaling efficiency: throughput per device against the smallest feasible point (1.0 = linear).
            p["scaling_efficiency"] = p["tokens_per_s_per_device"] / ok[0]["tokens_per_s_per_device"]
            # Marginal efficiency: what the devices added since the previous feasible point bring,
            # per device, against the baseline's per-device throughput; near 0, adding devices stops paying.
            if prev is not None:
                gain = (p["tokens_per_s"] - prev["tokens_per_s"]) / (p["devices"] - prev["devices"])
                p["marginal_efficiency"] = gain / ok[0]["tokens_per_s_per_device"]
            if price is not None:  # price per device-hour x devices / tokens per hour, per million tokens
                p["cost_per_mtoken"] = price * p["devices"] / (3600.0 * p["tokens_per_s"]) * 1e6
            prev = p
        checked = [p.pop("checked", None) for p in mine]  # the hardware's held-out runs: one sentence per cluster
        header.append({"name": name, "baseline_devices": ok[0]["devices"] if ok else None,
                       "price_per_device_hour": price, "checked": next((c for c in checked if c), None)})
    workload = {k: base[k] for k in ("mode", "global_batch", "seq_len", "dtype")}
    # between two clusters, how far the estimated speedup was from the published one where a release ran one job
    # on both (planner.calibration.hardware_pairs)
    pairs = [{"from": a, "to": b, "checked": said} for a, b in combinations(clusters, 2)
             if (said := hardware_checked(a, b))]
    return {"model": {"name": display_name(model), "params": params,
                      "overrides": base["overrides"]},
            "workload": workload, "time_limit_s": base["time_limit_s"], "memory_gib": base["memory_gib"],
            "clusters": header, "pairs": pairs, "points": points}

