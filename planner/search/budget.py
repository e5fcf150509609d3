"""One budget for a whole plan: work counted in nodes, and a wall-clock limit that only stops a search.

The single-program search and every MPMD program search spend from the same budget, so a plan's effort is
one number (`nodes`: costings of region representatives and scored strategies) however it is split. The
work decides the plan; the clock never does unless a limit is given, and then it only stops the search
where it is (the plan is marked incomplete, with what stopped it).
"""

from __future__ import annotations

import math
import time

from planner.errors import InvalidInput

#: Work allowed to one plan (costings and scored strategies): far above what any zoo model needs.
DEFAULT_MAX_NODES = 20_000


class Budget:
    """One budget for a whole plan (the single-program search and the MPMD searches share it): work in
    nodes, and a wall-clock limit that only stops a search (then marked incomplete); None: no limit but
    the work, so the plan cannot depend on the machine's load."""

    def __init__(self, time_limit_s: float | None = None, max_nodes: int = DEFAULT_MAX_NODES) -> None:
        if time_limit_s is not None and not time_limit_s > 0:
            raise InvalidInput(f"--time-limit must be positive, got {time_limit_s}")
        self.time_limit_s = math.inf if time_limit_s is None else float(time_limit_s)
        self.max_nodes = int(max_nodes)
        self.t0 = time.perf_counter()
        self.nodes = 0
        self.stopped = False  # the limit cut some search short
        self.stopped_by = ""  # what cut it: "--time-limit", or the work budget

    def spend(self, n: int = 1) -> None:
        self.nodes += n

    def out(self) -> bool:
        """Whether the work or the time is used up (then the search stops where it is)."""
        if not self.stopped and self.nodes >= self.max_nodes:
            self.stopped, self.stopped_by = True, f"its work budget of {self.max_nodes} nodes"
        elif not self.stopped and time.perf_counter() - self.t0 > self.time_limit_s:
            self.stopped, self.stopped_by = True, "--time-limit"
        return self.stopped
