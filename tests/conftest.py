"""Shared test setup: the repo root on sys.path, and the committed exported fixtures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
