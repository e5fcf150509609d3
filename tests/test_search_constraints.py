"""Constraints on `plan`: from the flags, from a plan file's `constraints:` section, recorded in the declaration
`plan -o` writes and read back from it; a file and a flag that disagree are refused, as is --time-limit 0."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from planner.errors import InvalidInput
from planner.hypershard.io import read_constraints, read_document
from planner.search.constraints import Constraints, merge

runner = CliRunner()
PLAN = ["plan", "gpt", "--layers", "4", "--hidden", "512", "--heads", "8", "--vocab", "8000", "--cluster", "dgx-h100",
        "--devices", "8", "--global-batch", "16", "--seq-len", "1024", "--no-mpmd"]


def _plan(*extra: str) -> dict:
    r = runner.invoke(app, PLAN + list(extra) + ["--json"], terminal_width=120)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_a_plan_files_constraints_are_kept_and_the_flags_add_to_them(tmp_path):
    f = tmp_path / "fixed.yaml"
    f.write_text("constraints:\n  tp: 2\n  zero: 1\n")
    s = _plan("--constraints", str(f), "--recompute", "full")["strategy"]
    assert (s["tp"], s["zero"], s["recompute"]) == (2, 1, "full")
    free = _plan()["strategy"]
    assert (free["tp"], free["zero"], free["recompute"]) != (2, 1, "full")  # the constraints changed the plan


def test_a_declaration_records_its_constraints_and_plan_reads_them_back(tmp_path):
    out = tmp_path / "plan.yaml"
    first = _plan("--tp", "4", "--offload", "optimizer=0.5", "-o", str(out))
    doc = read_document(str(out))  # still a valid declaration, with the section
    assert doc["constraints"] == {"tp": 4, "offload": {"optimizer": 0.5}}
    assert first["constraints"] == doc["constraints"]
    again = _plan("--constraints", str(out))
    assert again["strategy"] == first["strategy"]
    assert again["estimate"]["step_time_s"] == first["estimate"]["step_time_s"]


def test_a_flag_that_disagrees_with_the_file_is_refused(tmp_path):
    f = tmp_path / "fixed.json"
    f.write_text(json.dumps({"constraints": {"tp": 2}}))
    r = runner.invoke(app, PLAN + ["--constraints", str(f), "--tp", "4"], terminal_width=120)
    assert r.exit_code != 0
    assert "--tp 4 disagrees with" in r.output and "tp: 2" in r.output
    assert merge({"tp": 2}, {"tp": 2, "pp": 2}, "f") == {"tp": 2, "pp": 2}  # agreeing is fine


def test_a_file_without_the_section_or_with_an_unknown_key_is_refused(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text(yaml.safe_dump({"workload": {"global_batch": 16}}))
    with pytest.raises(InvalidInput, match="has no constraints: section"):
        read_constraints(str(f))
    f.write_text("constraints: {tpp: 2}\n")
    r = runner.invoke(app, PLAN + ["--constraints", str(f)], terminal_width=120)
    assert r.exit_code != 0 and "unknown constraint 'tpp'" in r.output
    f.write_text("constraints: {tp: eight}\n")  # named as the file's, not as a flag the command line did not give
    r = runner.invoke(app, PLAN + ["--constraints", str(f)], terminal_width=400)
    assert r.exit_code == 2 and f"{f}'s constraints: --tp must be a positive integer, got 'eight'" in r.output, r.output
    with pytest.raises(InvalidInput, match="does not exist"):
        read_constraints(str(tmp_path / "missing.yaml"))


def test_constraints_round_trip_through_their_section():
    c = Constraints.from_mapping({"stage_tp": [2, 4], "offload": {"params": 0.25}, "micro_batch": 2})
    assert c.given()["pp"] == 2 and c.given()["tp"] == 4  # stage widths set both
    assert Constraints.from_mapping(c.as_section()) == c


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_the_time_limit_must_be_positive(limit):
    r = runner.invoke(app, PLAN + ["--time-limit", limit], terminal_width=120)
    assert r.exit_code != 0
    assert "--time-limit" in r.output and "must be a finite number above 0" in r.output
