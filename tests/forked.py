"""Processes forked for a distributed run on the CPU (the children inherit what the parent imported), shared by
tests/test_hypershard_torch.py and benchmarks/check_hyper_parallel.py."""

from __future__ import annotations

from typing import Any, Callable


def run_forked(target: Callable[..., None], args: list[tuple[Any, ...]], timeout_s: float) -> list[int | None]:
    """One forked process per argument tuple, all started before any is awaited (they meet in one process
    group); each awaited up to `timeout_s`, then those still running killed. Their exit codes, in order."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]
