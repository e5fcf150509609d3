"""The what-if sweep's worker pool under Ctrl-C (`planner.whatif_pool`): no process prints a traceback.

A Ctrl-C in the first seconds of `hyperplan whatif --workers 2` had printed, under its one `interrupted` line, the
forkserver's KeyboardInterrupt (the server imports the planner before it ignores SIGINT itself), or a worker's
FileNotFoundError (the interrupt came while the pool started it, so the pool did not know it and let go of the
queues it was still reading); QA of 2026-12-07. These check the two mechanisms directly, without timing a signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from planner.whatif_pool import _held_interrupts

ROOT = Path(__file__).resolve().parents[1]

#: Starts the forkserver (by `start_quietly`, or directly) and prints whether it ignores SIGINT at once, while it
#: still imports the planner: the SigIgn mask of /proc/PID/status, bit SIGINT - 1.
_PROBE = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see _ignores_sigint)
from multiprocessing import forkserver
from planner.whatif_pool import pool_context, start_quietly
ctx = pool_context()
start_quietly(ctx) if sys.argv[1] == "quietly" else forkserver.ensure_running()
pid = forkserver._forkserver._forkserver_pid
mask = next(l for l in open(f"/proc/{pid}/status") if l.startswith("SigIgn:")).split()[1]
print(bool(int(mask, 16) >> (2 - 1) & 1))
"""


def _ignores_sigint(how: str) -> bool:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # the probe takes SIGINT back first, as a terminal's run has it: a background run (`cmd &`, nohup) hands every
    # child SIGINT ignored, and the forkserver (an exec of it: a handler becomes the default) would then ignore it
    # however it was started
    out = subprocess.run([sys.executable, "-c", _PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip() == "True"


def test_the_forkserver_ignores_ctrl_c_from_its_start():
    assert _ignores_sigint("quietly")
    assert not _ignores_sigint("directly")  # as multiprocessing starts it: SIGINT is its own until the imports end


def test_an_interrupt_while_the_workers_start_is_taken_when_they_have():
    # Python's own handler, as a terminal's run has it: a run started in the background (`cmd &`, nohup) inherits
    # SIGINT ignored, and the block gives back whatever handler it found
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with _held_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # Python runs the handler between bytecodes: well before this loop ends
                    pass
                reached.append("the rest of the block")
        assert reached == ["the rest of the block"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
