"""What-if sweeps: the axes parse strictly, points scale as the cost model says, misses are explained,
the outputs (JSON, CSV, plot) are stable, and the cache spares every point already planned."""

from __future__ import annotations

import csv
import json

import jsonschema
import pytest
from typer.testing import CliRunner

from cli.app import app
from cost_models import load_cluster
from planner import whatif
from planner.api import plan_model
from planner.calibration.hardware_pairs import PAIRS
from planner.errors import Infeasible, InvalidInput
from planner.whatif import parse_clusters, parse_devices, parse_prices, run_sweep

runner = CliRunner()
MODEL = "llama3-8b"
SMALL = dict(layers=2, hidden=256, heads=4, kv_heads=2, vocab=1024)  # 22.9 M parameters: a point plans in ~1 s
SMALL_FLAGS = ["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--vocab", "1024"]
SWEEP = dict(clusters=("cloudmatrix384",), global_batch=64, seq_len=512, overrides=SMALL)
NUMBERS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu", "peak_memory_gib")
_NUM = {"type": "number", "minimum": 0}
_MAYBE = {"type": ["number", "null"]}
SCHEMA = {
    "type": "object",
    "required": ["model", "workload", "time_limit_s", "memory_gib", "clusters", "pairs", "points"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "object", "required": ["name", "params", "overrides"],
                  "properties": {"name": {"type": "string"}, "params": {"type": ["integer", "null"]},
                                 "overrides": {"type": "object"}}},
        "workload": {"type": "object", "required": ["mode", "global_batch", "seq_len", "dtype"],
                     "properties": {"mode": {"const": "train"}, "global_batch": {"type": "integer"},
                                    "seq_len": {"type": "integer"}, "dtype": {"type": "string"}}},
        "time_limit_s": {"type": ["number", "null"], "minimum": 0},  # null: no limit but the work budget
        "memory_gib": _MAYBE,
        "clusters": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "baseline_devices", "price_per_device_hour", "checked"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "baseline_devices": {"type": ["integer", "null"]},
                           "price_per_device_hour": _MAYBE, "checked": {"type": ["string", "null"]}}}},
        "pairs": {"type": "array", "items": {
            "type": "object", "required": ["from", "to", "checked"], "additionalProperties": False,
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}, "checked": {"type": "string"}}}},
        "points": {"type": "array", "items": {
            "type": "object",
            "required": ["cluster", "devices", "status", "reason", "plan", *NUMBERS, "scaling_efficiency",
                         "marginal_efficiency", "cost_per_mtoken", "search_complete"],
            "additionalProperties": False,
            "properties": {"cluster": {"type": "string"}, "devices": {"type": "integer", "minimum": 1},
                           "status": {"enum": ["ok", "infeasible", "invalid", "timeout", "error"]},
                           "reason": {"type": ["string", "null"]}, "plan": {"type": ["string", "null"]},
                           **{k: _MAYBE for k in (*NUMBERS, "scaling_efficiency", "marginal_efficiency",
                                                  "cost_per_mtoken")},
                           "search_complete": {"type": ["boolean", "null"]}},
            "if": {"properties": {"status": {"const": "ok"}}},
            "then": {"properties": {"plan": {"type": "string"}, "reason": {"type": "null"},
                                    "scaling_efficiency": _NUM, **{k: _NUM for k in NUMBERS}}},
            "else": {"properties": {"reason": {"type": "string", "minLength": 10}, "plan": {"type": "null"},
                                    **{k: {"type": "null"} for k in NUMBERS}}}}},
    },
}


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    """One cache for the module: what the library sweeps plan, the CLI tests read back."""
    return tmp_path_factory.mktemp("hyperplan-cache")


@pytest.fixture(scope="module")
def sweep(cache_root):
    """1, 2, 4 and 8 devices at a fixed global batch, planned one by one (the reference for the pool)."""
    return run_sweep(MODEL, devices=(8, 1, 4, 2, 4), cache=cache_root / "whatif", workers=1, **SWEEP)


# -- parsing --------------------------------------------------------------------------------------
def test_devices_lists_and_ranges():
    assert parse_devices("256,64, 128") == (64, 128, 256)
    assert parse_devices("64..1024x2") == (64, 128, 256, 512, 1024)
    assert parse_devices("64..1000x4") == (64, 256)  # the stop is a bound, not a member
    assert parse_devices("64..384+64") == (64, 128, 192, 256, 320, 384)
    assert parse_devices("8,64..256x2,128") == (8, 64, 128, 256)
    assert parse_devices("1..4") == (1, 2, 4)  # factor 2 by default


