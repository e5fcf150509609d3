"""Calibration: the cost model against measured runs, and fits of a hardware file's efficiency to them.

`runs` reads and checks a runs file; `predict` estimates each run with
its own layout, stack and hardware; `fit` fits a hardware file's
efficiency parameters on named runs and writes them back. The runs
hyperplan ships (`runs/*.json`, our reading of the published rows in
tests/data) are what `hyperplan calibrate` reads when given no file.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from planner.calibration.runs import Run, load_runs

SHIPPED = Path(__file__).parent / "runs"


def shipped_files() -> list[Path]:
    """The runs files hyperplan ships, sorted."""
    return sorted(SHIPPED.glob("*.json"))


def read_runs(files: Iterable[str | Path] | None = None) -> list[Run]:
    """Every run of the given files (the shipped ones when None), in file order."""
    out: list[Run] = []
    seen: dict[str, str] = {}
    for path in (list(files) if files else shipped_files()):
        for run in load_runs(path):
            if run.id in seen:
                from planner.errors import InvalidInput

                raise InvalidInput(f"run id {run.id!r} is in both {seen[run.id]} and {Path(path).name}; "
                                   "give each run its own id")
            seen[run.id] = Path(path).name
            out.append(run)
    return out


def published_row(run: Run) -> str:
    """The published row a run reads (runs read from one row, its variants, share it)."""
    return run.source.split(" (")[0] or run.id


def alternate_split(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Per hardware, the runs to fit: every other published row in file order (all variants of a row go
    together), never more than half of that hardware's runs (a hardware with one published row: the first half
    of its runs). A row its publisher says a bug slowed (`Run.known_regression`) keeps its place in the order but
    is never fitted on; a run kept out of every fit (`Run.never_fitted`) is not part of the split at all. A rule
    that does not look at the errors."""
    by_hw: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        if not r.never_fitted:
            by_hw[r.hardware].append(r)
    out: dict[str, list[Run]] = {}
    for hw, rows in by_hw.items():
        groups: dict[str, list[Run]] = {}
        for r in rows:
            groups.setdefault(published_row(r), []).append(r)
        fit: list[Run] = []
        if len(groups) == 1:  # one published row measured several ways: fit on the first half of its runs
            fit = [r for r in rows[:len(rows) // 2] if not r.known_regression]
        for k, members in enumerate(groups.values() if len(groups) > 1 else ()):
            clean = not any(r.known_regression for r in members)
            if k % 2 == 0 and clean and len(fit) + len(members) <= len(rows) / 2:
                fit += members
        out[hw] = fit
    return out


__all__ = ["SHIPPED", "alternate_split", "published_row", "read_runs", "shipped_files"]
