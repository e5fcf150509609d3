"""Predicted against measured: each run estimated with its own layout, stack and hardware.

A run is fitted when its hardware file lists it under `fitted_on`: the
efficiency parameters were chosen to match it. Every other row is held
out, and only held-out rows measure how right the model is; a row its
publisher says a bug slowed (`Run.known_regression`) is neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from cost_models import Cluster, load_cluster

from planner.calibration.runs import LARGEST_FITTING, MICRO_BATCHES, Run
from planner.costing.estimate import Estimate, estimate
from planner.costing.graph_facts import GraphFacts
from planner.errors import HyperplanError
from planner.graph.blocks import discover_blocks
from planner.strategy import Workload

GIB = 2.0**30


@dataclass(frozen=True, slots=True)
class Prediction:
    """One run: measured and predicted step time (and memory where measured)."""

    run: Run
    cluster: str
    fitted: bool  # the hardware's efficiency was fitted on this run
    micro_batch: int
    measured_s: float
    predicted_s: float
    estimate: Estimate

    @property
    def group(self) -> str:
        """"fit", "held-out", or "regression" (a measurement its publisher says a bug slowed: neither); a run kept
        out of every fit (`Run.never_fitted`) is held out even where a hardware file lists it as fitted."""
        if self.run.known_regression:
            return "regression"
        return "fit" if self.fitted and not self.run.never_fitted else "held-out"

    @property
    def error(self) -> float:
        """predicted / measured - 1 of the step time (of tokens/s it is the reciprocal)."""
        return self.predicted_s / self.measured_s - 1.0

    @property
    def predicted_memory_gib(self) -> float:
        """What the stack's allocator holds at the worst stage's peak (`Execution.reserved_bytes`): the figure
        PyTorch stacks report as peak memory (torchtitan logs `reserved_bytes.all.peak`)."""
        return self.run.execution.reserved_bytes(self.estimate.memory_bytes["peak"]) / GIB

    @property
    def memory_error(self) -> float | None:
        if self.run.memory_gib is None:
            return None
        return self.predicted_memory_gib / self.run.memory_gib - 1.0

    @property
    def tokens_per_s_per_device(self) -> tuple[float, float]:
        """(measured, predicted) tokens per second per device."""
        tokens = self.run.global_batch * self.run.seq_len / self.run.devices
        return tokens / self.measured_s, tokens / self.predicted_s


class Predictor:
    """Estimates runs, building each model's graph once (and its costing facts) and choosing micro-batches once.

    `graphs` is where the built graphs are kept, by model, architecture overrides and sequence length: pass one
    store to several predictors to build each graph once among them (the test suite does); a new one by default.
    """

    def __init__(self, graphs: dict[tuple, tuple] | None = None) -> None:
        self._graphs: dict[tuple, tuple] = {} if graphs is None else graphs
        self._micro: dict[tuple, int] = {}

    def graph(self, run: Run):
        from planner.api import load_graph

        key = (run.model, tuple(sorted(run.overrides.items())), run.seq_len)
        if key not in self._graphs:
            g = load_graph(run.model, batch=1, seq_len=run.seq_len, overrides=run.overrides)
            st = discover_blocks(g)
            self._graphs[key] = (g, st, GraphFacts(g, st))
        return self._graphs[key]

    def cluster(self, run: Run) -> Cluster:
        return load_cluster(run.hardware, devices=run.devices)

    def estimate(self, run: Run, cluster: Cluster, micro_batch: int) -> Estimate:
        g, st, facts = self.graph(run)
        work = Workload(global_batch=run.global_batch, seq_len=run.seq_len, dtype=run.dtype, execution=run.execution)
        return estimate(g, st, cluster, work, run.strategy_with(micro_batch), facts=facts)

    def micro_batch(self, run: Run, cluster: Cluster) -> int:
        """The row's micro-batch, or the largest of 8, 4, 2, 1 that divides its batch and fits (once per row)."""
        mb = run.strategy.get("micro_batch", 1)
        if mb != LARGEST_FITTING:
            return int(mb)
        key = (run.id, run.origin)
        if key not in self._micro:
            choice = 1
            for b in MICRO_BATCHES:
                try:
                    if self.estimate(run, cluster, b).fits:
                        choice = b
                        break
                except HyperplanError:
                    continue
            self._micro[key] = choice
        return self._micro[key]

    def predict(self, run: Run, cluster: Cluster | None = None) -> Prediction:
        hw = cluster or self.cluster(run)
        if hw.n_devices != run.devices:
            hw = hw.scaled(run.devices)
        mb = self.micro_batch(run, hw)
        est = self.estimate(run, hw, mb)
        return Prediction(run, hw.name, run.id in fitted_rows(hw), mb, run.measured_step_s, est.step_time_s, est)


def fitted_rows(cluster: Cluster) -> frozenset[str]:
    """The run ids the cluster's efficiency was fitted on."""
    return frozenset(cluster.fitted_on)


def predict_all(runs: Iterable[Run], predictor: Predictor | None = None,
                cluster: Cluster | None = None) -> tuple[list[Prediction], list[str]]:
    """Predictions of every run (on its own hardware, or on `cluster`), and the runs that could not be
    estimated, each with its reason."""
    predictor = predictor or Predictor()
    out, skipped = [], []
    for run in runs:
        try:
            out.append(predictor.predict(run, cluster))
        except HyperplanError as exc:
            skipped.append(f"{run.id}: {exc}")
    return out, skipped


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean and max |error| of a group of predictions."""

    rows: int
    mean: float
    max: float


def summarise(preds: Iterable[Prediction]) -> Summary:
    errs = [abs(p.error) for p in preds]
    return Summary(len(errs), sum(errs) / len(errs) if errs else 0.0, max(errs) if errs else 0.0)


__all__ = ["Prediction", "Predictor", "Summary", "fitted_rows", "predict_all", "summarise"]
