"""Predicted vs measured step time and memory of published Megatron-LM runs (issue 4, part 3).

    python benchmarks/calibrate.py [--runs PATH] [--cluster NAME_OR_TOML] [--json]

Every run row of the calibration file is built from the zoo's `gpt` (the
row's h, L, heads, vocab, seq; dropout as Megatron trains it), estimated
with the row's layout on the preset of its hardware, and compared with the
measured iteration time. Rows are split once, by a rule that does not look
at the errors: within each source paper, in file order, rows 0, 2, 4... are
the FIT rows (what `fit_calibration.py` fits the efficiency curves on) and
rows 1, 3, 5... are HELD OUT. Memory rows (Korthikanti 2022 Figure 1) are
compared per GPU: parameters + optimizer states, and activations without
recomputation and with sequence parallelism + selective recomputation.

How the rows are read (stated here, applied to every row alike):
- iteration time: `iter_s` if given; else from `tflops_per_gpu` with the
  FLOP count the file's "about" gives (96*B*s*L*h^2*(1 + s/(6h) + V/(16Lh))
  when it counts the recomputed forward, Narayanan 2021 eq. 3; the 72*...
  model-FLOP count otherwise); else from `mfu` and the device's peak.
- micro-batch: the row's `micro_batch` if given; else 1 when pp > 1 (a
  larger one only shrinks m and so grows the bubble (p-1)/m), else the
  largest of 1, 2, 4, 8 that divides the per-replica batch and fits in HBM.
- schedule: the row's `schedule`, else interleaved when vpp > 1, else 1F1B.
- overlap: Megatron-LM as published in 2021-22 reduced the data-parallel
  gradients after the last backward pass, overlapping nothing (Calculon's
  validation of the same runs sets `data_par_overlap: false`), so rows are
  estimated with dp_overlap = 0 unless they say `"dp_overlap": true`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models import Cluster, load_cluster  # noqa: E402
from planner.api import load_graph  # noqa: E402
from planner.errors import HyperplanError  # noqa: E402
from planner.estimate import Estimate, estimate  # noqa: E402
from planner.graph.blocks import discover_blocks  # noqa: E402
from planner.strategy import Strategy, Workload  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "calibration" / "published_runs.json"
GIB = 2.0**30
MICRO_BATCHES = (8, 4, 2, 1)  # tried largest first
#: hardware id of the calibration file -> preset; unknown ids fall back to the device named in them
PRESETS = {"a100-80gb-selene": "dgx-a100"}
DEVICE_HINTS = (("gb200", "gb200-nvl72"), ("h100", "dgx-h100"), ("a100", "dgx-a100"), ("910b", "ascend-910b"),
                ("cloudmatrix", "cloudmatrix384"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured training run, with the layout it used."""

    id: str
    src: str
    hw: str
    h: int
    L: int
    heads: int
    vocab: int
    seq: int
    tp: int
    pp: int
    dp: int
    vpp: int
    batch: int
    micro_batch: int | None
    recompute: str
    sp: bool
    schedule: str
    dtype: str
    dp_overlap: bool
    row: dict

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.h, self.L, self.heads, self.vocab, self.seq)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


def run_from_row(row: dict) -> Run:
    vpp = int(row.get("vpp", 1))
    return Run(id=row["id"], src=row.get("src", ""), hw=row.get("hw", ""), h=row["h"], L=row["L"], heads=row["heads"],
               vocab=row.get("vocab", 51200), seq=row["seq"], tp=row.get("tp", 1), pp=row.get("pp", 1),
               dp=row.get("dp", 1), vpp=vpp, batch=row["batch"], micro_batch=row.get("micro_batch"),
               recompute=row.get("recompute", "none"), sp=bool(row.get("sp", False)),
               schedule=row.get("schedule", "interleaved" if vpp > 1 else "1f1b"), dtype=row.get("dtype", "bf16"),
               dp_overlap=bool(row.get("dp_overlap", False)), row=row)


def load_file(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def paper(run: Run) -> str:
    """The source paper of a row ('Narayanan 2021 Table 1' -> 'Narayanan 2021')."""
    words = run.src.split()
    return " ".join(words[:2]) if len(words) >= 2 else (run.src or run.id.split("-")[0])


def split_rows(runs: Iterable[Run]) -> dict[str, str]:
    """Row id -> 'fit' or 'held-out': alternate rows within each source paper, in file order."""
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for r in runs:
        k = seen.get(paper(r), 0)
        seen[paper(r)] = k + 1
        out[r.id] = "fit" if k % 2 == 0 else "held-out"
    return out


def model_flops(run: Run, *, with_recompute: bool) -> float:
    """FLOPs of one iteration (Narayanan 2021 eq. 3; the file's "about")."""
    b, s, n, h, v = run.batch, run.seq, run.L, run.h, run.vocab
    if with_recompute:
        return 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    return 72.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))


