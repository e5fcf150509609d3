"""The conftest's CI rule, run on a throwaway suite: under CI a skip fails, and the record .ci/run checks (the
tests each strict mark ran, every skip) comes out whole whether pytest runs the tests in one process or in
pytest-xdist's workers, whose reports meet in the controller."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

SUITE = '''
import pytest

@pytest.mark.torch
def test_marked_and_run():
    assert True

@pytest.mark.jax
def test_marked_and_skipped():
    pytest.skip("no accelerator here")

def test_plain():
    assert True
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_skip_fails_under_ci_and_the_record_names_it(tmp_path, workers):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(SUITE)
    report = tmp_path / "report.json"
    env = dict(os.environ, CI="true", HYPERPLAN_SKIP_REPORT=str(report))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *workers,
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr  # the skip failed the run
    assert "skipped under CI, but the test is marked jax" in r.stdout
    record = json.loads(report.read_text())
    assert record["marked"]["torch"] == ["test_suite.py::test_marked_and_run"]
    assert record["marked"]["jax"] == ["test_suite.py::test_marked_and_skipped"]
    assert record["marked"]["calibration"] == [] and record["marked"]["launch"] == []
    (where, why), = record["skipped"].items()
    assert where == "test_suite.py::test_marked_and_skipped" and "no accelerator here" in why
