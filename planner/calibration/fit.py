"""Fit a hardware file's efficiency parameters to measured runs, and write them back into the file.

What is fitted, and why: a run's step time is mostly GEMMs (their
achievable fraction of the matrix peak, in bf16 and in fp8), memory-bound
ops, and communication hidden behind compute. The GEMM and memory curves
follow one physical law, a fixed per-kernel overhead t0 beside a rate,

    time = t0 + size / (plateau * peak)  =>  efficiency(size) = plateau * size / (size + t0 * plateau * peak)

(Hockney's r_inf, n_1/2; `cost_models.curves`), so they stay monotone in
size and below their plateau and carry to other sizes. Fitted: the bf16
GEMM plateau, the fp8 GEMM plateau (when a fit run trains in FP8), t0, the
host's per-op overhead of an eager training step, and the overlap
efficiency (the fraction of compute that can hide communication beside it,
when a fit run overlaps any). The memory plateau,
attention kernels' plateaus and the interconnect stay as the file gives
them: the runs cannot tell them apart from the fitted terms.

The objective is the sum of squared log errors of the step time over the
fit runs (scipy's least_squares, trf, from a fixed start: deterministic).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from cost_models import Cluster
from cost_models.accuracy import HeldOut, held_out_toml
from cost_models.loader import PRESET_DIR, preset_names, with_law

from planner.calibration.predict import Prediction, Predictor
from planner.calibration.runs import Run
from planner.errors import InvalidInput

#: name, start, lower, upper (overhead in microseconds). The per-kernel overhead is held to what a launch and a
#: minimal kernel cost (2-12 us on eager CUDA and CANN; the A100 fit gives 9.8): a fit that wants more is
#: making up for a cost the model lacks, and would charge it to every small kernel (decode, most of all).
#: The host's overhead is what an eager training step's host adds to each op it issues when the device waits
#: for it (Python, the framework's dispatch, the launch; training only: serving replays CUDA graphs); held to
#: 30 us, PyTorch eager's per-op cost under a Python-heavy framework.
PARAMETERS = (("matmul_plateau", 0.75, 0.30, 1.00), ("fp8_matmul_plateau", 0.70, 0.25, 1.00),
              ("kernel_overhead_us", 10.0, 2.0, 12.0), ("host_overhead_us", 5.0, 0.0, 30.0),
              ("overlap", 0.8, 0.2, 1.0))


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted parameters of one hardware file, the runs they were fitted on, and the fitted predictions."""

    hardware: str
    values: dict[str, float]
    runs: tuple[str, ...]
    predictions: tuple[Prediction, ...]
    evaluations: int
    tied: tuple[str, ...] = ()  # of `values`, those set from another by a fixed ratio (`fit`'s `ties`), not fitted
    bounded: tuple[str, ...] = ()  # of `values`, those the fit left at a bound of their range (`PARAMETERS`): the
    # runs ask for more (or less) than the model allows, so the value is not pinned by them

    def bound_sentence(self) -> str:
        """One sentence on the values a fit left at a bound of their range, or ""."""
        if not self.bounded:
            return ""
        return (f"{', '.join(f'{n} {self.values[n]:g}' for n in self.bounded)}: at the end of the range the fit "
                "allows, so the runs ask for more than the model gives there and do not pin it; check those runs "
                "(their layout, stack and measurement) before trusting the file")


#: Fit runs needed before the per-kernel overhead and the overlap efficiency are fitted too (with fewer, a fit
#: of four numbers to two or three runs would match them exactly and say nothing).
FEW_RUNS = 6


def fitted_names(runs: Sequence[Run]) -> list[str]:
    """Which parameters the runs can pin: the bf16 GEMM plateau with a 16-bit run, the fp8 one with an FP8 run;
    with `FEW_RUNS` or more, the per-kernel and host overheads, and the overlap efficiency when a run overlaps
    anything.
    The others keep the hardware file's values."""
    fp8 = any(r.dtype == "fp8" for r in runs)
    names = ["matmul_plateau"] if any(r.dtype != "fp8" for r in runs) or not fp8 else []
    if fp8:
        names.append("fp8_matmul_plateau")
    if len(runs) < FEW_RUNS:
        return names
    names += ["kernel_overhead_us", "host_overhead_us"]
    ex = [r.execution for r in runs]
    if any(e.overlap_grad_reduce or e.overlap_tp_comm or e.overlap_ep_comm or e.fsdp_prefetch for e in ex):
        names.append("overlap")
    return names


