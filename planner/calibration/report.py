"""What `hyperplan calibrate` reports: every run predicted, summaries per hardware, an optional fit."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from cost_models import load_cluster
from cost_models.accuracy import HeldOut
from cost_models.loader import load_text

from planner.calibration import layout_pairs
from planner.calibration.fit import (Fit, fit as fit_runs, hardware_text, is_device_value, with_stack_values, write_fit,
                                     write_held_out)
from planner.calibration.predict import Prediction, Predictor, predict_all, summarise
from planner.calibration.reserve_fit import fit_reserves
from planner.calibration.runs import Run
from planner.errors import InvalidInput


@dataclass(slots=True)
class CalibrationResult:
    predictions: list[Prediction]
    skipped: list[str]
    fit: Fit | None = None
    fitted_text: str | None = None  # the hardware file with the fit written in
    notes: dict[str, str] = field(default_factory=dict)  # hardware -> where its efficiency figures come from

    def summary(self) -> list[dict]:
        """Mean and max |error| per hardware, group (fit, held-out) and category."""
        groups: dict[tuple[str, str, str], list[Prediction]] = defaultdict(list)
        for p in self.predictions:
            groups[(p.cluster, p.group, p.run.category)].append(p)
        out = []
        for (hw, group, category), preds in sorted(groups.items()):
            s = summarise(preds)
            out.append({"hardware": hw, "group": group, "category": category, "rows": s.rows,
                        "mean_abs_error": s.mean, "max_abs_error": s.max})
        return out

    def memory_summary(self) -> list[dict]:
        """Per stack with measured peaks: mean and max |error| of the predicted reserved peak, fit and held-out
        runs apart, the stack's allocator reserve and the one its fitted runs give (`reserve_fit.fit_reserves`)."""
        given = {f.stack: f.reserve for f in fit_reserves(self.predictions)}
        groups: dict[tuple[str, str], list[Prediction]] = defaultdict(list)
        for p in self.predictions:
            if p.run.memory_gib is not None:
                groups[(p.run.execution.name, p.group)].append(p)
        out = []
        for (stack, group), preds in sorted(groups.items()):
            errors = [abs(p.memory_error) for p in preds]
            out.append({"stack": stack, "group": group, "rows": len(preds), "mean_abs_error": sum(errors) / len(errors),
                        "max_abs_error": max(errors), "allocator_reserve": preds[0].run.execution.allocator_reserve,
                        "fitted_reserve": given.get(stack)})
        return out

    def assumptions(self) -> dict[str, str]:
        """Hardware whose efficiency was not fitted on its own runs: the sentence its file gives."""
        return {hw: note for hw, note in self.notes.items() if note.startswith("transferred") or "ASSUMPTION" in note}

    def to_dict(self) -> dict:
        runs = []
        for p in self.predictions:
            measured, predicted = p.tokens_per_s_per_device
            runs.append({
                "id": p.run.id, "hardware": p.cluster, "devices": p.run.devices, "model": p.run.model,
                "category": p.run.category, "group": p.group, "source": p.run.source,
                "micro_batch": p.micro_batch, "measured_step_s": p.measured_s, "predicted_step_s": p.predicted_s,
                "error": p.error, "measured_tokens_per_s_per_device": measured,
                "predicted_tokens_per_s_per_device": predicted, "fits": p.estimate.fits,
                "measured_memory_gib": p.run.memory_gib, "predicted_memory_gib": p.predicted_memory_gib,
                "breakdown_s": dict(sorted(p.estimate.breakdown_s.items())), "notes": list(p.run.notes),
                "known_regression": p.run.known_regression or None,
                "never_fitted": p.run.never_fitted or None})
        found = layout_pairs.pairs(self.predictions)
        out = {"runs": runs, "summary": self.summary(), "memory_summary": self.memory_summary(),
               "layout_pairs": {"summary": layout_pairs.summary(found), "pairs": layout_pairs.to_dicts(found)},
               "skipped": self.skipped,
               "hardware": dict(sorted(self.notes.items()))}
        if self.fit is not None:
            out["fit"] = {"hardware": self.fit.hardware, "values": self.fit.values, "runs": list(self.fit.runs),
                          "evaluations": self.fit.evaluations, "at_bound": list(self.fit.bounded)}
        return out


