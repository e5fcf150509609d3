"""Solving the intra-op problem: CP-SAT on the one-hot formulation, and brute force for tests.

The model reads in sections: variables (one-hot strategy per op), the
"exactly one" rule, edge variables for the pairs whose cost does not split
into a part per op (Alpa's linearisation: sum over one side of an edge's
one-hots equals the other side's one-hot, which keeps the LP relaxation
tight), the objective, and the read-back. Costs are integers in
nanoseconds; one worker and a fixed seed make the answer repeatable.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from planner.errors import Infeasible, SolverTimeout
from planner.search.charges import HIDDEN_CHARGE, EdgeCosts, edge_costs, hide_caps, total_cost
from planner.search.intra_op import IntraOpProblem

_NS = 1e9
#: CP-SAT's integer unit: a nanosecond over `HIDDEN_CHARGE`, so that what a hidden nanosecond saves is an integer.
_TICKS = _NS / HIDDEN_CHARGE
#: The solvers' own stops, counted in work so that the same problem gets the same answer on any machine: HiGHS's
#: branch-and-bound nodes, CP-SAT's deterministic time (its count of work, in its "seconds"). The zoo's layer
#: problems prove optimal in a few hundred nodes; a problem stopped here says so in its gap.
NODE_LIMIT = 50_000
DETERMINISTIC_LIMIT = 120.0
#: The wall clock only stops a solve asked to stop sooner (`time_limit_s`): by default it never decides.
WALL_LIMIT_S = 3600.0


@dataclass(frozen=True, slots=True)
class Solution:
    """The chosen strategy index per var, its cost, and how sure the solver is of it."""

    choice: tuple[int, ...]
    cost_s: float
    optimal: bool
    gap: float  # (cost - best bound) / cost; 0 when proven optimal
    wall_s: float


@contextlib.contextmanager
def _native_stdout_silenced():
    """HiGHS's C++ core can print diagnostics straight to file descriptor 1 even with display off, which
    would corrupt `--json` output: point fd 1 at /dev/null while it runs."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (embedded use): nothing to protect
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _costs(problem: IntraOpProblem) -> tuple[list[np.ndarray], EdgeCosts]:
    """Per-var costs (op time, same-position edges, graph outputs), and the program's `EdgeCosts`."""
    edges = edge_costs(problem)
    unary = [u.astype(float).copy() for u in problem.unary]
    for v, d in edges.selfs.items():
        unary[v] = unary[v] + d
    for v, d in edges.sinks.items():
        unary[v] = unary[v] + d
    return unary, edges


def _separable(m: np.ndarray) -> bool:
    """True if m[i, j] = r[i] + c[j]: then the pair needs no edge variables."""
    resid = m - m[:, :1] - m[:1, :] + m[0, 0]
    return bool(np.all(np.abs(resid) <= 1e-12 + 1e-9 * np.abs(m).max()))


def solve_intra_op(
    problem: IntraOpProblem,
    time_limit_s: float = WALL_LIMIT_S,
    fixed: Mapping[int, int] | None = None,
    allowed: Mapping[int, frozenset[int]] | None = None,
    backend: str = "highs",
) -> Solution:
    """Least-cost strategy per var: `fixed` pins var -> strategy, `allowed` restricts a var's choices.

    HiGHS is the default: on this 2-core machine it proves the optimum of a
    tied Llama layer problem in under a second where CP-SAT (one worker, for
    repeatable answers) runs out a 10 s limit (benchmarks/bench_solvers.py).
    """
    if backend == "highs":
        return solve_intra_op_highs(problem, time_limit_s, fixed, allowed)
    if backend == "cpsat":
        return solve_intra_op_cpsat(problem, time_limit_s, fixed, allowed=allowed)
    raise ValueError(f"unknown solver backend {backend!r}; use 'highs' or 'cpsat'")