def measured_s(run: Run, cluster: Cluster | None = None) -> float:
    row = run.row
    if "iter_s" in row:
        return float(row["iter_s"])
    gpus = row.get("gpus", run.gpus)
    if "tflops_per_gpu" in row:
        flops = model_flops(run, with_recompute=bool(row.get("tflops_counts_recompute", False)))
        return flops / (row["tflops_per_gpu"] * 1e12 * gpus)
    if "mfu" in row and cluster is not None:
        return model_flops(run, with_recompute=False) / (row["mfu"] * cluster.device.peak_flops(run.dtype) * gpus)
    raise ValueError(f"row {run.id} gives neither iter_s, tflops_per_gpu nor mfu")


def preset_for(hw: str) -> str | None:
    if hw in PRESETS:
        return PRESETS[hw]
    low = hw.lower()
    return next((preset for token, preset in DEVICE_HINTS if token in low), None)


@dataclass(frozen=True, slots=True)
class Prediction:
    run: Run
    group: str
    micro_batch: int
    micro_batch_rule: str
    measured_s: float
    predicted_s: float
    estimate: Estimate

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


class Predictor:
    """Estimates rows, building one graph per model shape and choosing each row's micro-batch once."""

    def __init__(self) -> None:
        self._graphs: dict[tuple, tuple[Any, Any]] = {}
        self._micro: dict[str, tuple[int, str]] = {}

    def graph(self, shape: tuple[int, int, int, int, int]):
        if shape not in self._graphs:
            h, n, heads, vocab, seq = shape
            g = load_graph("gpt", batch=1, seq_len=seq, overrides=dict(hidden=h, layers=n, heads=heads, vocab=vocab))
            self._graphs[shape] = (g, discover_blocks(g))
        return self._graphs[shape]

    def estimate(self, run: Run, cluster: Cluster, micro_batch: int, *, recompute: str | None = None,
                 sp: bool | None = None, batch: int | None = None) -> Estimate:
        g, st = self.graph(run.shape)
        hw = cluster.scaled(run.gpus)
        if not run.dp_overlap:
            hw = dataclasses.replace(hw, dp_overlap_efficiency=0.0)
        strat = Strategy(tp=run.tp, pp=run.pp, dp=run.dp, vpp=run.vpp, micro_batch=micro_batch,
                         recompute=run.recompute if recompute is None else recompute,
                         sp=run.sp if sp is None else sp, schedule=run.schedule)
        work = Workload(global_batch=run.batch if batch is None else batch, seq_len=run.seq, dtype=run.dtype)
        return estimate(g, st, hw, work, strat)

    def micro_batch(self, run: Run, cluster: Cluster) -> tuple[int, str]:
        """The row's micro-batch and the rule that gave it (see the module docstring)."""
        if run.id in self._micro:
            return self._micro[run.id]
        if run.micro_batch is not None:
            out = (int(run.micro_batch), "row")
        elif run.pp > 1:
            out = (1, "pp>1")
        else:
            per_replica = run.batch // run.dp
            out = (1, "none fits")
            for b in MICRO_BATCHES:
                if per_replica % b == 0 and self.estimate(run, cluster, b).fits:
                    out = (b, "largest fitting")
                    break
        self._micro[run.id] = out
        return out

    def predict(self, run: Run, cluster: Cluster, group: str) -> Prediction:
        mb, rule = self.micro_batch(run, cluster)
        est = self.estimate(run, cluster, mb)
        return Prediction(run, group, mb, rule, measured_s(run, cluster), est.step_time_s, est)


def runs_of(data: dict) -> list[Run]:
    return [run_from_row(r) for r in data.get("runs", [])]


def predict_all(data: dict, predictor: Predictor, cluster_override: Cluster | None = None,
                ids: Iterable[str] | None = None) -> tuple[list[Prediction], list[str]]:
    """Predictions of every run row (or of `ids`), and the rows skipped with why."""
    runs = runs_of(data)
    groups = split_rows(runs)
    wanted = None if ids is None else set(ids)
    out, skipped = [], []
    for run in runs:
        if wanted is not None and run.id not in wanted:
            continue
        cluster = cluster_override
        if cluster is None:
            name = preset_for(run.hw)
            if name is None:
                skipped.append(f"{run.id}: no preset for hardware {run.hw!r}")
                continue
            cluster = load_cluster(name)
        try:
            out.append(predictor.predict(run, cluster, groups[run.id]))
        except (HyperplanError, ValueError) as exc:
            skipped.append(f"{run.id}: {exc}")
    return out, skipped


@dataclass(frozen=True, slots=True)
class MemoryCheck:
    id: str
    what: str
    measured_gib: float
    predicted_gib: float

    @property
    def error(self) -> float:
        return self.predicted_gib / self.measured_gib - 1.0