@pytest.mark.parametrize("text, words", [
    ("64,,128", "item 2 is empty"), ("lots", "'lots' is neither"), ("1024..64x2", "ends (64) before it starts"),
    ("64..128x1", "factor of at least 2"), ("64..128+0", "step of at least 1"), ("0,8", "start at 1"),
    ("1..100000+1", "more than 256"), ("64-128", "neither"),
])
def test_devices_errors_are_one_sentence(text, words):
    with pytest.raises(InvalidInput) as err:
        parse_devices(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_clusters_and_prices():
    assert parse_clusters("cloudmatrix384, gb200-nvl72,cloudmatrix384") == ("cloudmatrix384", "gb200-nvl72")
    with pytest.raises(InvalidInput, match="empty name"):
        parse_clusters("cloudmatrix384,,dgx-h100")
    assert parse_prices(["dgx-h100=2.5"], ("dgx-h100",)) == {"dgx-h100": 2.5}
    for bad, words in (("dgx-h100", "CLUSTER=PRICE"), ("gb200-nvl72=3", "not a swept cluster"),
                       ("dgx-h100=-1", "positive"), ("dgx-h100=cheap", "positive")):
        with pytest.raises(InvalidInput, match=words):
            parse_prices([bad], ("dgx-h100",))


def test_mode_infer_goes_to_the_inference_sweep(tmp_path):
    with pytest.raises(InvalidInput, match="run_infer_sweep"):
        run_sweep(MODEL, devices=(1,), mode="infer", cache=tmp_path, **SWEEP)


#: What a sweep says of CloudMatrix384's figures: no run of its own, its efficiency the 910B's fit
_SOURCE = load_cluster("ascend-910b").checked("dense_training").sentence("ascend-910b", shipped=True)
CLOUDMATRIX_CHECKED = ("no held-out dense training run on cloudmatrix384: how far off its estimates are is unchecked "
                       f"(its efficiency is ascend-910b's fit, with {_SOURCE})")


# -- what the sweep computes -----------------------------------------------------------------------
def test_points_in_order_with_derived_figures(sweep):
    doc = sweep.doc
    jsonschema.validate(doc, SCHEMA)
    pts = doc["points"]
    assert [p["devices"] for p in pts] == [1, 2, 4, 8] and {p["status"] for p in pts} == {"ok"}
    assert doc["clusters"] == [{"name": "cloudmatrix384", "baseline_devices": 1, "price_per_device_hour": None,
                                "checked": CLOUDMATRIX_CHECKED}]
    base = pts[0]["tokens_per_s_per_device"]
    for prev, p in zip([None, *pts], pts):
        assert p["tokens_per_s_per_device"] * p["devices"] == pytest.approx(p["tokens_per_s"], rel=1e-12)
        assert p["tokens_per_s"] == pytest.approx(64 * 512 / p["step_time_s"], rel=1e-9)
        assert p["scaling_efficiency"] == pytest.approx(p["tokens_per_s_per_device"] / base, rel=1e-12)
        if prev is None:
            assert p["marginal_efficiency"] is None and p["scaling_efficiency"] == 1.0
        else:
            gain = (p["tokens_per_s"] - prev["tokens_per_s"]) / (p["devices"] - prev["devices"])
            assert p["marginal_efficiency"] == pytest.approx(gain / base, rel=1e-12)
        assert p["cost_per_mtoken"] is None  # no price given: none invented
    assert doc["model"]["params"] == 22938880


def test_a_sweep_over_two_presets_cites_their_published_pairs(sweep, cache_root):
    """Megatron-Bridge ran six scored jobs on both DGX B200 and DGX B300 (planner/calibration/hardware_pairs.json): a sweep
    over the two says how far the estimated speedup between them came from the measured one; a sweep over one
    cluster, or over two no release ran a job on, says nothing of the kind."""
    doc = run_sweep(MODEL, devices=(8,), cache=cache_root / "whatif", workers=1,
                    **{**SWEEP, "clusters": ("dgx-b200", "dgx-b300", "dgx-h200")}).doc
    jsonschema.validate(doc, SCHEMA)
    assert [(p["from"], p["to"]) for p in doc["pairs"]] == [("dgx-b200", "dgx-b300")]
    said = doc["pairs"][0]["checked"]
    stored = next(p for p in json.loads(PAIRS.read_text(encoding="utf-8"))["pairs"]
                  if (p["from"], p["to"]) == ("dgx-b200", "dgx-b300"))
    assert "6 published pairs" in said and "1.10x measured" in said  # the measurements' ratio
    assert f"max {100 * stored['max_abs_error']:.1f} %" in said  # the estimate's, as the last refit left it
    assert sweep.doc["pairs"] == []


def test_weak_scaling_never_lowers_throughput(cache_root):
    """With the work per device fixed (global batch = 8 x devices), a larger cluster can always run the smaller
    one's plan with more data-parallel replicas, so total throughput must not drop."""
    rates = []
    for n in (1, 2, 4, 8):
        doc = run_sweep(MODEL, devices=(n,), cache=cache_root / "weak", workers=1,
                        **{**SWEEP, "global_batch": 8 * n}).doc
        rates.append(doc["points"][0]["tokens_per_s"])
    assert all(b >= a for a, b in zip(rates, rates[1:])), rates


def test_parallel_pool_gives_the_serial_result(sweep, tmp_path):
    again = run_sweep(MODEL, devices=(1, 2, 4, 8), cache=tmp_path, use_cache=False, workers=2, **SWEEP)
    assert again.computed == 4
    assert json.dumps(again.doc, sort_keys=True) == json.dumps(sweep.doc, sort_keys=True)


def test_infeasible_and_invalid_points_are_listed_with_why(tmp_path):
    # 0.02 GiB of HBM is under half the model's bf16 gradients alone (2 x 22.9 M parameters = 0.043 GiB), which
    # stay on the device: one device cannot hold a training step; 12 devices are not whole nodes of cloudmatrix384.
    doc = run_sweep(MODEL, devices=(1, 12), cache=tmp_path, memory_gib=0.02, workers=1, **SWEEP).doc
    jsonschema.validate(doc, SCHEMA)
    one, twelve = doc["points"]
    assert one["status"] == "infeasible" and "MiB per device and a device has 20.5 MiB" in one["reason"]
    with pytest.raises(Infeasible) as err:
        plan_model(MODEL, cluster="cloudmatrix384", devices=1, global_batch=64, seq_len=512, overrides=SMALL,
                   memory_gib=0.02)
    assert one["reason"] == str(err.value)
    assert twelve["status"] == "invalid" and "nearest: 8 or 16" in twelve["reason"]
    assert doc["clusters"][0]["baseline_devices"] is None
    with pytest.raises(InvalidInput, match="no device count"):
        run_sweep(MODEL, devices=(12,), cache=tmp_path, **SWEEP)


def test_prices_give_cost_per_million_tokens(sweep, cache_root):
    doc = run_sweep(MODEL, devices=(1, 2), cache=cache_root / "whatif", prices={"cloudmatrix384": 3.0},
                    workers=1, **SWEEP)
    assert doc.computed == 0
    for p in doc.doc["points"]:
        assert p["cost_per_mtoken"] == pytest.approx(3.0 * p["devices"] / 3600 / p["tokens_per_s"] * 1e6)


# -- the cache ------------------------------------------------------------------------------------
def test_cache_plans_only_new_points(tmp_path, monkeypatch):
    calls = []
    real = whatif._plan_point
    monkeypatch.setattr(whatif, "_plan_point", lambda task: calls.append(task["devices"]) or real(task))
    first = run_sweep(MODEL, devices=(1, 2), cache=tmp_path, workers=1, **SWEEP)
    assert (calls, first.computed) == ([1, 2], 2)
    again = run_sweep(MODEL, devices=(1, 2), cache=tmp_path, workers=1, **SWEEP)
    assert (calls, again.computed) == ([1, 2], 0)
    assert json.dumps(again.doc, sort_keys=True) == json.dumps(first.doc, sort_keys=True)
    run_sweep(MODEL, devices=(1, 2, 4), cache=tmp_path, workers=1, **SWEEP)
    assert calls == [1, 2, 4]
    run_sweep(MODEL, devices=(1,), cache=tmp_path, workers=1, **{**SWEEP, "seq_len": 256})  # another input
    run_sweep(MODEL, devices=(1,), cache=tmp_path, workers=1, use_cache=False, **SWEEP)  # --no-cache
    assert calls == [1, 2, 4, 1, 1]
    for f in tmp_path.glob("*.json"):  # a damaged entry is planned again, not trusted
        f.write_text("{not json")
    run_sweep(MODEL, devices=(2,), cache=tmp_path, workers=1, **SWEEP)
    assert calls == [1, 2, 4, 1, 1, 2]


@pytest.mark.parametrize("edit", [lambda p: {}, lambda p: {**p, "mfu": "high"}, lambda p: {**p, "status": "odd"},
                                  lambda p: {k: v for k, v in p.items() if k != "step_time_s"}])
def test_a_cached_point_that_parses_but_is_no_record_is_planned_again(tmp_path, monkeypatch, edit):
    """An entry of valid JSON holding no record a plan keeps (emptied, a figure that is no number, an unknown
    status, a figure missing) had stopped the sweep with an internal error (KeyError: 'status'; a format code on
    a string) after its header was printed (QA of 2026-12-07); it is planned again, to the same document."""
    calls = []
    real = whatif._plan_point
    monkeypatch.setattr(whatif, "_plan_point", lambda task: calls.append(task["devices"]) or real(task))
    first = run_sweep(MODEL, devices=(1,), cache=tmp_path, workers=1, **SWEEP)
    (entry,) = tmp_path.glob("*.json")
    data = json.loads(entry.read_text())
    entry.write_text(json.dumps({**data, "point": edit(data["point"])}))
    again = run_sweep(MODEL, devices=(1,), cache=tmp_path, workers=1, **SWEEP)
    assert (calls, again.computed) == ([1, 1], 1)
    assert json.dumps(again.doc, sort_keys=True) == json.dumps(first.doc, sort_keys=True)


def test_cache_key_follows_the_inputs(tmp_path):
    base = {"model": {"zoo": MODEL}, "cluster": {"name": "c", "sha256": "0"}, "devices": 8, "global_batch": 64}
    keys = {whatif.point_key(base), whatif.point_key({**base, "devices": 16}),
            whatif.point_key({**base, "cluster": {"name": "c", "sha256": "1"}})}
    assert len(keys) == 3 and whatif.point_key(dict(reversed(base.items()))) == whatif.point_key(base)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"one")
    first, _ = whatif.identity(model, "dgx-h100")
    model.write_bytes(b"two")
    assert whatif.identity(model, "dgx-h100")[0] != first  # a file is known by its content