def select(runs: Sequence[Run], hardware: str | None, category: str | None) -> list[Run]:
    out = [r for r in runs if (hardware is None or r.hardware == hardware)
           and (category is None or r.category == category)]
    if not runs:
        raise InvalidInput("the runs file holds no run; add rows to its 'runs' list (`hyperplan calibrate --help` "
                           "gives their format)")
    if not out:
        what = " and ".join(x for x in (f"hardware {hardware!r}" if hardware else "",
                                        f"category {category!r}" if category else "") if x)
        raise InvalidInput(f"no run has {what}; `hyperplan calibrate --json` lists the runs")
    return out


def calibrate_runs(runs: Sequence[Run], fit: Iterable[str] | None = None, stacks: Sequence[str] = (),
                   ties=None, note: str = "", tp_shares: Sequence[str] = (),
                   start_text: str | None = None, held: Sequence[str] = (),
                   predictor: Predictor | None = None) -> CalibrationResult:
    """Predict every run; with `fit`, first fit the hardware of those runs on them (then every prediction on
    that hardware uses the fitted parameters, and the fitted runs count as fit); with `stacks` too, the kernel
    efficiency of those stacks, with `tp_shares` their TP overlap share (every run of them is then predicted
    with it); `ties` as `fit.fit` takes them, and `note` added to the calibration sentence written into the file.
    `start_text` is the hardware file to fit from, in place of the installed one (which is then not read); `held`
    the hardware parameters the fit keeps as that file gives them; `predictor` the one to estimate with (its
    graphs reused), a new one by default."""

    predictor = predictor or Predictor()
    result_fit, text, override = None, None, None
    if fit is not None:
        ids = list(fit)
        chosen = [r for r in runs if r.id in set(ids)]
        missing = sorted(set(ids) - {r.id for r in chosen})
        if missing:
            raise InvalidInput(f"--fit names runs that are not in the files: {', '.join(missing)}")
        if kept := [r.id for r in chosen if r.never_fitted]:
            raise InvalidInput(f"--fit names runs their file keeps out of every fit (never_fitted): {', '.join(kept)};"
                               " leave them out of --fit or drop their never_fitted field")
        hardware = {r.hardware for r in chosen}
        if len(hardware) != 1:
            raise InvalidInput(f"--fit runs are on {len(hardware)} kinds of hardware ({', '.join(sorted(hardware))});"
                               " fit one hardware file at a time")
        hw_name = hardware.pop()
        base = (load_cluster(hw_name) if start_text is None else
                load_text(start_text, source=f"{hw_name}.toml", default_name=hw_name))
        result_fit = fit_runs(chosen, base, predictor, stacks=stacks, ties=ties, tp_shares=tp_shares, held=held)
        runs = with_stack_values(runs, result_fit.values)
        from cost_models.loader import with_law

        from planner.calibration.fit import law_values

        device_values = {k: v for k, v in result_fit.values.items() if is_device_value(k)}
        override = (hw_name, with_law(base, **law_values(base, device_values)))
        source = start_text if start_text is not None else hardware_text(hw_name)[0]
        note = f"fitted on {len(chosen)} measured runs (hyperplan calibrate --fit)" + (f"; {note}" if note else "")
        text = write_fit(source, result_fit, note)
        override = (hw_name, _with_fitted(override[1], result_fit.runs, note))
    preds, skipped = [], []
    for r in runs:
        cluster = override[1] if override and r.hardware == override[0] else None
        got, why = predict_all([r], predictor, cluster)
        preds += got
        skipped += why
    notes = {}
    for r in runs:
        if r.hardware not in notes:
            c = override[1] if override and r.hardware == override[0] else load_cluster(r.hardware)
            notes[c.name] = c.calibration
    result = CalibrationResult(preds, skipped, result_fit, text, notes)
    if text is not None:  # the fitted file says how far off its held-out runs came out, as the summary reports them
        result.fitted_text = write_held_out(text, [
            HeldOut(s["category"], s["rows"], s["mean_abs_error"], s["max_abs_error"]) for s in result.summary()
            if s["hardware"] == override[1].name and s["group"] == "held-out"])
    return result


def _with_fitted(cluster, runs, note):
    import dataclasses

    return dataclasses.replace(cluster, fitted_on=tuple(runs), calibration=note)


__all__ = ["CalibrationResult", "calibrate_runs", "select"]
