"""Numbers for people (planner/units.py): the unit that fits, three significant digits, never an exponent."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.units import count, flops, gib, nbytes, seconds, sig


@pytest.mark.parametrize("x, text", [
    (8.35e-7, "835 ns"), (4.2e-5, "42 us"), (0.0123, "12.3 ms"), (1.3, "1.3 s"), (95.0, "1.58 min"),
    (54 * 86400.0, "1,296 h"), (0.0, "0 s"), (59.9999, "60 s"),
])
def test_seconds(x, text):
    assert seconds(x) == text


@pytest.mark.parametrize("x, text", [
    (0, "0 B"), (512, "512 B"), (3 * 2**30, "3 GiB"), (1.53e4 * 2**30, "14.9 TiB"), (1536, "1.5 KiB"),
])
def test_bytes(x, text):
    assert nbytes(x) == text


def test_gib_picks_the_binary_unit_that_fits():
    assert (gib(0.5), gib(40.8), gib(15300)) == ("512 MiB", "40.8 GiB", "14.9 TiB")


def test_counts_and_flops():
    assert (count(26784), count(7.24e9), count(12)) == ("26.8 K", "7.24 B", "12")
    assert flops(1.3e12) == "1.3 TFLOP"


def test_sig_keeps_whole_digits_and_groups_them():
    assert (sig(1023.4), sig(12.34), sig(2.0), sig(-0.000123)) == ("1,023", "12.3", "2", "-0.000123")


@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False))
def test_no_exponent_ever(x):
    for text in (seconds(x), nbytes(x), sig(x), count(x)):
        assert "e+" not in text and "e-" not in text, text


@given(st.floats(min_value=1e-12, max_value=1e12))
def test_seconds_reads_back_within_rounding(x):
    number, unit = seconds(x).split(" ")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}[unit]
    assert math.isclose(float(number.replace(",", "")) * scale, x, rel_tol=5e-3)
