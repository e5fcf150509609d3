"""`validate` believes nothing it has not checked: every field against the schema, finite numbers, no key
given twice, and every recorded figure equal to its re-estimate (issue 17: a corrupted estimate said "valid")."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from planner.errors import InvalidInput
from planner.hypershard import declare, read_document, write_document
from planner.hypershard.validate import first_difference, validate_document

runner = CliRunner()


@pytest.fixture(scope="module")
def doc() -> dict:
    return declare("gpt", cluster="dgx-h100", devices=2, global_batch=4, seq_len=16, overrides={"layers": 2}, tp=2)


def _validate(tmp_path, text: str, suffix: str = ".yaml"):
    path = tmp_path / f"d{suffix}"
    path.write_text(text, encoding="utf-8")
    return runner.invoke(app, ["validate", str(path)])


def test_the_untouched_declaration_is_valid(doc, tmp_path):
    write_document(doc, str(tmp_path / "ok.yaml"))
    assert validate_document(read_document(str(tmp_path / "ok.yaml"))).ok


def test_a_key_given_twice_is_refused(doc, tmp_path):
    text = yaml.safe_dump(doc, sort_keys=False)
    r = _validate(tmp_path, text + "hypershard: 1\n")
    assert r.exit_code == 2 and "key 'hypershard' appears twice in one mapping" in r.output, r.output
    r = _validate(tmp_path, '{"hypershard": 1, "hypershard": 1}', ".json")
    assert r.exit_code == 2 and "key 'hypershard' appears twice in one object" in r.output, r.output


@pytest.mark.parametrize("suffix, where, value, words", [
    (".yaml", "over_gib", float("nan"), "field 'estimate.over_gib' is nan, not a finite number"),
    (".yaml", "step_time_s", float("inf"), "is inf, not a finite number"),
    (".json", "over_gib", float("nan"), "NaN is not a number JSON allows"),
    (".yaml", "mfu", True, "estimate.mfu"),
    (".yaml", "microbatches", 0, "estimate.microbatches"),
])
def test_a_corrupted_estimate_is_refused_in_one_sentence(doc, tmp_path, suffix, where, value, words):
    bad = json.loads(json.dumps(doc))
    bad["estimate"][where] = value
    text = json.dumps(bad) if suffix == ".json" else yaml.safe_dump(bad, sort_keys=False)
    r = _validate(tmp_path, text, suffix)
    assert r.exit_code == 2 and words in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_every_recorded_figure_is_recomputed(doc, tmp_path):
    bad = json.loads(json.dumps(doc))
    bad["estimate"]["tokens_per_s"] *= 1.01
    write_document(bad, str(tmp_path / "edited.yaml"))
    report = validate_document(read_document(str(tmp_path / "edited.yaml")))
    failed = [c for c in report.checks if not c.ok]
    assert [c.name for c in failed] == ["estimate"]
    assert "estimate.tokens_per_s is" in failed[0].detail and "as recorded" in failed[0].detail


def test_a_boolean_is_not_a_number_and_lists_compare_item_by_item():
    assert first_difference({"fits": 1}, {"fits": True}, "e") == "e.fits is 1 as recorded, True re-scored"
    assert first_difference({"a": [1.0, 2.0]}, {"a": [1.0, 2.5]}, "e") == "e.a[1] is 2.0 as recorded, 2.5 re-scored"
    assert first_difference({"a": 1}, {"a": 1, "b": 2}, "e") == "e.b is missing from the file"
    assert first_difference({"a": [1.0]}, {"a": [1.0]}, "e") is None


def test_deep_nesting_is_refused_not_a_crash(tmp_path):
    with pytest.raises(InvalidInput, match="nested too deeply"):
        path = tmp_path / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
        read_document(str(path))


def test_an_unknown_cluster_spec_fails_the_cluster_check(doc, tmp_path):
    """It had passed the cluster row ('16 devices of dgx-h100') and failed the model's."""
    bad = {**doc, "cluster": {**doc["cluster"], "spec": "nosuch"}}
    r = _validate(tmp_path, yaml.safe_dump(bad, sort_keys=False))
    assert r.exit_code == 2
    lines = r.output.splitlines()
    assert any(ln.startswith("FAIL  cluster   cluster.spec: unknown hardware 'nosuch'") for ln in lines), r.output
    assert not any(ln.startswith("  ok  cluster") or ln.startswith("FAIL  model") for ln in lines), r.output