def memory_checks(data: dict, predictor: Predictor, cluster: Cluster | None = None) -> list[MemoryCheck]:
    """Korthikanti 2022 Figure 1 rows: per-GPU model states and activations, predicted vs measured.

    Figure 1 counts the 18 bytes per parameter of the 12*L*h^2 layer weights
    only, so model states are read off a stage holding layers alone (the one
    with the fewest parameters) when there are several; activations are the
    first stage's, which holds the most micro-batches in flight. The layout
    (vpp, batch) is taken from the run row of the same model and degrees.
    """
    runs = runs_of(data)
    out = []
    for row in data.get("memory", []):
        twin = next((r for r in runs if (r.h, r.L, r.heads, r.tp, r.pp) ==
                     (row["h"], row["L"], row["heads"], row["tp"], row.get("pp", 1))), None)
        mb = int(row["micro_batch"])
        base = dict(id=row["id"], src=row.get("src", ""), hw=twin.hw if twin else "", h=row["h"], L=row["L"],
                    heads=row["heads"], vocab=row.get("vocab", twin.vocab if twin else 51200), seq=row["seq"],
                    tp=row["tp"], pp=row.get("pp", 1), dp=1, vpp=twin.vpp if twin else 1,
                    batch=twin.batch if twin else mb * row.get("pp", 1) * 4, micro_batch=mb)
        run = run_from_row(base)
        hw = cluster or load_cluster(preset_for(run.hw) or "dgx-a100")
        for key, what, recompute, sp in (("act_none_gib", "activations, no recompute", "none", False),
                                          ("act_sp_selective_gib", "activations, SP + selective", "selective", True)):
            if key in row:
                est = predictor.estimate(run, hw, mb, recompute=recompute, sp=sp)
                act = est.stages[0].memory_bytes["activations"]
                out.append(MemoryCheck(row["id"], what, row[key], act / GIB))
        if "params_opt_gib" in row:
            est = predictor.estimate(run, hw, mb, recompute="full")
            stage = min(est.stages, key=lambda s: (s.memory_bytes["params"], s.index))
            states = sum(stage.memory_bytes[k] for k in ("params", "grads", "optimizer"))
            out.append(MemoryCheck(row["id"], "params + optimizer", row["params_opt_gib"], states / GIB))
    return out


def summary(preds: list[Prediction], group: str) -> tuple[float, float, int]:
    """(mean |error|, max |error|, rows) of one group."""
    errs = [abs(p.error) for p in preds if p.group == group]
    return (sum(errs) / len(errs), max(errs), len(errs)) if errs else (0.0, 0.0, 0)


def _print_table(preds: list[Prediction], mems: list[MemoryCheck], skipped: list[str], seconds: float) -> None:
    print(f"{'run':<26} {'group':<9} {'layout':<22} {'mb':>3} {'rule':<16} {'measured s':>11} "
          f"{'predicted s':>12} {'error':>7}")
    for p in preds:
        r = p.run
        layout = f"t{r.tp} p{r.pp} d{r.dp}" + (f" v{r.vpp}" if r.vpp > 1 else "") + f" {r.recompute[:3]}" + \
            (" sp" if r.sp else "")
        print(f"{r.id:<26} {p.group:<9} {layout:<22} {p.micro_batch:>3} {p.micro_batch_rule:<16} "
              f"{p.measured_s:>11.3f} {p.predicted_s:>12.3f} {100 * p.error:>+6.1f}%")
    for group in ("fit", "held-out"):
        mean, worst, n = summary(preds, group)
        if n:
            print(f"{group:>9} rows: {n}, mean |error| {100 * mean:.2f}%, max |error| {100 * worst:.2f}%")
    if mems:
        print()
        print(f"{'memory row':<26} {'what':<28} {'measured GiB':>13} {'predicted GiB':>14} {'error':>7}")
        for m in mems:
            print(f"{m.id:<26} {m.what:<28} {m.measured_gib:>13.2f} {m.predicted_gib:>14.2f} {100 * m.error:>+6.1f}%")
    for s in skipped:
        print(f"skipped {s}")
    print(f"\n{len(preds)} runs and {len(mems)} memory figures in {seconds:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="the calibration file (published_runs.json)")
    ap.add_argument("--cluster", default=None, help="a preset or TOML file for every row (default: by row hardware)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if not args.runs.is_file():
        print(f"no calibration file at {args.runs}; pass --runs PATH", file=sys.stderr)
        return 2
    start = time.perf_counter()
    data = load_file(args.runs)
    cluster = load_cluster(args.cluster) if args.cluster else None
    predictor = Predictor()
    preds, skipped = predict_all(data, predictor, cluster)
    mems = memory_checks(data, predictor, cluster)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({
            "runs": [{"id": p.run.id, "group": p.group, "micro_batch": p.micro_batch, "rule": p.micro_batch_rule,
                      "measured_s": p.measured_s, "predicted_s": p.predicted_s, "error": p.error,
                      "breakdown_s": dict(p.estimate.breakdown_s)} for p in preds],
            "summary": {g: dict(zip(("mean_abs_error", "max_abs_error", "rows"), summary(preds, g)))
                        for g in ("fit", "held-out")},
            "memory": [dataclasses.asdict(m) | {"error": m.error} for m in mems],
            "skipped": skipped, "seconds": seconds}, indent=1, default=float))
    else:
        _print_table(preds, mems, skipped, seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
