"""A measured training run, as `hyperplan calibrate` reads it: hardware, model, job, stack, layout, measurement.

A runs file is JSON: ``{"about": "...", "runs": [ROW, ...]}``, each ROW::

    {"id": "my-llama-70b", "source": "our cluster, 2026-11-02, job 4411",
     "hardware": "dgx-h100",               # a preset or a hardware .toml file
     "devices": 64,
     "model": "llama3-70b",                 # a zoo name, an .onnx file or a config.json
     "overrides": {"layers": 80},           # zoo architecture overrides (optional)
     "seq_len": 8192, "global_batch": 128, "dtype": "fp8",
     "stack": "megatron-core",              # a stack preset or a stack .toml file (optional)
     "execution": {"overlap_tp_comm": false},  # changes to the stack (optional)
     "strategy": {"tp": 4, "pp": 4, "cp": 2, "vpp": 5, "micro_batch": 1, "sp": true, "zero": 1},
     "measured": {"step_s": 10.75} | {"tokens_per_s_per_device": 1524},
     "memory_gib": 71.9,                    # measured peak per device (optional)
     "category": "dense_training", "notes": ["what was assumed, and why"],
     "known_regression": "the publisher's sentence",  # optional, see below
     "never_fitted": "why no fit may use it",        # optional, see below
     "table": "our cluster, November 2026"}          # optional, see below

`strategy` takes the keys of `planner.strategy.Strategy` (dp defaults to
what the devices leave); `micro_batch` may be "largest fitting" (the
largest of 8, 4, 2, 1 that divides the batch and fits, for sources that do
not say). Every field is checked; a bad row is refused with one sentence
naming it.

`known_regression` marks a measurement its publisher says a bug slowed
(Megatron-Bridge's 26.06.01 GPT-OSS rows: "Performance regression ... is a
known issue ... resolved with the next container release"): such a run
keeps its place in the file but is neither fitted on nor counted among the
held-out runs; `hyperplan calibrate` reports it apart, as "regression".
`never_fitted` says why a run is kept out of every fit (the shipped rows read
after the presets were fitted): it is always scored as held out, and the
split that chooses the fitted runs (`planner.calibration.alternate_split`)
does not see it. `table` names the measurements taken as one set (one
published table, one campaign on your cluster: one software state); runs of
one table that measure the same job in two strategies are compared as a
layout pair, the estimated throughput ratio against the measured one
(`planner.calibration.layout_pairs`). Without it a file's runs are one table.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from planner.costing.execution import Execution, load_execution, with_changes
from planner.errors import InvalidInput
from planner.strategy import RECOMPUTE_POLICIES, Strategy

STRATEGY_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "recompute", "full_recompute_layers",
                 "sp", "zero", "schedule", "stage_layers", "offload", "flushes")
#: The integer strategy keys of a row and the least each may be (etp 0: the tensor degree, Megatron-Core's default)
_COUNTS = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 0, "vpp": 1, "zero": 0, "flushes": 1,
           "full_recompute_layers": 0}
#: The kinds of job a row measures (`hyperplan calibrate --category`)
CATEGORIES = ("training", "dense_training", "moe_training")
ROW_KEYS = ("id", "source", "hardware", "devices", "model", "overrides", "seq_len", "global_batch", "dtype", "stack",
            "execution", "strategy", "measured", "memory_gib", "category", "notes", "known_regression",
            "never_fitted", "table")
LARGEST_FITTING = "largest fitting"
MICRO_BATCHES = (8, 4, 2, 1)


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run, checked (see the module docstring)."""

    id: str
    source: str
    hardware: str
    devices: int
    model: str
    overrides: Mapping[str, Any]
    seq_len: int
    global_batch: int
    dtype: str
    execution: Execution
    strategy: Mapping[str, Any]
    measured_step_s: float
    memory_gib: float | None = None
    category: str = "training"
    notes: tuple[str, ...] = ()
    known_regression: str = ""  # the publisher's sentence that a bug slowed this measurement (see the docstring)
    never_fitted: str = ""  # why no fit may use this run (see the docstring)
    table: str = ""  # the set of measurements it was taken in (see the docstring; "": its file's)
    origin: str = ""  # the file it was read from
    order: int = 0  # its place in that file
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def micro_batch_given(self) -> bool:
        return self.strategy.get("micro_batch", 1) != LARGEST_FITTING

    def strategy_with(self, micro_batch: int) -> Strategy:
        """The row's strategy at `micro_batch` (dp filled in from the devices when the row leaves it out)."""
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.strategy.items()}
        kw["micro_batch"] = micro_batch
        if "offload" in kw:
            kw["offload"] = tuple(sorted((str(k), float(v)) for k, v in dict(self.strategy["offload"]).items()))
        if "dp" not in kw:
            per = kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1)
            if self.devices % per:
                raise InvalidInput(f"run {self.id!r}: {self.devices} devices do not split into tp x pp x cp = {per}; "
                                   "give dp in its strategy")
            kw["dp"] = self.devices // per
        return Strategy(**kw)