#: Stack fields a fit can set beside a hardware's parameters, by the prefix of their value names ("stack:NAME",
#: "tp_share:NAME"): the field, start, lower, upper. A stack's kernel efficiency against the hardware's fit
#: (fitted only where its runs share a hardware with others' stacks); the share of each TP all-gather or
#: reduce-scatter its overlap hides (fitted where runs with and without the overlap pin it).
STACK_FIELDS = {"stack": ("kernel_efficiency", 1.0, 0.5, 1.5), "tp_share": ("tp_overlap_share", 0.7, 0.1, 1.0)}


def is_device_value(name: str) -> bool:
    """Whether a fitted value is the hardware's (not a stack's)."""
    return ":" not in name


def with_stack_values(runs: Sequence[Run], values: Mapping[str, float]) -> list[Run]:
    """The runs with the fitted stack fields in `values` set on the executions of their stacks."""
    fields: dict[str, dict[str, float]] = {}
    for name, v in values.items():
        if not is_device_value(name):
            prefix, stack = name.split(":", 1)
            fields.setdefault(stack, {})[STACK_FIELDS[prefix][0]] = v
    return [dataclasses.replace(r, execution=dataclasses.replace(r.execution, **fields[r.execution.name]))
            if r.execution.name in fields else r for r in runs]


def fit(runs: Sequence[Run], base: Cluster, predictor: Predictor | None = None,
        progress: Callable[[int, float], None] | None = None, max_evaluations: int = 120,
        stacks: Sequence[str] = (), ties: Mapping[str, tuple[str, float]] | None = None,
        tp_shares: Sequence[str] = (), held: Sequence[str] = ()) -> Fit:
    """Least-squares fit of `base`'s efficiency parameters on `runs` (all on that hardware); with `stacks`, also
    the `kernel_efficiency` of those stacks (values named "stack:NAME"), with `tp_shares` their
    `tp_overlap_share` ("tp_share:NAME"), the others' held as they are. `ties` sets a parameter the runs
    cannot pin from one they fit: {name: (fitted name, ratio)}, name = ratio x it. `held` names parameters kept at
    `base`'s values although the runs could be fitted on them (a value taken from another preset's fit)."""
    from scipy.optimize import least_squares

    if not runs:
        raise InvalidInput("--fit names no run of this hardware; give the ids of measured runs to fit on")
    predictor = predictor or Predictor()
    stack_names = [f"stack:{n}" for n in stacks] + [f"tp_share:{n}" for n in tp_shares]
    unknown = sorted(set(held) - {p[0] for p in PARAMETERS})
    if unknown:
        raise InvalidInput(f"cannot hold {', '.join(unknown)}: the fitted parameters are "
                           f"{', '.join(p[0] for p in PARAMETERS)}")
    names = [n for n in fitted_names(runs) if n not in held] + stack_names
    if not names:
        raise InvalidInput("every parameter these runs could pin is held; fit more runs or hold fewer parameters")
    ties = {k: v for k, v in (ties or {}).items() if k not in names and v[0] in names}
    spec = {n: (s, lo, hi) for n, s, lo, hi in PARAMETERS} | {n: STACK_FIELDS[n.split(":")[0]][1:] for n in stack_names}
    start = np.array([spec[n][0] for n in names])
    lower, upper = np.array([spec[n][1] for n in names]), np.array([spec[n][2] for n in names])
    calls = [0]

    def with_ties(values: dict[str, float]) -> dict[str, float]:
        return values | {k: min(1.0, values[src] * ratio) for k, (src, ratio) in ties.items()}

    def cluster_of(values: dict[str, float]) -> Cluster:
        values = with_ties(values)
        return with_law(base, **law_values(base, {k: v for k, v in values.items() if is_device_value(k)}))

    def runs_of(values: dict[str, float]) -> list[Run]:
        return with_stack_values(runs, values)

    def residuals(x: np.ndarray) -> np.ndarray:
        calls[0] += 1
        values = dict(zip(names, map(float, x)))
        hw = cluster_of(values)
        errs = [math.log(predictor.predict(r, hw.scaled(r.devices)).error + 1.0) for r in runs_of(values)]
        out = np.array(errs)
        if progress:
            progress(calls[0], float(np.sqrt(np.mean(out**2))))
        return out

    sol = least_squares(residuals, start, bounds=(lower, upper), method="trf", diff_step=1e-2, xtol=1e-4,
                        ftol=1e-6, max_nfev=max_evaluations)
    values = {k: round(v, 3) for k, v in with_ties({n: round(float(v), 3) for n, v in zip(names, sol.x)}).items()}
    hw = cluster_of(values)
    preds = tuple(predictor.predict(r, hw.scaled(r.devices)) for r in runs_of(values))
    bounded = tuple(n for n, x in zip(names, sol.x) if min(x - spec[n][1], spec[n][2] - x) < 1e-3 * spec[n][2])
    return Fit(base.name, values, tuple(r.id for r in runs), preds, calls[0], tuple(ties), bounded)


