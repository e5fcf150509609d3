"""The conftest's CI rule, run on throwaway suites: under CI a skip fails, and the record .ci/run checks (the tests
each strict mark ran, every skip) comes out whole whether pytest runs the tests in one process or in pytest-xdist's
workers, whose reports meet in the controller. And .ci/run runs the README's test command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFTEST = Path(__file__).with_name("conftest.py")
WORKERS = pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadgroup"]], ids=["one-process", "xdist"])

SUITE = '''
import pytest

@pytest.fixture
def accelerator():
    pytest.skip("no accelerator here")

@pytest.mark.torch
def test_marked_and_run():
    assert True

@pytest.mark.jax
def test_marked_and_skipped_in_setup(accelerator):
    pass

def test_plain():
    assert True
'''

ABSENT = '''
import pytest

pytest.importorskip("a_module_no_machine_has")

def test_never_collected():
    pass
'''


def _run(tmp_path: Path, files: dict[str, str], workers: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """pytest under CI=true on `files` beside a copy of the conftest; its result and the record it wrote."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {"CI": "true", "HYPERPLAN_SKIP_REPORT": str(report)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *workers,
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    return r, json.loads(report.read_text())


@WORKERS
def test_a_skip_fails_under_ci_and_the_record_names_it(tmp_path, workers):
    r, record = _run(tmp_path, {"test_suite.py": SUITE}, workers)
    assert r.returncode == 1, r.stdout + r.stderr  # the skip failed the run
    assert "skipped under CI, but the test is marked jax" in r.stdout
    assert record["marked"]["torch"] == ["test_suite.py::test_marked_and_run"]
    assert record["marked"]["jax"] == ["test_suite.py::test_marked_and_skipped_in_setup"]
    assert record["marked"]["calibration"] == [] and record["marked"]["launch"] == []
    (where, why), = record["skipped"].items()
    assert where == "test_suite.py::test_marked_and_skipped_in_setup" and "no accelerator here" in why


@WORKERS
def test_a_module_skipped_at_import_fails_under_ci_and_the_record_names_it(tmp_path, workers):
    r, record = _run(tmp_path, {"test_absent.py": ABSENT}, workers)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "was skipped at collection under CI" in r.stdout
    (where, why), = record["skipped"].items()
    assert where == "test_absent.py" and "a_module_no_machine_has" in why


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"pip install -e '\.\[test\]' && (python3 -m pytest[^\n]*)", readme).group(1)
    assert f'HYPERPLAN_SKIP_REPORT="$report" {command}\n' in (ROOT / ".ci" / "run").read_text()