def solve_intra_op_cpsat(
    problem: IntraOpProblem,
    time_limit_s: float = WALL_LIMIT_S,
    fixed: Mapping[int, int] | None = None,
    workers: int = 1,
    allowed: Mapping[int, frozenset[int]] | None = None,
) -> Solution:
    """The intra-op model on OR-Tools CP-SAT (integer nanoseconds, one worker, fixed seed)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    fixed = dict(fixed or {})
    n = len(problem.vars)
    unary, edges = _costs(problem)

    # variables: one-hot strategy per var
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x{v}_{s}") for s in range(len(problem.vars[v].strategies))] for v in range(n)]
    # each op takes exactly one strategy
    for v in range(n):
        model.AddExactlyOne(x[v])
    for v, s in sorted(fixed.items()):
        model.Add(x[v][s] == 1)
    for v, ok in sorted((allowed or {}).items()):
        for s in range(len(x[v])):
            if s not in ok:
                model.Add(x[v][s] == 0)

    terms: list[tuple[object, int]] = []
    const = 0.0
    # edges: separable pairs fold into per-op costs; the rest get linearised edge variables
    for (a, b), m in sorted(edges.pairs.items()):
        if m.shape[0] == 1 or m.shape[1] == 1 or _separable(m):
            unary[a] = unary[a] + (m[:, 0] - m[0, 0])
            unary[b] = unary[b] + m[0, :]
            continue
        e = [[model.NewBoolVar(f"e{a}_{b}_{i}_{j}") for j in range(m.shape[1])] for i in range(m.shape[0])]
        for i in range(m.shape[0]):
            model.Add(sum(e[i]) == x[a][i])
        for j in range(m.shape[1]):
            model.Add(sum(e[i][j] for i in range(m.shape[0])) == x[b][j])
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                c = int(round(m[i, j] * _TICKS))
                if c:
                    terms.append((e[i][j], c))
    # read-by-many tensors: one move per distinct layout asked (forward), one per distinct gradient layout;
    # what the readers' GEMMs hide of each (collective, pass) is at most the stack's share of its seconds and
    # overlap x the window
    for (src, out, idx), prog in zip(problem.groups, edges.groups):
        offered: dict[tuple[str, bool], list[tuple[object, int]]] = {}
        for d_i, (askers, per_producer) in enumerate(prog.demands):
            z = model.NewBoolVar(f"z{src}_{out}_{d_i}")
            for v, s_i in askers:
                model.AddImplication(x[v][s_i], z)
            for su_i, by in sorted(per_producer.items()):
                c = int(round(sum(by.values()) * _TICKS))
                if c:
                    w = model.NewBoolVar(f"w{src}_{out}_{d_i}_{su_i}")
                    model.Add(w >= z + x[src][su_i] - 1)
                    terms.append((w, c))
                    for key, sec in by.items():
                        offered.setdefault(key, []).append((w, int(round(problem.overlap_share * sec * _NS))))
        caps = hide_caps(problem, prog)
        for (coll, backward), parts in sorted(offered.items()):
            most = int(round(caps.get((coll, backward), 0.0) * _NS))
            if most <= 0:
                continue
            h = model.NewIntVar(0, most, f"h{src}_{out}_{coll}_{backward}")
            model.Add(h <= sum(c * w for w, c in parts))
            terms.append((h, -round(_TICKS / _NS * (1.0 - HIDDEN_CHARGE))))
    # objective: compute per op plus resharding per edge
    for v in range(n):
        base = float(unary[v].min())
        const += base
        for s, c in enumerate(unary[v]):
            ci = int(round((c - base) * _TICKS))
            if ci:
                terms.append((x[v][s], ci))
    for mem in problem.memory if problem.memory_budget is not None else ():  # each stage fits (KiB)
        model.Add(sum(int(math.ceil(mem[v][s_i] / 1024)) * x[v][s_i] for v in range(n)
                      for s_i in range(len(x[v])) if mem[v][s_i])
                  <= int(problem.memory_budget // 1024))
    model.Minimize(sum(c * var for var, c in terms))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.max_deterministic_time = DETERMINISTIC_LIMIT
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status == cp_model.INFEASIBLE:
        raise Infeasible("no tensor layout fits the memory budget")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverTimeout(
            f"the layout solver found no strategy within {time_limit_s:g} s or its work limit; raise --time-limit or "
            "fix more knobs"
        )
    # read back
    choice = tuple(next(s for s in range(len(x[v])) if solver.Value(x[v][s])) for v in range(n))
    cost = total_cost(problem, choice)
    obj, bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
    gap = 0.0 if status == cp_model.OPTIMAL else max(0.0, (obj - bound) / (obj + const * _TICKS or 1.0))
    return Solution(choice, cost, status == cp_model.OPTIMAL, gap, time.perf_counter() - t0)


def solve_exhaustive(problem: IntraOpProblem, limit: int = 2_000_000) -> Solution:
    """Try every assignment (tests only): the ground truth the solver must match."""
    sizes = [len(v.strategies) for v in problem.vars]
    total = int(np.prod(sizes, dtype=float))
    if total > limit:
        raise ValueError(f"{total} assignments is too many to enumerate")
    t0 = time.perf_counter()
    best, best_c, memo = None, float("inf"), {}
    for choice in itertools.product(*[range(s) for s in sizes]):
        c = total_cost(problem, choice, memo)
        if c < best_c - 1e-15:
            best, best_c = choice, c
    assert best is not None
    return Solution(tuple(best), best_c, True, 0.0, time.perf_counter() - t0)


def solve_intra_op_highs(
    problem: IntraOpProblem,
    time_limit_s: float = WALL_LIMIT_S,
    fixed: Mapping[int, int] | None = None,
    allowed: Mapping[int, frozenset[int]] | None = None,
) -> Solution:
    """The same model as `solve_intra_op`, solved by HiGHS (scipy.optimize.milp).

    Only the one-hot strategy variables are integer: with them fixed, the
    edge variables form a transportation polytope with unit marginals, whose
    vertices are integral, and the summed-gradient variables sit at their
    lower bounds, so the relaxation of those costs nothing.

    A tensor read by several ops pays each producer-to-layout conversion once if any reader asks that
    layout (z >= each asking one-hot): the conversion w_s of producer strategy s is at most x_s, and the ws
    together are at least z + sum_s x_s - 1 (one row for all of them; one row per s, w_s >= z + x_s - 1, is
    the same at integer points and much looser between them). On deepseek-v3 on 384 CloudMatrix384 NPUs the
    root relaxation went from 21-29 % below the optimum to 10-19 %, and HiGHS's 34 programs from 15 s to 7 s
    (each closes at the root either way). Aggregating a reader's asking strategies into one row (valid, and
    tighter still) made one program run past ten minutes: it is not done.

    Presolve is off: HiGHS's presolve cost more than the solve (deepseek-v3 on 384 CloudMatrix384 NPUs: 20 s of
    HiGHS for 34 programs with it, 16 s without) or turned one-node solves into long searches (llama3-405b on 64
    of them with the Ascend vector peaks: five programs of 1,886 branch-and-bound nodes and 15-17 s each, one
    node and under 1 s without it).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    fixed = dict(fixed or {})
    n = len(problem.vars)
    unary, edges = _costs(problem)

    # variables: one-hot x first, then auxiliaries appended as we go
    cost: list[float] = []
    x: list[list[int]] = []
    for v in range(n):
        x.append(list(range(len(cost), len(cost) + len(problem.vars[v].strategies))))
        cost.extend([0.0] * len(problem.vars[v].strategies))
    n_int = len(cost)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for c, a in entries:
            rows.append(r)
            cols.append(c)
            vals.append(a)
        lo.append(low)
        hi.append(high)

    def new_var(c: float) -> int:
        cost.append(c)
        return len(cost) - 1

    # each op takes exactly one strategy
    for v in range(n):
        row([(c, 1.0) for c in x[v]], 1.0, 1.0)
    # edges: separable pairs fold into per-op costs; the rest get edge variables tied to both one-hots
    for (a, b), m in sorted(edges.pairs.items()):
        if m.shape[0] == 1 or m.shape[1] == 1 or _separable(m):
            unary[a] = unary[a] + (m[:, 0] - m[0, 0])
            unary[b] = unary[b] + m[0, :]
            continue
        e = [[new_var(float(m[i, j])) for j in range(m.shape[1])] for i in range(m.shape[0])]
        for i in range(m.shape[0]):
            row([(c, 1.0) for c in e[i]] + [(x[a][i], -1.0)], 0.0, 0.0)
        for j in range(m.shape[1]):
            row([(e[i][j], 1.0) for i in range(m.shape[0])] + [(x[b][j], -1.0)], 0.0, 0.0)
    # read-by-many tensors: z >= each reader's one-hot that asks a layout; w >= z + x_producer - 1; what the
    # readers' GEMMs hide of each (collective, pass): h <= the share offered, h <= overlap x the window (a bound)
    hides: dict[int, float] = {}  # hide var -> its most (overlap x the window, ns)
    for (src, out, idx), prog in zip(problem.groups, edges.groups):
        offered: dict[tuple[str, bool], list[tuple[int, float]]] = {}
        for askers, per_producer in prog.demands:
            z = new_var(0.0)
            for v, s_i in askers:
                row([(x[v][s_i], 1.0), (z, -1.0)], -np.inf, 0.0)
            paid = []
            for su_i, by in sorted(per_producer.items()):
                w = new_var(sum(by.values()))
                row([(w, 1.0), (x[src][su_i], -1.0)], -np.inf, 0.0)
                paid += [(w, 1.0), (x[src][su_i], -1.0)]
                for key, sec in by.items():
                    offered.setdefault(key, []).append((w, problem.overlap_share * sec))
            if paid:
                row(paid + [(z, -1.0)], -1.0, np.inf)
        caps = hide_caps(problem, prog)
        for key, parts in sorted(offered.items()):
            most = caps.get(key, 0.0) * _NS
            if most <= 0:
                continue
            h = new_var(-(1.0 - HIDDEN_CHARGE) / _NS)  # in nanoseconds, like the objective, for well-scaled rows
            hides[h] = most
            row([(h, 1.0)] + [(w, -sec * _NS) for w, sec in parts], -np.inf, 0.0)
    for v in range(n):
        base = float(unary[v].min())
        for s, c in enumerate(unary[v]):
            cost[x[v][s]] += float(c) - base
    ub = np.ones(len(cost))
    for h, most in hides.items():
        ub[h] = most
    lb = np.zeros(len(cost))
    for v, s in fixed.items():
        lb[x[v][s]] = 1.0
    for v, ok in (allowed or {}).items():
        for s in range(len(x[v])):
            if s not in ok:
                ub[x[v][s]] = 0.0
    # memory: what the layouts put in HBM stays within the device's budget, on every pipeline stage
    for mem in problem.memory if problem.memory_budget is not None else ():
        row([(x[v][s_i], float(mem[v][s_i])) for v in range(n) for s_i in range(len(x[v]))
             if mem[v][s_i]], -np.inf, float(problem.memory_budget))
    integrality = np.zeros(len(cost))
    integrality[:n_int] = 1
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), len(cost))).tocsr()
    with _native_stdout_silenced():
        res = milp(np.array(cost) * _NS, constraints=LinearConstraint(a, lo, hi), integrality=integrality,
                   bounds=Bounds(lb, ub), options={"time_limit": float(time_limit_s), "node_limit": NODE_LIMIT,
                                                   "disp": False, "mip_rel_gap": 1e-7, "presolve": False})
    if res.x is None:
        if res.status == 2:  # infeasible: no layout fits the memory budget
            raise Infeasible("no tensor layout fits the memory budget")
        raise SolverTimeout(f"the layout solver found no strategy within {time_limit_s:g} s or {NODE_LIMIT} nodes; "
                            "raise --time-limit or fix more knobs")
    choice = tuple(int(np.argmax([res.x[c] for c in x[v]])) for v in range(n))
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    return Solution(choice, total_cost(problem, choice), res.status == 0, gap if res.status != 0 else 0.0,
                    time.perf_counter() - t0)
