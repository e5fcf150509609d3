"""Rendering: every table readable at 80 columns (a pipe, a CI log), words never broken, and the help text
as typed (issue 17: whatif headers broke mid-word, hardware show truncated names, help showed <bool>)."""

from __future__ import annotations

import io
import json
import re

import onnx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli import render
from cli.app import app

runner = CliRunner()


def _text(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(renderable)
    return out.getvalue()


WIDE = render.table("points", ("cluster", "devices", "best plan", "step", "tokens/s", "tok/s/dev", "MFU", "peak",
                               "scaling", "marginal"),
                    [("cloudmatrix384", 512, "TP8·PP4·DP16, ZeRO-1, mb 2, selective recompute", "12.3 ms",
                      "1.23 M", "2.4 K", "41.2%", "61.9 GiB", "98%", "97%")],
                    right=("devices", "step", "tokens/s", "tok/s/dev", "MFU", "peak", "scaling", "marginal"))


def test_a_table_too_wide_for_80_columns_prints_each_row_as_a_block():
    text = _text(WIDE, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert re.search(r"^marginal\s+97%\s*$", text, re.M) and re.search(r"^cluster\s+cloudmatrix384\s*$", text, re.M)
    assert "┃" not in text  # not a table squeezed until its headers break


def test_the_same_table_is_a_table_where_it_fits():
    text = _text(WIDE, 200)
    header = text.splitlines()[1]
    assert all(c in header for c in ("cluster", "tok/s/dev", "marginal")) and "┃" in header


def test_a_prose_column_wraps_instead_of_turning_the_table_into_blocks():
    t = render.table("runners-up", ("strategy", "step", "why it lost"),
                     [("TP2·DP4", "1.3 s", "12.0% slower (tp_comm +120 ms, compute +40 ms) and more words that "
                                           "go on well past the width of any terminal")],
                     right=("step",), prose=("why it lost",))
    text = _text(t, 80)
    assert "┃" in text and max(len(line) for line in text.splitlines()) <= 80
    assert "TP2·DP4" in text and "slower" in text


def test_a_short_label_stays_whole_beside_a_value_that_wraps():
    """`estimate`'s summary at 80 columns: the value column wraps, the two-word label beside it does not (the
    spare width goes first to what needs little of it; it had been shared in proportion and split the label)."""
    t = render.kv_table("", [("step time", "3.8 s (8 micro-batches)"),
                             ("peak memory", "99.1 GiB of tensors, 78.4 GiB usable (2.0% of HBM kept by the "
                                             "allocator): does not fit: over by 20.7 GiB")])
    lines = _text(t, 80).splitlines()
    assert lines[1].startswith("peak memory  99.1 GiB") and max(len(line) for line in lines) <= 80
    assert lines[2].startswith(" " * 13) and lines[2].rstrip().endswith("over by 20.7 GiB")


@pytest.mark.parametrize("args", [["hardware", "show", "cloudmatrix384"], ["hardware", "list"], ["zoo", "list"]])
def test_commands_read_at_80_columns(args):
    r = runner.invoke(app, args, terminal_width=80)
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    if args[:2] == ["hardware", "show"]:
        for name in ("node", "supernode", "roce", "pooled-dram"):
            assert re.search(rf"(^|\s){name}(\s|$)", r.output, re.M), name  # whole, not truncated
        assert not re.search(r"\d\.\d+e[+-]\d", r.output)  # no exponents: 8.35e-07 s is 835 ns


def test_the_width_is_the_callers_not_the_import_times():
    wide = runner.invoke(app, ["hardware", "list"], terminal_width=200)
    assert "interconnect (GB/s per device per direction)" in wide.output  # one header line at 200


def test_help_shows_no_type_after_a_flag_and_keeps_square_brackets():
    r = runner.invoke(app, ["whatif", "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert "<bool>" not in r.output and "hyperplan[plot]" in r.output
    est = runner.invoke(app, ["estimate", "--help"], terminal_width=200)
    assert "[default: 1]" in est.output and "<bool>" not in est.output


def test_zoo_export_speaks_binary_units_and_json(tmp_path):
    out = tmp_path / "gpt.onnx"
    r = runner.invoke(app, ["zoo", "export", "gpt", "--layers", "1", "-o", str(out)], terminal_width=200)
    assert r.exit_code == 0 and re.search(r"\d (KiB|MiB)$", r.output.strip()) and " KB" not in r.output, r.output
    r = runner.invoke(app, ["zoo", "export", "gpt", "--layers", "1", "-o", str(out), "--force", "--json"])
    got = json.loads(r.stdout)
    assert got["output"] == str(out) and got["bytes"] == out.stat().st_size
    assert got["params"] == int({p.key: p.value for p in onnx.load(str(out), load_external_data=False).metadata_props}["hyperplan.params"])


@pytest.mark.parametrize("command", ["plan", "estimate", "export", "whatif", "calibrate", "validate"])
def test_help_prose_fills_its_lines_at_80_columns(command):
    """A command's description wraps to the terminal: no line of it ends short while its paragraph goes on (typer
    keeps a docstring's own line breaks, which at 80 columns had left half-lines such as 'domain (KV')."""
    r = runner.invoke(app, [command, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    prose = lines[next(i for i, l in enumerate(lines) if "Usage:" in l) + 1:
                  next(i for i, l in enumerate(lines) if l.lstrip().startswith("╭"))]
    ragged = [a.rstrip() for a, b in zip(prose, prose[1:]) if a.strip() and b.strip() and len(a.rstrip()) < 55]
    assert not ragged, ragged