def load_runs(path: str | Path) -> list[Run]:
    """Every run of a runs file, in file order; InvalidInput for a missing file or a bad row."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"no runs file at {str(path)!r}; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read runs file {str(path)!r} ({exc}); give a UTF-8 JSON file") from None
    except json.JSONDecodeError as exc:
        why = exc.msg.removesuffix(" at")  # "Unterminated string starting at": the position is given here
        raise InvalidInput(f"{path.name}: not valid JSON at line {exc.lineno}, column {exc.colno} ({why}); "
                           "fix the syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise InvalidInput(f"{path.name}: expected an object with a list 'runs'; see `hyperplan calibrate --help`")
    runs = [parse_run(row, where=f"{path.name}: runs[{i}]", origin=str(path), order=i)
            for i, row in enumerate(data["runs"])]
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise InvalidInput(f"{path.name}: run id {r.id!r} is used twice; give each run its own id")
        seen.add(r.id)
    return runs


def parse_run(row: Any, *, where: str, origin: str = "", order: int = 0) -> Run:
    """Check one row and read it into a `Run`."""
    if not isinstance(row, dict):
        raise InvalidInput(f"{where}: expected an object, got {type(row).__name__}")
    for key in sorted(row):
        if key not in ROW_KEYS:
            raise InvalidInput(f"{where}: unknown field {key!r}; expected one of {', '.join(ROW_KEYS)}")
    rid = _text(row, "id", where)
    where = f"{where} ({rid})"
    strategy = row.get("strategy", {})
    if not isinstance(strategy, dict):
        raise InvalidInput(f"{where}: strategy must be an object of {', '.join(STRATEGY_KEYS)}")
    for key in sorted(strategy):
        if key not in STRATEGY_KEYS:
            raise InvalidInput(f"{where}: unknown strategy key {key!r}; expected one of {', '.join(STRATEGY_KEYS)}")
    mb = strategy.get("micro_batch", 1)
    if mb != LARGEST_FITTING and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
        raise InvalidInput(f"{where}: strategy.micro_batch must be a positive integer or {LARGEST_FITTING!r}")
    if strategy.get("recompute", "none") not in RECOMPUTE_POLICIES:
        raise InvalidInput(f"{where}: strategy.recompute must be one of {', '.join(RECOMPUTE_POLICIES)}")
    for key, least in _COUNTS.items():
        v = strategy.get(key, least)
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise InvalidInput(f"{where}: strategy.{key} must be an integer of at least {least}, got {v!r}")
    if not isinstance(strategy.get("sp", False), bool):
        raise InvalidInput(f"{where}: strategy.sp must be true or false, got {strategy['sp']!r}")
    if row.get("category", "training") not in CATEGORIES:
        raise InvalidInput(f"{where}: category must be one of {', '.join(CATEGORIES)}, got {row['category']!r}")
    devices = _count(row, "devices", where)
    seq, batch = _count(row, "seq_len", where), _count(row, "global_batch", where)
    measured = row.get("measured")
    if not isinstance(measured, dict) or not ({"step_s", "tokens_per_s_per_device"} & set(measured)):
        raise InvalidInput(f"{where}: measured must give step_s or tokens_per_s_per_device")
    for key in sorted(set(measured) - {"step_s", "tokens_per_s_per_device"}):
        hint = "; a measured peak memory is the row's own memory_gib field" if "mem" in key else ""
        raise InvalidInput(f"{where}: measured: unknown field {key!r}; expected step_s or "
                           f"tokens_per_s_per_device{hint}")
    if "step_s" in measured:
        step = _positive(measured, "step_s", f"{where}: measured")
    else:
        step = batch * seq / (_positive(measured, "tokens_per_s_per_device", f"{where}: measured") * devices)
    execution = load_execution(row.get("stack"))
    changes = row.get("execution", {})
    if not isinstance(changes, dict):
        raise InvalidInput(f"{where}: execution must be an object of stack fields to change")
    execution = with_changes(execution, changes, where) if changes else execution
    memory = row.get("memory_gib")
    if memory is not None:
        memory = _positive(row, "memory_gib", where)
    overrides = row.get("overrides", {})
    if not isinstance(overrides, dict):
        raise InvalidInput(f"{where}: overrides must be an object of zoo architecture settings")
    notes = row.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise InvalidInput(f"{where}: notes must be a list of strings")
    regression = row.get("known_regression", "")
    if not isinstance(regression, str):
        raise InvalidInput(f"{where}: known_regression must be the publisher's sentence (a string)")
    never = row.get("never_fitted", "")
    if not isinstance(never, str):
        raise InvalidInput(f"{where}: never_fitted must say why no fit may use the run (a string)")
    table = row.get("table", "")
    if not isinstance(table, str):
        raise InvalidInput(f"{where}: table must name the set of measurements the run was taken in (a string)")
    return Run(id=rid, source=str(row.get("source", "")), hardware=_text(row, "hardware", where), devices=devices,
               model=_text(row, "model", where), overrides=dict(overrides), seq_len=seq, global_batch=batch,
               dtype=str(row.get("dtype", "bf16")), execution=execution, strategy=dict(strategy),
               measured_step_s=step, memory_gib=memory, category=str(row.get("category", "training")),
               notes=tuple(notes), known_regression=regression, never_fitted=never, table=table, origin=origin,
               order=order, raw=row)


def _text(row: Mapping, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{where}: {key} must be a non-empty string")
    return value


def _count(row: Mapping, key: str, where: str) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _positive(row: Mapping, key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


__all__ = ["LARGEST_FITTING", "MICRO_BATCHES", "Run", "load_runs", "parse_run"]
