"""Shared test setup: the repo root on sys.path, the committed exported fixtures, a fixed terminal width, a
private whatif cache, property tests that neither time out nor vary by run, and under CI (CI=true) a failure
for any skip: CI installs every extra and ships every file the suite reads, so no test of it may skip there."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

#: Property tests run the same examples on every machine and never fail for being slow: no per-example
#: deadline (a loaded 2-core CI box is not a bug), and examples derived from the test, not from the clock.
settings.register_profile("hyperplan", deadline=None, derandomize=True, database=None)
settings.load_profile("hyperplan")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
if str(ROOT) not in sys.path:  # so plain `pytest` (not only `python -m pytest`) finds the packages
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: tiny ONNX graphs exported by torch (see make_torch_fixtures.py)."""
    return FIXTURES


@pytest.fixture(scope="session")
def manifest() -> dict:
    """Per fixture: torch's parameter count, per-layer counts, expected structure, dims to bind."""
    return json.loads((FIXTURES / "manifest.json").read_text())


@pytest.fixture(scope="session")
def shared_graphs() -> dict:
    """One store of the graphs the calibration tests' predictors build (`Predictor(graphs=...)`): each model's graph
    is built once for the whole run (once a worker under pytest-xdist), not once a module. Micro-batch choices stay
    each predictor's own; the graphs' costing facts and their caches (keyed by execution and cluster) travel with
    them, so a test that changes a stored facts object in place builds its own predictor."""
    return {}


#: The worker group (pytest-xdist's --dist loadgroup) of every test module that costs runs on `shared_graphs`: one
#: worker builds their graphs once (the eight modules beside test_calibration.py took 87 s alone, 42 s after it).
GRAPH_GROUP = "shared-graphs"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under --dist loadgroup each module's tests run in one worker, as under loadfile (a module's fixtures built
    once), and the modules that use `shared_graphs` all in one: each test is marked with its group before
    pytest-xdist reads the marks. Any other --dist ignores the marks."""
    def module(item) -> str:  # its file's name where an item has no module (a doctest, another plugin's item)
        return item.module.__name__ if getattr(item, "module", None) is not None else item.nodeid.split("::")[0]

    sharing = {module(item) for item in items if "shared_graphs" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(GRAPH_GROUP if module(item) in sharing else module(item)))


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch):
    """Every test renders at 80 columns whatever the caller's terminal or $COLUMNS (a test that wants another
    width passes CliRunner's terminal_width or env)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    """No test reads or writes the caller's ~/.cache/hyperplan: whatif's cache is a fresh folder per test
    (a test that shares one across calls sets HYPERPLAN_CACHE itself)."""
    monkeypatch.setenv("HYPERPLAN_CACHE", str(tmp_path_factory.mktemp("cache")))


# -- CI cannot go green by skipping ------------------------------------------------------------------
#: Tests marked with these need an optional extra (torch, jax) or data CI ships; CI installs them all.
STRICT_MARKS = ("torch", "jax", "calibration", "launch")

#: Where .ci/run asks for the record of marked tests and skips (it fails CI when the file is missing, lists a
#: skip, or counts no test of a mark: a hook that did not run cannot pass for one that found nothing).
REPORT_ENV = "HYPERPLAN_SKIP_REPORT"

_seen: dict[str, set[str]] = {m: set() for m in STRICT_MARKS}
_skipped: dict[str, str] = {}


def _strict() -> bool:
    """Under CI (CI=true, as .ci/run and most CI services set it) a skip of what CI installed is a failure."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _reason(rep) -> str:
    return rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)


def _missing_module(reason: str) -> bool:
    """A skip by pytest.importorskip: under CI every optional extra is installed, so it cannot be right."""
    return "could not import" in reason  # pytest.importorskip's wording


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Tag each report with its strict marks and, for a skip, its reason (attributes pytest-xdist carries to the
    controlling process with the report); under CI the skip becomes a failure here, where the test ran."""
    outcome = yield
    rep = outcome.get_result()
    rep.hyperplan_marks = [m for m in STRICT_MARKS if item.get_closest_marker(m) is not None]
    if not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = _reason(rep)
    rep.hyperplan_skip = reason
    if _strict():
        rep.outcome = "failed"
        if rep.hyperplan_marks:
            why = f"the test is marked {', '.join(rep.hyperplan_marks)}"
        else:
            why = "a module it imports is missing" if _missing_module(reason) else "every test is meant to run"
        rep.longrepr = f"skipped under CI, but {why} and CI installs what it needs: {reason}"


def _test_id(report) -> str:
    """The report's test id without the worker group pytest-xdist's loadgroup appends to it ('...::test@group')."""
    node = report.nodeid
    return node[:node.rindex("@")] if node.rfind("@") > node.rfind("]") else node


def pytest_runtest_logreport(report):
    """Record what ran and what skipped where the reports meet: the one process, or pytest-xdist's controller."""
    for m in getattr(report, "hyperplan_marks", ()):
        _seen[m].add(_test_id(report))
    if getattr(report, "hyperplan_skip", None) is not None:
        _skipped[_test_id(report)] = report.hyperplan_skip


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped:  # a whole module skipped at import (pytest.importorskip at its top)
        rep.hyperplan_skip = _reason(rep)
        if _strict():
            rep.outcome = "failed"
            rep.longrepr = f"{collector.nodeid} was skipped at collection under CI: {rep.hyperplan_skip}"


def pytest_collectreport(report):
    if getattr(report, "hyperplan_skip", None) is not None:
        _skipped[report.nodeid] = report.hyperplan_skip


def pytest_sessionfinish(session, exitstatus):
    """Write what .ci/run checks: per mark the tests that ran, and every skip (CI allows none); under pytest-xdist
    the controller writes it, from every worker's reports, and the workers nothing."""
    path = os.environ.get(REPORT_ENV)
    if path and not hasattr(session.config, "workerinput"):
        Path(path).write_text(json.dumps({"marked": {m: sorted(v) for m, v in _seen.items()},
                                          "skipped": dict(sorted(_skipped.items()))}, indent=1) + "\n")