# -- the command ----------------------------------------------------------------------------------
def _cli(cache_root, *extra):
    args = ["whatif", MODEL, *SMALL_FLAGS, "--cluster", "cloudmatrix384", "--global-batch", "64",
            "--seq-len", "512", "--workers", "1", *extra]
    return runner.invoke(app, args, env={"HYPERPLAN_CACHE": str(cache_root), "COLUMNS": "160"}, terminal_width=160)


def test_cli_table_json_and_csv_round_trip(sweep, cache_root, tmp_path):
    out = tmp_path / "points.csv"
    res = _cli(cache_root, "--devices", "1..8x2,12", "--json", "--csv", str(out))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["points"][:4] == sweep.doc["points"]  # served from the cache the library sweep filled
    assert "0 of 4 points planned, 4 from the cache" in res.stderr
    rows = list(csv.DictReader(out.open(newline="")))
    assert len(rows) == len(doc["points"]) == 5
    for row, p in zip(rows, doc["points"]):
        assert (row["cluster"], int(row["devices"]), row["status"]) == (p["cluster"], p["devices"], p["status"])
        for k in (*NUMBERS, "scaling_efficiency", "marginal_efficiency", "cost_per_mtoken"):
            assert (float(row[k]) if row[k] else None) == p[k]  # exact: floats are written in full
        assert (row["plan"] or None, row["reason"] or None) == (p["plan"], p["reason"])
    table = _cli(cache_root, "--devices", "1..8x2,12")
    assert table.exit_code == 0
    assert "DP2" in table.stdout and "points without a plan" in table.stdout and "nearest: 8 or 16" in table.stdout


