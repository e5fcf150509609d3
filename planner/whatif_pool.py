"""The what-if sweep's worker processes: its points planned in parallel, at most one process a core, and stopped
at once, without a traceback from any process, when the user presses Ctrl-C.

Workers are forked from a forkserver (spawned where there is none), which imports the planner once for all of
them. Three moments could print a traceback under the sweep's one `interrupted` line, each closed here:
- the server importing the planner (seconds) before it ignores SIGINT itself (CPython's
  multiprocessing.forkserver.main): it is started with SIGINT ignored (`start_quietly`), which the exec that
  starts it keeps;
- a worker being started when the interrupt comes: SIGINT is held back while the pool starts its workers
  (`_held_interrupts`), so that every worker is known to the pool when the interrupt is taken;
- a worker still reading its start-up state from the pool's queues when they are released: the workers are
  ended before the pool lets go of them (`_stop`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from planner.errors import HyperplanError, InvalidInput

Record = dict[str, Any]


def pool_context() -> Any:
    """forkserver where there is one: workers fork from a clean server (safe beside the progress thread)
    and share its imports; spawn elsewhere."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["planner.whatif", "planner.api", "planner.search.plan_search",
                                    "planner.costing.estimate", "planner.graph.onnx_import", "models_zoo"])
        return ctx
    return multiprocessing.get_context("spawn")


def compute(tasks: list[dict[str, Any]], workers: int | None, done: Callable[[int, Record], None],
            plan: Callable[[Mapping[str, Any]], Record]) -> None:
    """`plan` every task, in parallel when there is more than one; `done(index, record)` as each finishes,
    so that an interrupted sweep keeps what it planned. A record of status "raise" (a wrong input, the same at
    every point) stops the sweep."""
    cores = os.cpu_count() or 1
    n = min(workers or cores, cores, len(tasks))
    if n <= 1:
        for i, t in enumerate(tasks):
            done(i, _checked(plan(t)))
        return
    ctx = pool_context()
    start_quietly(ctx)
    pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_ignore_interrupts)
    try:
        with _held_interrupts():  # submitting starts the workers
            futures = {pool.submit(plan, t): i for i, t in enumerate(tasks)}
        for fut in cf.as_completed(futures):
            done(futures[fut], _checked(fut.result()))
    except cf.BrokenExecutor:
        _stop(pool)
        raise HyperplanError("a planning process died (out of memory, or a script that starts a sweep without "
                             "`if __name__ == '__main__':`); run with one worker (--workers 1) to see why") from None
    except BaseException:  # Ctrl-C or a wrong input: stop the workers now, not when their points finish
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _checked(rec: Record) -> Record:
    if rec["status"] == "raise":
        raise InvalidInput(rec["reason"])
    return rec


def start_quietly(ctx: Any) -> None:
    """Start `ctx`'s forkserver with SIGINT ignored (see the module's note). From a thread other than the main
    one, where Python takes no signal, nothing is done."""
    if ctx.get_start_method() != "forkserver" or threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import forkserver

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _held_interrupts() -> Iterator[None]:
    """Ctrl-C taken only as the block ends (as KeyboardInterrupt, if it came): Python runs signal handlers in the
    main thread whichever thread the kernel gives the signal to, so the handler is what holds it back. From
    another thread, where no handler can be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


def _ignore_interrupts() -> None:
    """In a worker: Ctrl-C is the parent's to handle (it stops the workers), not a traceback per process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: cf.ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers at once (a point's search can take minutes), before the
    pool lets go of its queues (see the module's note)."""
    procs = list(getattr(pool, "_processes", {}).values())  # CPython keeps them here; 3.14 adds terminate_workers()
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=1.0)
    # its manager thread sees the workers gone and ends: joined here, not by the interpreter at exit, where its
    # wake-up pipe may already be closed (an "Exception ignored ... Bad file descriptor" under the one line)
    pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["compute", "pool_context", "start_quietly"]
