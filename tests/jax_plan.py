"""A JAX export run in a process of its own on host CPU devices, shared by the hypershard export tests
(tests/test_hypershard_backends.py, test_hypershard_mpmd.py, test_hypershard_infer_backends.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_jax_plan(path: str | Path, devices: int, body: str) -> Any:
    """Run `body` (Python source that prints one JSON value) in a fresh interpreter whose JAX sees `devices` host
    CPU devices, with numpy as `np` and the exported plan at `path` loaded as module `m`; the value it printed. A
    failing run fails the test with its stderr's tail."""
    code = (
        "import os, json, importlib.util\n"
        f"os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count={devices}'\n"
        "import numpy as np\n"
        f"spec = importlib.util.spec_from_file_location('plan', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    ) + body
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)