def test_a_repeated_cluster_option_adds_the_cluster(sweep, cache_root):
    """`--cluster A --cluster B` sweeps both, as `--cluster A,B` does (it had kept only the last)."""
    res = _cli(cache_root, "--cluster", "cloudmatrix384-die", "--devices", "1", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [c["name"] for c in doc["clusters"]] == ["cloudmatrix384", "cloudmatrix384-die"]
    assert sorted({p["cluster"] for p in doc["points"]}) == ["cloudmatrix384", "cloudmatrix384-die"]


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_cli_plot(sweep, cache_root, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    from cli.whatif_cmd import write_plot

    out = tmp_path / f"scaling{suffix}"
    res = _cli(cache_root, "--devices", "1..8x2", "--plot", str(out))
    assert res.exit_code == 0, res.output
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 1000
    write_plot(sweep.doc, str(tmp_path / f"again{suffix}"))
    assert (tmp_path / f"again{suffix}").read_bytes() == data  # same sweep, same bytes


def test_cli_errors_are_one_line_before_any_planning(cache_root, tmp_path, monkeypatch):
    cases = [(["--devices", "8..4"], "ends (4) before it starts"),
             (["--devices", "8", "--mode", "infer"], "describe a training step"),
             (["--devices", "8", "--plot", str(tmp_path / "p.pdf")], ".png or .svg"),
             (["--devices", "8", "--csv", str(tmp_path / "none" / "p.csv")], "does not exist"),
             (["--devices", "8", "--price", "gb200-nvl72=2"], "not a swept cluster")]
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if the extra were not installed
    cases.append((["--devices", "8", "--plot", str(tmp_path / "p.png")], "pip install 'hyperplan[plot]'"))
    for extra, words in cases:
        res = _cli(cache_root, *extra)
        assert res.exit_code == 2, (extra, res.output)
        assert words in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.output


def test_a_planner_failure_is_reported_not_cached(tmp_path, monkeypatch):
    """A bug at one point must not lose the sweep, must not be cached, and must fail the command."""
    import planner.api

    def broken(*args, **kwargs):
        raise ValueError("interleaved 1F1B needs micro-batches (8) divisible by the stages (3)")

    monkeypatch.setattr(planner.api, "plan_model", broken)
    for _ in range(2):
        sweep = run_sweep(MODEL, devices=(1,), cache=tmp_path, workers=1, **SWEEP)
        assert sweep.computed == 1  # planned again: failures are not cached
        (p,) = sweep.doc["points"]
        assert p["status"] == "error" and p["reason"].startswith("the planner failed: ValueError: interleaved")
    res = runner.invoke(app, ["whatif", MODEL, *SMALL_FLAGS, "--cluster", "cloudmatrix384", "--devices", "1",
                              "--global-batch", "64", "--seq-len", "512", "--workers", "1"],
                        env={"HYPERPLAN_CACHE": str(tmp_path)})
    assert res.exit_code == 1 and "a hyperplan bug" in res.stderr and "Traceback" not in res.output


def test_a_wrong_model_stops_the_sweep(tmp_path):
    with pytest.raises(InvalidInput, match="no file or zoo model named 'llama-nine'"):
        run_sweep("llama-nine", devices=(1, 2), cache=tmp_path, workers=1, **SWEEP)


def test_an_interrupted_sweep_keeps_the_points_it_planned(tmp_path, monkeypatch):
    real = whatif._plan_point

    def stop_at_two(task):
        if task["devices"] == 2:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(whatif, "_plan_point", stop_at_two)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(MODEL, devices=(1, 2), cache=tmp_path, workers=1, **SWEEP)
    monkeypatch.setattr(whatif, "_plan_point", real)
    assert run_sweep(MODEL, devices=(1, 2), cache=tmp_path, workers=1, **SWEEP).computed == 1


def test_ctrl_c_ends_the_worker_processes_at_once(tmp_path):
    """A point's search can take minutes: the workers are ended, not waited for (issue 17: 5 s to stop)."""
    import multiprocessing

    def interrupt(msg: str, frac: float) -> None:
        if frac > 0:  # the first planned point: the user presses Ctrl-C
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(MODEL, devices=(1, 2, 4, 8), cache=tmp_path, use_cache=False, workers=2, progress=interrupt,
                  **SWEEP)
    assert multiprocessing.active_children() == []