def preset_values(c: Cluster) -> dict[str, float]:
    """A hardware's values of the fitted parameters (`PARAMETERS`), in their units (the overheads in us)."""
    return {"matmul_plateau": c.matmul_plateau, "fp8_matmul_plateau": c.fp8_matmul_plateau,
            "kernel_overhead_us": c.kernel_overhead_s * 1e6, "host_overhead_us": c.host_overhead_s * 1e6,
            "overlap": c.dp_overlap_efficiency}


def law_values(base: Cluster, values: dict[str, float]) -> dict[str, float]:
    """The law's parameters of `base` with `values` changed (the overhead in seconds)."""
    out = {"matmul_plateau": base.matmul_plateau, "fp8_matmul_plateau": base.fp8_matmul_plateau,
           "memory_plateau": base.memory_plateau, "overhead_s": base.kernel_overhead_s,
           "overlap": base.dp_overlap_efficiency, "host_overhead_s": base.host_overhead_s}
    seconds = {"kernel_overhead_us": "overhead_s", "host_overhead_us": "host_overhead_s"}
    for k, v in values.items():
        out[seconds.get(k, k)] = v * 1e-6 if k in seconds else v
    return out


def hardware_text(hardware: str) -> tuple[str, Path]:
    """The TOML text of a preset or hardware file, and its path."""
    path = PRESET_DIR / f"{hardware}.toml" if hardware in preset_names() else Path(hardware)
    try:
        return path.read_text(encoding="utf-8"), path
    except OSError as exc:
        raise InvalidInput(f"cannot read hardware file {str(path)!r} ({exc.strerror or exc})") from None


def write_fit(text: str, result: Fit, note: str) -> str:
    """`text` (a hardware TOML file) with the fitted values, the fitted run ids and `note` in [efficiency]."""
    lines = text.splitlines()
    start, end = _efficiency_lines(lines)
    section = lines[start + 1:end]
    while section and section[0].startswith("#"):  # the table's opening comment says where the values came from
        section.pop(0)
    section[:0] = ["# The overhead law, efficiency = plateau * size / (size + t0 * plateau * peak), at this device's own",
                   "# peaks, its parameters fitted by `hyperplan calibrate --fit` on the runs listed in fitted_on (the",
                   "# step time's squared log error, least squares); every other run of this hardware is held out."]
    if any(re.match(r"\s*(matmul|memory)\s*=", l) for l in section):
        raise InvalidInput("the hardware file's [efficiency] gives [size, efficiency] tables; write it with "
                           "matmul_plateau, memory_plateau and kernel_overhead_us to fit it")
    values = {k: v for k, v in result.values.items() if is_device_value(k)}
    kept = [k for k in ("matmul_plateau", "fp8_matmul_plateau", "memory_plateau", "kernel_overhead_us",
                        "host_overhead_us", "overlap")
            if k not in values or k in result.tied]
    values |= {"fitted_on": list(result.runs), "not_fitted": kept, "calibration": note}
    for key, value in values.items():
        _set(section, key, _toml(value))
    return "\n".join(lines[:start + 1] + section + lines[end:]) + "\n"


def write_held_out(text: str, rows: Sequence[HeldOut]) -> str:
    """`text` (a fitted hardware TOML file) with `held_out` in [efficiency] set to `rows` (`cost_models.accuracy`):
    the errors of the runs of that hardware the fit left out, per category; none, no line."""
    lines = text.splitlines()
    start, end = _efficiency_lines(lines)
    section = [l for l in lines[start + 1:end] if not re.match(r"\s*held_out\s*=", l)]
    if rows:
        _set(section, "held_out", held_out_toml(rows))
    return "\n".join(lines[:start + 1] + section + lines[end:]) + "\n"


def _efficiency_lines(lines: list[str]) -> tuple[int, int]:
    """The [efficiency] header's line of a hardware TOML file and the line that ends its table."""
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "[efficiency]")
    except StopIteration:
        raise InvalidInput("the hardware file has no [efficiency] table to write the fit into") from None
    return start, next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))


def _set(section: list[str], key: str, rendered: str) -> None:
    """Set `key = rendered` in the lines of a TOML table, in place of its line (or multi-line array), else last."""
    line = f"{key} = {rendered}"
    hit = [i for i, l in enumerate(section) if re.match(rf"\s*{key}\s*=", l)]
    if not hit:
        section.append(line)
        return
    first = last = hit[0]
    while section[last].count("[") > section[last].count("]") and last + 1 < len(section):
        last += 1  # a multi-line array continues until its closing bracket
    section[first:last + 1] = [line]


def _toml(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["Fit", "PARAMETERS", "STACK_FIELDS", "fit", "fitted_names", "hardware_text", "is_device_value",
           "law_values", "preset_values", "with_stack_values", "write_fit", "write_held_out"]
